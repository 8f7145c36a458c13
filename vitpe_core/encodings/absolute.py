"""Absolute position tables: `none`, `ape`, `ape2d`, `sincos2d` (docs/encodings.md).

* `ape` keeps timm's layout `(1, P+N, D)` under the name `pos_embed`, so a timm / DeiT
  state dict loads; at another grid its patch part is resampled bicubically with timm's
  `resample_abs_pos_embed` semantics (prefix rows kept, float32, antialias), by this module's
  `resample_abs_pos_embed` (interpolation `mode` a keyword), which importers call too. The
  options `ape_interpolation` / `ape_antialias` choose another rule for that run-time resampling
  (a Hugging Face import sets its library's: bicubic, not antialiased, for ViT, BEiT, DINOv2,
  CLIP, SigLIP); without them (every checkpoint written before they existed) timm's rule.
* `ape2d` is `E_row[r] + E_col[c]` plus a learned CLS row; each 1D table is resampled
  linearly at another grid.
* `sincos2d` is fixed: first D/2 channels encode the row, last D/2 the column, each half
  `[sin(pos*w_k)] ++ [cos(pos*w_k)]`, `w_k = 10000^(-k/(D/4))`; the CLS row is zero.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import EncodingContext, Grid, PositionEncoding, register_encoding


@register_encoding("none")
class NoPosition(PositionEncoding):
    """No position information: the model is permutation-equivariant over patches."""


ABS_MODES = ("bicubic", "bilinear", "nearest", "nearest-exact", "area")   # F.interpolate's 4-D modes
_ANTIALIAS_MODES = ("bicubic", "bilinear")                                  # torch antialiases only these


def check_abs_rule(mode: str, antialias: bool) -> None:
    """ValueError unless `mode` is one of `ABS_MODES` and `antialias` a bool torch allows with it."""
    if mode not in ABS_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, ABS_MODES))}; got {mode!r}")
    if not isinstance(antialias, bool):
        raise ValueError(f"antialias must be true or false, got {antialias!r}")
    if antialias and mode not in _ANTIALIAS_MODES:
        raise ValueError(f"antialias=True works only with mode 'bicubic' or 'bilinear' (got {mode!r}); "
                         "pass antialias=False")


def resample_abs_pos_embed(posemb: Tensor, new_grid: Grid, old_grid: Grid, num_prefix: int, *,
                           mode: str = "bicubic", antialias: bool = True) -> Tensor:
    """`(1, P+N_old, D)` -> `(1, P+N_new, D)`: the `H x W` patch part resized, the `P` prefix rows kept.

    timm's `resample_abs_pos_embed(..., interpolation=mode, antialias=antialias)` semantics:
    computed in float32, returned in the input's dtype, `align_corners=False` (for the
    interpolating modes); the same grid returns `posemb` itself. `mode` is one of `ABS_MODES`;
    `antialias` only with "bicubic" / "bilinear" (as torch requires).
    """
    check_abs_rule(mode, antialias)
    if tuple(new_grid) == tuple(old_grid):
        return posemb
    prefix, patches = posemb[:, :num_prefix], posemb[:, num_prefix:]
    dtype = patches.dtype
    img = patches.float().reshape(1, old_grid[0], old_grid[1], -1).permute(0, 3, 1, 2)  # (1, D, H, W)
    align = False if mode in _ANTIALIAS_MODES else None      # torch refuses align_corners for nearest/area
    img = F.interpolate(img, size=tuple(new_grid), mode=mode, antialias=antialias, align_corners=align)
    patches = img.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], -1).to(dtype)  # (1, N', D)
    return torch.cat((prefix, patches), dim=1)


@register_encoding("ape")
class LearnedAbsolute(PositionEncoding):
    """Learned 1D table with a CLS row, as in the original ViT and timm. At another grid the
    patch rows are resampled by `resample_abs_pos_embed` with `mode=ape_interpolation`,
    `antialias=ape_antialias` (default timm's rule, bicubic and antialiased; Hugging Face's
    `interpolate_pos_encoding` does not antialias). Named apart from other parts' options, so
    that `rpb_cls+ape` routes them here."""

    hooks = ("table",)

    def __init__(self, ctx: EncodingContext, *, ape_interpolation: str = "bicubic",
                 ape_antialias: bool = True) -> None:
        super().__init__(ctx)
        check_abs_rule(ape_interpolation, ape_antialias)
        self.interpolation, self.antialias = ape_interpolation, ape_antialias
        H, W = ctx.grid
        self.pos_embed = nn.Parameter(torch.empty(1, ctx.table_rows_prefix + H * W, ctx.dim))  # (1, P+N, D)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def table(self, grid: Grid) -> Tensor:
        return resample_abs_pos_embed(self.pos_embed, grid, self.ctx.grid, self.ctx.table_rows_prefix,
                                      mode=self.interpolation, antialias=self.antialias)[0]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, resample={self.interpolation}{', antialias' if self.antialias else ''}"


@register_encoding("ape2d")
class LearnedAxial(PositionEncoding):
    """Learned `E_row[r] + E_col[c]` plus a learned CLS row."""

    hooks = ("table",)

    def __init__(self, ctx: EncodingContext) -> None:
        super().__init__(ctx)
        H, W = ctx.grid
        self.row_embed = nn.Parameter(torch.empty(H, ctx.dim))
        self.col_embed = nn.Parameter(torch.empty(W, ctx.dim))
        self.cls_embed = nn.Parameter(torch.empty(ctx.num_prefix, ctx.dim))
        for p in (self.row_embed, self.col_embed, self.cls_embed):
            nn.init.trunc_normal_(p, std=0.02)

    @staticmethod
    def _resize(t: Tensor, n: int) -> Tensor:
        if t.shape[0] == n:
            return t
        x = t.float().t()[None]                                                    # (1, D, L)
        return F.interpolate(x, size=n, mode="linear", align_corners=False)[0].t().to(t.dtype)  # (n, D)

    def table(self, grid: Grid) -> Tensor:
        rows = self._resize(self.row_embed, grid[0])           # (H, D)
        cols = self._resize(self.col_embed, grid[1])           # (W, D)
        patches = (rows[:, None] + cols[None]).flatten(0, 1)   # (N, D)
        return torch.cat((self.cls_embed, patches), dim=0)     # (T, D)


def sincos_2d_table(grid: Grid, dim: int) -> Tensor:
    """`(N, D)` fixed table: first D/2 channels the row, last D/2 the column (see module doc)."""
    if dim % 4:
        raise ValueError(f"sincos2d needs dim % 4 == 0, got {dim}")
    H, W = grid
    omega = 10000.0 ** (-torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))  # (D/4,)
    r = torch.arange(H, dtype=torch.float32).repeat_interleave(W)                  # (N,)
    c = torch.arange(W, dtype=torch.float32).repeat(H)                             # (N,)

    def half(pos: Tensor) -> Tensor:
        a = pos[:, None] * omega[None]                 # (N, D/4)
        return torch.cat((a.sin(), a.cos()), dim=1)    # (N, D/2)

    return torch.cat((half(r), half(c)), dim=1)        # (N, D)


@register_encoding("sincos2d")
class SinCos2D(PositionEncoding):
    """Fixed 2D sin-cos table; zero CLS row; recomputed for another grid."""

    hooks = ("table",)

    def __init__(self, ctx: EncodingContext) -> None:
        super().__init__(ctx)
        self.register_buffer("pos_table", self._build(ctx.grid), persistent=False)

    def _build(self, grid: Grid) -> Tensor:
        zeros = torch.zeros(self.ctx.num_prefix, self.ctx.dim)
        return torch.cat((zeros, sincos_2d_table(grid, self.ctx.dim)), dim=0)  # (T, D)

    def table(self, grid: Grid) -> Tensor:
        if tuple(grid) == tuple(self.ctx.grid):
            return self.pos_table
        return self._build(grid).to(self.pos_table.device)
