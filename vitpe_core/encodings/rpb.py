"""Relative position biases `rpb` (Swin, arXiv 2103.14030) and `rpb_cls` (BEiT, arXiv 2106.08254).

* `rpb`: per layer and head, a learned table over the offsets `(Δr, Δc)`, shape
  `(2H-1, 2W-1)`. The bias between patches depends only on their offset; prefix
  rows/columns are zero. At another grid the table is resized bicubically (align_corners=False).
* `rpb_cls`: the same table (per layer, or one shared by all layers) plus BEiT's three
  learned prefix entries per head (CLS→patch, patch→CLS, CLS→CLS); resized bilinearly.
  Checked: imported BEiT / data2vec-vision models equal transformers' attention weights
  (tests/test_importers_families.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import EncodingContext, Grid, PositionEncoding, pad_prefix, register_encoding
from .grid import relative_index


@register_encoding("rpb")
class RelativePositionBias(PositionEncoding):
    hooks = ("bias",)

    def __init__(self, ctx: EncodingContext) -> None:
        super().__init__(ctx)
        H, W = ctx.grid
        self.rel_tables = nn.Parameter(torch.empty(ctx.depth, ctx.heads, 2 * H - 1, 2 * W - 1))
        nn.init.trunc_normal_(self.rel_tables, std=0.02)

    def offset_table(self, grid: Grid, layer: int) -> Tensor:
        """`(h, 2H-1, 2W-1)` bias per offset for `grid` (resized if it is not the build grid)."""
        table = self.rel_tables[layer]                                     # (h, 2H0-1, 2W0-1)
        size = (2 * grid[0] - 1, 2 * grid[1] - 1)
        if tuple(table.shape[-2:]) != size:
            table = F.interpolate(table[None].float(), size=size, mode="bicubic", align_corners=False)[0]
        return table

    def bias(self, q, k, *, grid, layer, parts=None, logits=None):
        table = self.offset_table(grid, layer).flatten(1)                 # (h, (2H-1)(2W-1))
        idx = relative_index(grid, table.device)                          # (N, N)
        bias = table[:, idx]                                              # (h, N, N)
        return pad_prefix(bias[None].float(), self.ctx.num_prefix)        # (1, h, T, T)


@register_encoding("rpb_cls")
class RelativePositionBiasCLS(PositionEncoding):
    """BEiT's relative position bias (arXiv 2106.08254; data2vec-vision): `rpb`'s table over
    the offsets `(Δr, Δc)` plus three learned entries per head for the prefix tokens,
    `cls_bias[..., 0]` CLS→patch, `[..., 1]` patch→CLS, `[..., 2]` CLS→CLS. One table per
    layer, or one for all layers (`shared=True`, BEiT's `use_shared_relative_position_bias`).
    At another grid the offset table is resized bilinearly (align_corners=False) and the three
    entries kept, as BEiT does in transformers (`interpolate_pos_encoding`)."""

    hooks = ("bias",)

    def __init__(self, ctx: EncodingContext, *, shared: bool = False) -> None:
        super().__init__(ctx)
        H, W = ctx.grid
        self.shared = shared
        n = 1 if shared else ctx.depth
        self.rel_tables = nn.Parameter(torch.empty(n, ctx.heads, 2 * H - 1, 2 * W - 1))   # (L|1, h, 2H-1, 2W-1)
        self.cls_bias = nn.Parameter(torch.empty(n, ctx.heads, 3))                           # (L|1, h, 3)
        for p in (self.rel_tables, self.cls_bias):
            nn.init.trunc_normal_(p, std=0.02)

    def offset_table(self, grid: Grid, layer: int) -> Tensor:
        """`(h, 2H-1, 2W-1)` bias per offset for `grid` (resized if it is not the build grid)."""
        table = self.rel_tables[0 if self.shared else layer]                  # (h, 2H0-1, 2W0-1)
        size = (2 * grid[0] - 1, 2 * grid[1] - 1)
        if tuple(table.shape[-2:]) != size:
            table = F.interpolate(table[None].float(), size=size, mode="bilinear", align_corners=False)[0]
        return table

    def bias(self, q, k, *, grid, layer, parts=None, logits=None):
        P = self.ctx.num_prefix
        table = self.offset_table(grid, layer).flatten(1)                      # (h, (2H-1)(2W-1))
        bias = pad_prefix(table[:, relative_index(grid, table.device)][None].float(), P)  # (1, h, T, T)
        cls = self.cls_bias[0 if self.shared else layer].float()               # (h, 3)
        bias[0, :, :P, P:] = cls[:, 0, None, None]                             # CLS -> patches
        bias[0, :, P:, :P] = cls[:, 1, None, None]                             # patches -> CLS
        bias[0, :, :P, :P] = cls[:, 2, None, None]                             # CLS -> CLS
        return bias
