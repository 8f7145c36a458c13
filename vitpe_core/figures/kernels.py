"""How position is encoded: position-only kernels as small multiples, one panel per checkpoint.

Each panel is centred on the mean of its cells other than the query (or offset 0) and drawn
on its own symmetric diverging range (`KERNEL_SCALE`), so that one outlying cell, such as
SaPE²'s zero self-distance, does not wash the map out (`_centred_on_others`). Panels of models
on different grids sit side by side (the compare page: an imported 14 x 14 model beside 8 x 8
ones): each keeps square cells on its own axes, and each title fits its tile (`panel_title`:
a name too long for the tile is shortened in the middle, the full name is in the hover).

* `kernels_fig`: offset kernels, `(2H-1, 2W-1)` maps with offset 0 in the centre.
* `query_kernels_fig`: one query patch's logits to every key, `(H, W)` maps.
* `panel_title`: a panel's title as wide as its tile; `short_name`: a long name shortened in the
  middle (the page gives the full names of those shortened).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .common import (CHAR_EM, SUBPLOT_FONT_PX, SUBPLOT_LINE_PX, SUBPLOT_TITLES_PX, _grid_axes, _outline,
                     _sized_layout)

KERNEL_SCALE = "RdBu_r"
_TILE_PX, _GAP_PX = 170, 12      # a panel's side; the gap between two panels of a row (a row's titles: more)
PANEL_TITLE_CHARS = int(_TILE_PX / (CHAR_EM * SUBPLOT_FONT_PX))   # 21: a title line as wide as its tile


def short_name(name: str, max_chars: int = PANEL_TITLE_CHARS) -> str:
    """`name` in at most `max_chars` characters: as it is, or its start and its end (an
    import's "-upload") around "…"."""
    if len(name) <= max_chars:
        return name
    head = (max_chars - 1) // 2
    return name[:head] + "…" + name[len(name) - (max_chars - 1 - head):]


def panel_title(name: str, what: str | None = None, max_chars: int = PANEL_TITLE_CHARS) -> str:
    """A small multiple's title that fits its tile: "name · what" on one line where it fits,
    else the name (`short_name`) over `what`. A subplot title is centred on its tile: a longer
    one ran over its neighbour's and past the chart's edge ("…ft-uploa")."""
    one = name if what is None else f"{name} · {what}"
    if len(one) <= max_chars:
        return one
    return short_name(name, max_chars) + ("" if what is None else "<br>" + what[:max_chars])


def _small_multiples(titles: Sequence[str], cols: int) -> tuple[go.Figure, int, int, int]:
    """A grid of at most `cols` small panels per row (no more columns than panels), one per
    title (`panel_title`); returns the figure, its rows, its columns and its title lines."""
    cols = max(1, min(cols, len(titles)))
    rows = max(1, math.ceil(len(titles) / cols))
    lines = max([t.count("<br>") + 1 for t in titles] or [1])
    plot_w, plot_h = _plot_px(rows, cols, lines)
    return make_subplots(rows=rows, cols=cols, subplot_titles=list(titles), horizontal_spacing=_GAP_PX / plot_w,
                         vertical_spacing=(_GAP_PX + _titles_px(lines)) / plot_h if rows > 1 else 0), rows, cols, lines


def _titles_px(lines: int) -> int:
    return SUBPLOT_TITLES_PX + (lines - 1) * SUBPLOT_LINE_PX


def _plot_px(rows: int, cols: int, lines: int = 1) -> tuple[int, int]:
    return (cols * _TILE_PX + (cols - 1) * _GAP_PX,
            rows * _TILE_PX + (rows - 1) * (_GAP_PX + _titles_px(lines)))


def _finish_small_multiples(fig: go.Figure, rows: int, cols: int, lines: int, title: str) -> go.Figure:
    """Square cells without ticks, each panel on its own axes (the y axis of panel k scaled to
    its x axis k: all anchored to the first panel's x, a map of another size was stretched out
    of square); the chart as wide as its columns (`_sized_layout`)."""
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False)
    fig.for_each_yaxis(lambda ax: ax.update(scaleanchor=ax.anchor, scaleratio=1))   # yaxisK.anchor = "xK"
    fig.update_layout(**_sized_layout(title, *_plot_px(rows, cols, lines), subplot_titles=True,
                                      subplot_title_lines=lines))
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
    fig, rows, cols, lines = _small_multiples(
        [panel_title(n, f"rel {scores[n]:.2f}" if scores.get(n) is not None else None) for n in names], cols)
    for i, name in enumerate(names):
        H2, W2 = np.shape(kernels[name])
        cy, cx = (H2 - 1) / 2, (W2 - 1) / 2
        m, lim = _centred_on_others(kernels[name], (H2 // 2, W2 // 2))   # offset 0: e.g. SaPE²'s zero diagonal
        r, c = divmod(i, cols)
        fig.add_trace(go.Heatmap(z=m, x=np.arange(W2) - cx, y=np.arange(H2) - cy, zmin=-lim, zmax=lim,
                                 colorscale=KERNEL_SCALE, showscale=False,
                                 hovertemplate="Δr %{y}, Δc %{x}: %{z:.3f}<extra>" + name + "</extra>",
                                 hoverlabel={"namelength": -1}),
                      row=r + 1, col=c + 1)
        fig.add_shape(type="rect", x0=-0.5, x1=0.5, y0=-0.5, y1=0.5, line=dict(color="black", width=1),
                      row=r + 1, col=c + 1)
        _grid_axes(fig, row=r + 1, col=c + 1)
    return _finish_small_multiples(fig, rows, cols, lines, title)


def query_kernels_fig(maps: Mapping[str, np.ndarray], patches: Mapping[str, tuple[int, int]],
                      scores: Mapping[str, float | None], *, title: str, cols: int = 5) -> go.Figure:
    """Per-query position-only kernels side by side: name -> `(H, W)` logits of the query patch
    `patches[name]` (outlined) to every key, on each checkpoint's own grid, each on its own
    symmetric colour range around its mean (set by the keys other than the query itself, as in
    `kernels_fig`), titled with `scores[name]` as "fit" (`positional.query_fit`: the R² of the
    offset kernel fitted to all queries on this row, in `(−∞, 1]`; shown as it is, negative
    values included)."""
    names = list(maps)
    fig, rows, cols, lines = _small_multiples(
        [panel_title(n, f"fit {scores[n]:.2f}" if scores.get(n) is not None else None) for n in names], cols)
    for i, name in enumerate(names):
        pr, pc = patches[name]
        m, lim = _centred_on_others(maps[name], (pr, pc))      # the query itself: e.g. SaPE²'s zero self-distance
        r, c = divmod(i, cols)
        fig.add_trace(go.Heatmap(z=m, zmin=-lim, zmax=lim, colorscale=KERNEL_SCALE, showscale=False,
                                 hovertemplate="key (%{y}, %{x}): %{z:.3f}<extra>" + name + "</extra>",
                                 hoverlabel={"namelength": -1}),
                      row=r + 1, col=c + 1)
        _outline(fig, pc - 0.5, pr - 0.5, pc + 0.5, pr + 0.5, row=r + 1, col=c + 1)
        _grid_axes(fig, row=r + 1, col=c + 1)
    return _finish_small_multiples(fig, rows, cols, lines, title)
