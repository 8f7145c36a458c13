"""Patch-grid helpers shared by the encodings. Patch `n` <-> cell `(r, c)`, `n = r*W + c`."""
from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor


@lru_cache(maxsize=32)
@torch.inference_mode(False)  # cached tensors must stay usable by autograd
def _coords(H: int, W: int) -> tuple[Tensor, Tensor]:
    r = torch.arange(H).repeat_interleave(W)  # (N,) row of each patch
    c = torch.arange(W).repeat(H)             # (N,) column of each patch
    return r, c


def grid_coords(grid: tuple[int, int], device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """Row and column index of every patch, each `(N,)` int64, row-major."""
    r, c = _coords(*grid)
    return r.to(device), c.to(device)


@lru_cache(maxsize=32)
@torch.inference_mode(False)
def _relative_index(H: int, W: int) -> Tensor:
    r, c = _coords(H, W)
    dr = r[:, None] - r[None, :] + (H - 1)   # (N, N) in [0, 2H-2]
    dc = c[:, None] - c[None, :] + (W - 1)   # (N, N) in [0, 2W-2]
    return dr * (2 * W - 1) + dc             # (N, N) flat index into a (2H-1, 2W-1) table


def relative_index(grid: tuple[int, int], device: torch.device | str = "cpu") -> Tensor:
    """`(N, N)` index of the offset `(Δr, Δc)` between patches into a flattened
    `(2H-1) x (2W-1)` table (Swin / BEiT layout)."""
    return _relative_index(*grid).to(device)
