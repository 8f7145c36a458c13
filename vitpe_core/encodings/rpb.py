"""Relative position bias `rpb` (Swin, arXiv 2103.14030; BEiT, arXiv 2106.08254).

Per layer and head, a learned table over the offsets `(Δr, Δc)`, shape `(2H-1, 2W-1)`.
The bias between patches depends only on their offset; prefix rows/columns are zero.
At another grid the table is resized bicubically (align_corners=False), as BEiT does.
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
