"""2D rotary position embeddings: `rope_axial` and `rope_mixed` (Heo et al., ECCV 2024,
"Rotary Position Embedding for Vision Transformer", arXiv 2403.13298), and `rope_dinov3`
(DINOv3's axial RoPE on normalised patch centres, arXiv 2508.10104; see its class).

Rotation pairs are adjacent channels `(2k, 2k+1)` as in RoPE-ViT's complex view.
* axial: the first `d/4` pairs rotate by `c*θ_k`, the last `d/4` by `r*θ_k`,
  `θ_k = 100^(-k/(d/4))`.
* mixed: pair `k` rotates by `c*f^x_k + r*f^y_k`, learned per layer and head, initialised as
  RoPE-ViT's `init_random_2d_freqs` (θ = 10, random orientation per head).
Angles are float32; prefix tokens are not rotated; integer positions extrapolate to any grid
(`rope_axial`'s option `ref_grid` instead maps every grid onto a reference grid, as EVA-02 does;
its option `reciprocal` computes the frequencies as `1 / θ^(k/(d/4))`, RoPE-ViT's and timm's float32
rounding, for imported models: the same frequencies up to an ulp, the same angles bit for bit).
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

    def __init__(self, ctx: EncodingContext, *, theta: float = 100.0,
                 ref_grid: tuple[int, int] | list[int] | None = None, reciprocal: bool = False) -> None:
        super().__init__(ctx)
        _check_head_dim(ctx.head_dim)
        d = ctx.head_dim
        if not isinstance(reciprocal, bool):
            raise ValueError(f"reciprocal must be true or false, got {reciprocal!r}")
        if reciprocal:   # RoPE-ViT's and timm's float32 rounding: 1 / θ^(k/(d/4)) (θ^(−k/(d/4)) differs by an ulp)
            freqs = 1.0 / theta ** (torch.arange(d // 4, dtype=torch.float32) / (d // 4))   # (d/4,)
        else:
            freqs = theta ** (-torch.arange(d // 4, dtype=torch.float32) / (d // 4))   # (d/4,)
        self.register_buffer("freqs", freqs, persistent=False)
        # EVA-02 (timm's RotaryEmbeddingCat with ref_feat_shape): positions r·R/H, c·C/W on a reference grid
        self.ref_grid = None if ref_grid is None else (int(ref_grid[0]), int(ref_grid[1]))

    def angles(self, grid: Grid, layer: int) -> Tensor:
        r, c = grid_coords(grid, self.freqs.device)
        r, c = r.float(), c.float()                    # (N,) each
        if self.ref_grid is not None:
            r, c = r / grid[0] * self.ref_grid[0], c / grid[1] * self.ref_grid[1]
        ang_x = c[:, None] * self.freqs                # (N, d/4)
        ang_y = r[:, None] * self.freqs                # (N, d/4)
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


@register_encoding("rope_dinov3")
class RoPEDINOv3(PositionEncoding):
    """DINOv3's 2D RoPE (arXiv 2508.10104; transformers' `DINOv3ViTRopePositionEmbedding`):
    patch centres normalised to `[-1, 1]` (`y = 2(r + ½)/H − 1`, `x = 2(c + ½)/W − 1`), pair `k`
    rotating by `2π·y·f_k` for the first `d/4` pairs and `2π·x·f_k` for the last `d/4`,
    `f_k = θ^(−4k/d)`. Coordinates are relative to the grid, so any grid spans the same range.
    DINOv3 rotates the pairs `(k, k + d/2)`; the importer reorders each head's query and key
    channels to vitpe's adjacent pairs, which leaves `q·k` unchanged (vitpe_core/importers/dinov3.py).
    Eval only: the training-time coordinate jitter is not modelled."""

    hooks = ("rotation",)

    def __init__(self, ctx: EncodingContext, *, theta: float = 100.0) -> None:
        super().__init__(ctx)
        _check_head_dim(ctx.head_dim)
        inv_freq = 1 / theta ** torch.arange(0, 1, 4 / ctx.head_dim, dtype=torch.float32)   # (d/4,)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def angles(self, grid: Grid, layer: int) -> Tensor:
        H, W = grid
        dev = self.inv_freq.device
        ys = torch.arange(0.5, H, dtype=torch.float32, device=dev) / H              # (H,)
        xs = torch.arange(0.5, W, dtype=torch.float32, device=dev) / W              # (W,)
        coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1).flatten(0, 1)  # (N, 2) as (y, x)
        coords = 2.0 * coords - 1.0
        ang = 2 * math.pi * coords[:, :, None] * self.inv_freq[None, None, :]        # (N, 2, d/4)
        return ang.flatten(1, 2)[None]                                               # (1, N, d/2)
