"""SaPE² steps 1–4, from gate logits to descriptors (docs/encodings.md): shared by the bias of
sape2.py (gate logits read from the attention's `T x T` logits) and the fused GPU attention of
fused_gpu.py (gate logits formed inside lines, `line_logits`), both plain autograd code."""
from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor

from ._interp import interpolate_readout, reverse_cumsum


def line_descriptors(gate_logits: Tensor, z: Tensor, npos_max: int) -> Tensor:
    """Descriptors along lines: `gate_logits: (B, h, L, A, A)` (token `a` of a line against
    every token of the same line), `z: (B, h, L, A, M+1)` read-outs -> `(B, h, L, A, A)`:
    for token `(l, a)`, its read-out at the gated position of each of the A tokens of its line."""
    pos = reverse_cumsum(torch.sigmoid(gate_logits)).clamp(max=npos_max - 1)  # (B, h, L, A, A)
    return interpolate_readout(z, pos)                                         # (B, h, L, A, A)


def line_logits(q: Tensor, k: Tensor, grid: tuple[int, int], scale: float) -> tuple[Tensor, Tensor]:
    """The gate logits inside lines, from the patch tokens `q, k: (B, h, N, d)` alone: same-row
    `(B, h, H, W, W)` and same-column `(B, h, W, H, H)` products `q_i·k_j·scale`, the entries
    of `q·kᵀ` that SaPE² reads (`N·(H+W)` of them, without forming the `N x N` product; the
    fused GPU attention's case, fused_gpu.py)."""
    H = grid[0]
    q_s = q * scale                                                          # (B, h, N, d), once
    q_r, k_r = (rearrange(t, "b h (y x) d -> b h y x d", y=H) for t in (q_s, k))   # (B, h, H, W, d)
    q_c, k_c = (rearrange(t, "b h (y x) d -> b h x y d", y=H) for t in (q_s, k))   # (B, h, W, H, d)
    return q_r @ k_r.transpose(-1, -2), q_c @ k_c.transpose(-1, -2)          # (B,h,H,W,W), (B,h,W,H,H)


def descriptors(row_logits: Tensor, col_logits: Tensor, r: Tensor, e_x: Tensor, e_y: Tensor,
                grid: tuple[int, int], npos_max: int) -> tuple[Tensor, Tensor]:
    """SaPE² steps 1–4 (autograd): gate logits in lines, read-out tokens `r: (B, h, N, d)` and
    tables `e_x, e_y: (d, npos_max)` -> descriptors `S_x: (B, h, N, W)`, `S_y: (B, h, N, H)`."""
    H = grid[0]
    z = r @ torch.cat((e_x, e_y), dim=1).to(r.dtype)                         # (B, h, N, 2(M+1))
    z_x = rearrange(z[..., :npos_max], "b h (y x) t -> b h y x t", y=H)      # (B, h, H, W, M+1)
    z_y = rearrange(z[..., npos_max:], "b h (y x) t -> b h x y t", y=H)      # (B, h, W, H, M+1)
    s_x = line_descriptors(row_logits, z_x, npos_max)                       # (B, h, H, W, W)
    s_y = line_descriptors(col_logits, z_y, npos_max)                       # (B, h, W, H, H)
    return (rearrange(s_x, "b h y x m -> b h (y x) m"),                      # (B, h, N, W)
            rearrange(s_y, "b h x y m -> b h (y x) m"))                      # (B, h, N, H)
