"""How position is encoded: position-only kernels as small multiples, one panel per checkpoint.

Each panel is centred on the mean of its cells other than the query (or offset 0) and drawn
on its own symmetric diverging range (`KERNEL_SCALE`), so that one outlying cell, such as
SaPE²'s zero self-distance, does not wash the map out (`_centred_on_others`).

* `kernels_fig`: offset kernels, `(2H-1, 2W-1)` maps with offset 0 in the centre.
* `query_kernels_fig`: one query patch's logits to every key, `(H, W)` maps.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import SUBPLOT_FONT_PX, SUBPLOT_TITLES_PX, _grid_axes, _outline, _sized_layout

KERNEL_SCALE = "RdBu_r"
_TILE_PX, _GAP_PX = 170, 12      # a panel's side; the gap between two panels of a row (a row's titles: more)


def _small_multiples(titles: Sequence[str], cols: int) -> tuple[go.Figure, int, int]:
    """A grid of at most `cols` small panels per row (no more columns than panels), one per
    title; returns the figure, its rows and its columns."""
    cols = max(1, min(cols, len(titles)))
    rows = max(1, math.ceil(len(titles) / cols))
    plot_w, plot_h = _plot_px(rows, cols)
    return make_subplots(rows=rows, cols=cols, subplot_titles=list(titles), horizontal_spacing=_GAP_PX / plot_w,
                         vertical_spacing=(_GAP_PX + SUBPLOT_TITLES_PX) / plot_h if rows > 1 else 0), rows, cols


def _plot_px(rows: int, cols: int) -> tuple[int, int]:
    return (cols * _TILE_PX + (cols - 1) * _GAP_PX,
            rows * _TILE_PX + (rows - 1) * (_GAP_PX + SUBPLOT_TITLES_PX))


def _finish_small_multiples(fig: go.Figure, rows: int, title: str) -> go.Figure:
    """Square panels without ticks; the chart as wide as its columns (`_sized_layout`)."""
    cols = len([k for k in fig.layout if k.startswith("xaxis")]) // rows
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, scaleanchor="x", scaleratio=1)
    fig.update_layout(**_sized_layout(title, *_plot_px(rows, cols), subplot_titles=True))
    fig.update_annotations(font_size=SUBPLOT_FONT_PX)
    return fig


def _centred_on_others(a, skip: tuple[int, int]) -> tuple[np.ndarray, float]:
    """`a` minus the mean of its cells other than `skip`, and the symmetric colour limit those
    other cells set (1 when they are all equal or there are none): one outlying cell, such as
    SaPE²'s zero self-distance, then does not wash the map out."""
    m = np.asarray(a, dtype=float)
    others = np.ones_like(m, dtype=bool)
    others[skip] = False
    if not others.any():
        return m, 1.0
    m = m - np.nanmean(m[others])
    return m, float(np.nanmax(np.abs(m[others]))) or 1.0


def kernels_fig(kernels: Mapping[str, np.ndarray], scores: Mapping[str, float | None], *, title: str,
                cols: int = 5) -> go.Figure:
    """Position-only kernels side by side: name -> `(2H-1, 2W-1)` offset map (centre = offset
    0, outlined), each on its own symmetric colour range (set by the other offsets, so that a
    centre far from the rest, as SaPE²'s zero self-distance, does not wash the map out),
    titled with its relative score."""
    names = list(kernels)
    fig, rows, cols = _small_multiples(
        [f"{n} · rel {scores[n]:.2f}" if scores.get(n) is not None else n for n in names], cols)
    for i, name in enumerate(names):
        H2, W2 = np.shape(kernels[name])
        cy, cx = (H2 - 1) / 2, (W2 - 1) / 2
        m, lim = _centred_on_others(kernels[name], (H2 // 2, W2 // 2))   # offset 0: e.g. SaPE²'s zero diagonal
        r, c = divmod(i, cols)
        fig.add_trace(go.Heatmap(z=m, x=np.arange(W2) - cx, y=np.arange(H2) - cy, zmin=-lim, zmax=lim,
                                 colorscale=KERNEL_SCALE, showscale=False,
                                 hovertemplate="Δr %{y}, Δc %{x}: %{z:.3f}<extra>" + name + "</extra>"),
                      row=r + 1, col=c + 1)
        fig.add_shape(type="rect", x0=-0.5, x1=0.5, y0=-0.5, y1=0.5, line=dict(color="black", width=1),
                      row=r + 1, col=c + 1)
        _grid_axes(fig, row=r + 1, col=c + 1)
    return _finish_small_multiples(fig, rows, title)


def query_kernels_fig(maps: Mapping[str, np.ndarray], patches: Mapping[str, tuple[int, int]],
                      scores: Mapping[str, float | None], *, title: str, cols: int = 5) -> go.Figure:
    """Per-query position-only kernels side by side: name -> `(H, W)` logits of the query patch
    `patches[name]` (outlined) to every key, on each checkpoint's own grid, each on its own
    symmetric colour range around its mean (set by the keys other than the query itself, as in
    `kernels_fig`), titled with `scores[name]` as "fit" (`positional.query_fit`: the R² of the
    offset kernel fitted to all queries on this row, in `(−∞, 1]`; shown as it is, negative
    values included)."""
    names = list(maps)
    fig, rows, cols = _small_multiples(
        [f"{n} · fit {scores[n]:.2f}" if scores.get(n) is not None else n for n in names], cols)
    for i, name in enumerate(names):
        pr, pc = patches[name]
        m, lim = _centred_on_others(maps[name], (pr, pc))      # the query itself: e.g. SaPE²'s zero self-distance
        r, c = divmod(i, cols)
        fig.add_trace(go.Heatmap(z=m, zmin=-lim, zmax=lim, colorscale=KERNEL_SCALE, showscale=False,
                                 hovertemplate="key (%{y}, %{x}): %{z:.3f}<extra>" + name + "</extra>"),
                      row=r + 1, col=c + 1)
        _outline(fig, pc - 0.5, pr - 0.5, pc + 0.5, pr + 0.5, row=r + 1, col=c + 1)
        _grid_axes(fig, row=r + 1, col=c + 1)
    return _finish_small_multiples(fig, rows, title)
