"""2D rotary position embeddings: `rope_axial` and `rope_mixed` (Heo et al., ECCV 2024,
"Rotary Position Embedding for Vision Transformer", arXiv 2403.13298).

Rotation pairs are adjacent channels `(2k, 2k+1)` as in RoPE-ViT's complex view.
* axial: the first `d/4` pairs rotate by `c*θ_k`, the last `d/4` by `r*θ_k`,
  `θ_k = 100^(-k/(d/4))`.
* mixed: pair `k` rotates by `c*f^x_k + r*f^y_k`, learned per layer and head, initialised as
  RoPE-ViT's `init_random_2d_freqs` (θ = 10, random orientation per head).
Angles are float32; prefix tokens are not rotated; integer positions extrapolate to any grid.
Checked: q·k after rotation depends only on the offset; rotation preserves norms (tests).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .base import EncodingContext, Grid, PositionEncoding, register_encoding
from .grid import grid_coords


def _check_head_dim(d: int) -> None:
    if d % 4:
        raise ValueError(f"2D RoPE needs head dim % 4 == 0, got {d}")


@register_encoding("rope_axial")
class RoPEAxial(PositionEncoding):
    hooks = ("rotation",)

    def __init__(self, ctx: EncodingContext, *, theta: float = 100.0) -> None:
        super().__init__(ctx)
        _check_head_dim(ctx.head_dim)
        d = ctx.head_dim
        freqs = theta ** (-torch.arange(d // 4, dtype=torch.float32) / (d // 4))   # (d/4,)
        self.register_buffer("freqs", freqs, persistent=False)

    def angles(self, grid: Grid, layer: int) -> Tensor:
        r, c = grid_coords(grid, self.freqs.device)
        ang_x = c.float()[:, None] * self.freqs        # (N, d/4)
        ang_y = r.float()[:, None] * self.freqs        # (N, d/4)
        return torch.cat((ang_x, ang_y), dim=1)[None]  # (1, N, d/2)


def init_mixed_freqs(head_dim: int, heads: int, theta: float = 10.0, generator=None) -> Tensor:
    """RoPE-ViT's `init_random_2d_freqs`: `(2, h, d/2)` = (f^x, f^y)."""
    mag = theta ** (-torch.arange(0, head_dim, 4, dtype=torch.float32)[: head_dim // 4] / head_dim)  # (d/4,)
    fx, fy = [], []
    for _ in range(heads):
        a = torch.rand(1, generator=generator) * 2 * math.pi
        fx.append(torch.cat((mag * torch.cos(a), mag * torch.cos(math.pi / 2 + a))))  # (d/2,)
        fy.append(torch.cat((mag * torch.sin(a), mag * torch.sin(math.pi / 2 + a))))
    return torch.stack((torch.stack(fx), torch.stack(fy)))  # (2, h, d/2)


@register_encoding("rope_mixed")
class RoPEMixed(PositionEncoding):
    hooks = ("rotation",)

    def __init__(self, ctx: EncodingContext, *, theta: float = 10.0) -> None:
        super().__init__(ctx)
        _check_head_dim(ctx.head_dim)
        self.rope_freqs = nn.Parameter(torch.stack(
            [init_mixed_freqs(ctx.head_dim, ctx.heads, theta) for _ in range(ctx.depth)]))  # (L, 2, h, d/2)

    def angles(self, grid: Grid, layer: int) -> Tensor:
        r, c = grid_coords(grid, self.rope_freqs.device)
        fx, fy = self.rope_freqs[layer].float()                         # (h, d/2) each
        return c.float()[None, :, None] * fx[:, None] + r.float()[None, :, None] * fy[:, None]  # (h, N, d/2)
