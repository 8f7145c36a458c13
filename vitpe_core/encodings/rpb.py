"""Relative position biases `rpb` (Swin, arXiv 2103.14030) and `rpb_cls` (BEiT, arXiv 2106.08254).

* `rpb`: per layer and head, a learned table over the offsets `(Δr, Δc)`, shape
  `(2H-1, 2W-1)`. The bias between patches depends only on their offset; prefix
  rows/columns are zero. At another grid the table is resized bicubically (align_corners=False).
* `rpb_cls`: the same table (per layer, or one shared by all layers) plus BEiT's three
  learned prefix entries per head (CLS→patch, patch→CLS, CLS→CLS); resized bilinearly, or by
  BEiT's geometric rule with the option `table_resize="geometric"` (timm-layout BEiT imports).
  Checked: imported BEiT / data2vec-vision models equal transformers' attention weights
  (tests/test_importers_families.py).

Both resize their offset tables with `resize_rel_table` (below), the one resize for this kind of
table: `mode` "bicubic", "bilinear" or "geometric" (BEiT's fine-tuning rule, as timm has it).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import EncodingContext, Grid, PositionEncoding, pad_prefix, register_encoding
from .grid import relative_index

REL_MODES = ("bicubic", "bilinear", "geometric")


def _geometric_offsets(src: int, dst: int) -> list[float]:
    """Where BEiT / timm place the `src` offsets of a source axis (`src = 2H-1`) when the table is
    resized to `dst = 2H'-1`: `0, ±1, ±(1+q), ±(1+q+q²), ...`, `k = src//2` on each side, with `q`
    found by bisection in [1.01, 1.5] so that `1 + q + ... + q^(k-1)` (the outermost offset)
    reaches `dst//2`. Written as timm's `resize_rel_pos_bias_table` `_calc` (same float steps)."""
    left, right = 1.01, 1.5
    q = left
    while right - left > 1e-6:
        q = (left + right) / 2.0
        gp = 1 * (1.0 - q ** (src // 2)) / (1.0 - q)     # geometric_progression(1, q, src // 2)
        if gp > dst // 2:
            right = q
        else:
            left = q
    dis, cur = [], 1
    for i in range(src // 2):
        dis.append(cur)
        cur += q ** (i + 1)
    return [-d for d in reversed(dis)] + [0] + dis


def _linear_weights(p: Tensor, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """1-D linear interpolation on the increasing knots `p` at the points `x`, as timm's
    `RegularGridInterpolator`: left / right knot index and the distances to them (the right
    knot's weight is `dist_left`), 0 outside the knots (so a point outside takes the end value),
    both 1 on a point that is its own left and right knot."""
    right = torch.bucketize(x, p).clamp_(max=p.shape[0] - 1)
    left = (right - 1).clamp_(0, p.shape[0] - 1)
    d_left = (x - p[left]).clamp_(min=0)
    d_right = (p[right] - x).clamp_(min=0)
    both_zero = (d_left == 0) & (d_right == 0)
    d_left[both_zero] = 1.0
    d_right[both_zero] = 1.0
    return left, right, d_left, d_right


def _resize_geometric(table: Tensor, size: tuple[int, int]) -> Tensor:
    """`(..., S_h, S_w)` float32 -> `(..., size)`: source offsets on `_geometric_offsets`, targets
    at the integer offsets `-(D//2) .. D//2`, separable (bi)linear weights, summed as timm sums."""
    axes = []
    for src, dst in zip(table.shape[-2:], size):
        knots = torch.tensor(_geometric_offsets(src, dst), dtype=torch.float32, device=table.device)   # (src,)
        targets = torch.arange(-(dst // 2), dst // 2 + 1, dtype=torch.float32, device=table.device)  # (dst,)
        axes.append(_linear_weights(knots, targets))
    (yl, yr, dyl, dyr), (xl, xr, dxl, dxr) = axes
    out = table[..., yl[:, None], xl[None, :]] * (dyr[:, None] * dxr[None, :])       # (..., D_h, D_w)
    out = out + table[..., yl[:, None], xr[None, :]] * (dyr[:, None] * dxl[None, :])
    out = out + table[..., yr[:, None], xl[None, :]] * (dyl[:, None] * dxr[None, :])
    out = out + table[..., yr[:, None], xr[None, :]] * (dyl[:, None] * dxl[None, :])
    return out / ((dyl + dyr)[:, None] * (dxl + dxr)[None, :])


def resize_rel_table(table: Tensor, new_grid: Grid, *, mode: str = "bicubic", antialias: bool = False) -> Tensor:
    """Offset table `(..., 2H-1, 2W-1)` -> `(..., 2H'-1, 2W'-1)` float32 for the grid `new_grid = (H', W')`.

    `table[..., i, j]` is the bias of the offset `(Δr, Δc) = (i - (H-1), j - (W-1))`; any leading
    dims (`(h, ...)`, `(L, h, ...)`). At the same size the input is returned untouched (its dtype).

    * "bicubic", "bilinear": `F.interpolate(..., align_corners=False)` on the offset grid, in
      float32 (`antialias` passed through; off by default, as Swin / BEiT / transformers do).
    * "geometric": BEiT's rule as timm implements it (`timm.layers.resize_rel_pos_bias_table`,
      its default non-scipy path): each source axis's offsets are put on a geometric progression
      `0, ±1, ±(1+q), ...` that reaches the new outermost offset (`_geometric_offsets`), and the
      table is read at the integer offsets of the new grid by linear interpolation on those
      uneven knots (timm's `RegularGridInterpolator`). Offsets near 0 keep their values, the far
      ones spread out. Beyond the knots the end value holds (`q` is capped at 1.5); `q` is never
      below 1.01, so an axis that keeps its size is still stretched a little, and a smaller grid
      reads roughly the central offsets (a crop), all as in timm. No `antialias`.

    timm's function takes the flat table `((2H-1)(2W-1) [+ extra], heads)`; its row
    `i*(2W-1) + j` of head `k` is `table[k, i, j]` here, i.e. `table = flat[:n].T.reshape(heads,
    2H-1, 2W-1)` with `n = (2H-1)(2W-1)`. The extra rows (BEiT's CLS entries) are not offsets and
    are the caller's business: keep them apart, as `RelativePositionBiasCLS.cls_bias` does.
    """
    if mode not in REL_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, REL_MODES))}; got {mode!r}")
    if antialias and mode == "geometric":
        raise ValueError("antialias=True works only with mode 'bicubic' or 'bilinear', not 'geometric'")
    if table.ndim < 2 or table.shape[-2] % 2 == 0 or table.shape[-1] % 2 == 0:
        raise ValueError(f"an offset table is (..., 2H-1, 2W-1) (odd sizes), got shape {tuple(table.shape)}")
    H, W = new_grid
    if H < 1 or W < 1:
        raise ValueError(f"new_grid must be two positive sizes, got {tuple(new_grid)}")
    size = (2 * H - 1, 2 * W - 1)
    if tuple(table.shape[-2:]) == size:
        return table
    lead = table.shape[:-2]
    x = table.float()
    if mode == "geometric":
        return _resize_geometric(x, size)
    x = x.reshape(1, -1, *table.shape[-2:])                                              # (1, C, 2H-1, 2W-1)
    x = F.interpolate(x, size=size, mode=mode, antialias=antialias, align_corners=False)  # (1, C, 2H'-1, 2W'-1)
    return x.reshape(*lead, *size)


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
        return resize_rel_table(self.rel_tables[layer], grid, mode="bicubic")   # (h, 2H-1, 2W-1)

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
    At another grid the offset table is resized by `resize_rel_table` with `table_resize`
    ("bilinear" by default, align_corners=False, as BEiT does in transformers'
    `interpolate_pos_encoding`; "geometric": BEiT's fine-tuning rule as timm's checkpoint filter
    has it, which timm-layout imports set) and the three entries kept."""

    hooks = ("bias",)

    def __init__(self, ctx: EncodingContext, *, shared: bool = False, table_resize: str = "bilinear") -> None:
        super().__init__(ctx)
        if table_resize not in REL_MODES:
            raise ValueError(f"table_resize must be one of {', '.join(map(repr, REL_MODES))}; got {table_resize!r}")
        H, W = ctx.grid
        self.shared = shared
        self.table_resize = table_resize
        n = 1 if shared else ctx.depth
        self.rel_tables = nn.Parameter(torch.empty(n, ctx.heads, 2 * H - 1, 2 * W - 1))   # (L|1, h, 2H-1, 2W-1)
        self.cls_bias = nn.Parameter(torch.empty(n, ctx.heads, 3))                           # (L|1, h, 3)
        for p in (self.rel_tables, self.cls_bias):
            nn.init.trunc_normal_(p, std=0.02)

    def offset_table(self, grid: Grid, layer: int) -> Tensor:
        """`(h, 2H-1, 2W-1)` bias per offset for `grid` (resized if it is not the build grid)."""
        return resize_rel_table(self.rel_tables[0 if self.shared else layer], grid, mode=self.table_resize)

    def bias(self, q, k, *, grid, layer, parts=None, logits=None):
        P = self.ctx.num_prefix
        table = self.offset_table(grid, layer).flatten(1)                      # (h, (2H-1)(2W-1))
        bias = pad_prefix(table[:, relative_index(grid, table.device)][None].float(), P)  # (1, h, T, T)
        cls = self.cls_bias[0 if self.shared else layer].float()               # (h, 3)
        bias[0, :, :P, P:] = cls[:, 0, None, None]                             # CLS -> patches
        bias[0, :, P:, :P] = cls[:, 1, None, None]                             # patches -> CLS
        bias[0, :, :P, :P] = cls[:, 2, None, None]                             # CLS -> CLS
        return bias
