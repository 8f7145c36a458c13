"""Maps on the patch grid (Plotly heatmaps): one map, a map over the image, small multiples.

Every map has a title saying what is shown and a labelled colourbar; row 0 is at the top and
the query patch `patch` is outlined.

* `similarity_matrix_fig`: the full `(N, N)` cosine similarity of a position table.
* `figure7_grid_fig`: the ViT paper's Figure 7 — `H x W` small multiples, tile `(r, c)` is
  patch (r, c)'s similarity to every patch; drawn as one heatmap of the
  `(H(H+1)-1, W(W+1)-1)` array of `figure7_canvas`, with NaN separators (one trace instead of
  `N` subplots).
* `patch_map_fig`: one `(H, W)` map, large, ticks on whole patches (`_dtick`).
* `overlay_fig`: an `(H, W)` map over the image (`png_data_uri`), with the patch grid
  (`grid_path`).
* `layers_fig`: one `(H, W)` map per layer (or head), square tiles with ticks, in rows of at
  most `LAYERS_MAX_COLS`.
* `pair_fig`: two maps side by side with their own colour scales.
* `shift_diff_fig`: the stress test's three maps: the original moved with the content, the
  map after the change, and their difference.
"""
from __future__ import annotations

import base64
import functools
import io
import math
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from PIL import Image
from plotly.subplots import make_subplots

from .common import (ATTENTION_SCALE, BIAS_SCALE, COLORBAR_PX, MAP_PX, MIN_TILE_PX, PAIR_PX, SIMILARITY_SCALE,
                     SUBPLOT_FONT_PX, SUBPLOT_TITLES_PX, Grid, _bounds, _fast, _grid_axes, _outline, _outline_shape,
                     _sized_layout, _square, colorbar, scale_stops)


def _plot_size(rows: float, cols: float, longest: float = MAP_PX) -> tuple[float, float]:
    """(width, height) in px of a plot area for a map of `rows x cols` square cells whose longer
    side is `longest` px."""
    scale = longest / max(rows, cols, 1e-9)
    return cols * scale, rows * scale


def similarity_matrix_fig(sim: np.ndarray, grid: Grid, *, title: str = "Cosine similarity of position embeddings",
                          patch: tuple[int, int] | None = None) -> go.Figure:
    """`sim: (N, N)`; the row and column of `patch` are outlined."""
    H, W = grid
    N = H * W
    assert sim.shape == (N, N), (sim.shape, grid)
    r, c = np.divmod(np.arange(N), W)                                     # (N,) each
    cells = np.stack(np.broadcast_arrays(r[:, None], c[:, None], r[None], c[None]), -1)  # (N, N, 4)
    fig = go.Figure(go.Heatmap(
        z=sim, customdata=cells, colorscale=scale_stops(SIMILARITY_SCALE), zmin=-1, zmax=1,
        colorbar=colorbar("cosine<br>similarity"),
        hovertemplate="patch (%{customdata[0]}, %{customdata[1]}) vs (%{customdata[2]}, %{customdata[3]})"
                      "<br>similarity %{z:.3f}<extra></extra>"))
    if patch is not None:
        i = patch[0] * W + patch[1]
        _outline(fig, -0.5, i - 0.5, N - 0.5, i + 0.5)
    fig.update_layout(**_sized_layout(title, MAP_PX, MAP_PX, l=60, b=50, r=COLORBAR_PX))
    fig.update_layout(xaxis_title="patch n = r·W + c", yaxis_title="patch n = r·W + c")
    step = W * _dtick(H)                         # integer ticks (Plotly's own: halves on a small grid), row starts
    fig.update_xaxes(tickmode="linear", tick0=0, dtick=step)
    fig.update_yaxes(tickmode="linear", tick0=0, dtick=step)
    _grid_axes(fig)
    _square(fig)
    return fig


def figure7_canvas(sim_grid: np.ndarray) -> np.ndarray:
    """`(H, W, H, W)` -> `(H(H+1)-1, W(W+1)-1)`: tile `(r, c)` at rows `r(H+1)…`, columns
    `c(W+1)…`, separated by NaN rows and columns."""
    H, W = sim_grid.shape[:2]
    canvas = np.full((H, H + 1, W, W + 1), np.nan, dtype=np.float32)      # (r, i, c, j)
    canvas[:, :H, :, :W] = sim_grid.transpose(0, 2, 1, 3)                 # (r, i, c, j) <- (r, c, i, j)
    return canvas.reshape(H * (H + 1), W * (W + 1))[:-1, :-1]


def figure7_grid_fig(sim_grid: np.ndarray, *, patch: tuple[int, int] | None = None,
                     title: str = "Similarity of each patch's position embedding to all others (ViT Figure 7)",
                     plot_px: float = MAP_PX) -> go.Figure:
    """`sim_grid: (H, W, H, W)`: tile `(r, c)` shows patch (r, c)'s similarity to every patch;
    the canvas's longer side `plot_px` px."""
    H, W = sim_grid.shape[:2]
    z = figure7_canvas(sim_grid)                                          # (H(H+1)-1, W(W+1)-1)
    y, x = np.divmod(np.arange(H * (H + 1) - 1), H + 1), np.divmod(np.arange(W * (W + 1) - 1), W + 1)
    cells = np.stack(np.broadcast_arrays(y[0][:, None], x[0][None], y[1][:, None], x[1][None]), -1)
    fig = go.Figure(go.Heatmap(
        z=z, customdata=cells, colorscale=scale_stops(SIMILARITY_SCALE), zmin=-1, zmax=1, hoverongaps=False,
        colorbar=colorbar("cosine<br>similarity"),
        hovertemplate="tile = patch (%{customdata[0]}, %{customdata[1]})<br>"
                      "vs patch (%{customdata[2]}, %{customdata[3]}): %{z:.3f}<extra></extra>"))
    if patch is not None:
        r, c = patch
        _outline(fig, c * (W + 1) - 0.5, r * (H + 1) - 0.5, c * (W + 1) + W - 0.5, r * (H + 1) + H - 0.5)
    fig.update_layout(**_sized_layout(title, *_plot_size(*z.shape, plot_px), l=30, b=30, r=COLORBAR_PX))
    fig.update_layout(plot_bgcolor="white")
    fig.update_xaxes(showticklabels=False, title="tile column c")
    fig.update_yaxes(showticklabels=False, title="tile row r")
    _grid_axes(fig)
    _square(fig)
    return fig


def patch_map_fig(m: np.ndarray, *, title: str, colorbar_title: str, patch: tuple[int, int] | None = None,
                  colorscale: str = BIAS_SCALE, zmin: float | None = None, zmax: float | None = None) -> go.Figure:
    """`m: (H, W)` on the patch grid; `patch` outlined; ticks on whole patches (`_dtick`: Plotly's
    own put a 4 x 4 grid's at -0.5, 0, 0.5, …)."""
    zmin, zmax = _bounds(m, zmin, zmax)
    heat = {"type": "heatmap", "z": np.asarray(m), "colorscale": scale_stops(colorscale),
            "colorbar": colorbar(colorbar_title),
            "hovertemplate": "patch (%{y}, %{x})<br>value %{z:.4g}<extra></extra>"}
    if zmin is not None:
        heat["zmin"] = zmin
    if zmax is not None:
        heat["zmax"] = zmax
    H, W = np.shape(m)
    axis = {"showgrid": False, "zeroline": False, "constrain": "domain", "tickmode": "linear", "tick0": 0}
    layout = {**_sized_layout(title, *_plot_size(H, W), l=50, b=45, r=COLORBAR_PX),
              "xaxis": {**axis, "dtick": _dtick(W), "title": {"text": "column c"}},
              "yaxis": {**axis, "dtick": _dtick(H), "title": {"text": "row r"}, "autorange": "reversed",
                        "scaleanchor": "x", "scaleratio": 1}}
    if patch is not None:
        layout["shapes"] = [_outline_shape(patch[1] - 0.5, patch[0] - 0.5, patch[1] + 0.5, patch[0] + 0.5)]
    return _fast([heat], layout)


@functools.lru_cache(maxsize=16)
def _png_data_uri(shape: tuple[int, ...], raw: bytes) -> str:
    bio = io.BytesIO()
    Image.fromarray(np.frombuffer(raw, np.uint8).reshape(shape)).save(bio, format="PNG")
    return "data:image/png;base64," + base64.b64encode(bio.getvalue()).decode("ascii")


def png_data_uri(image_rgb: np.ndarray) -> str:
    """`image_rgb` as a PNG data URI; the last 16 images' are remembered (by content): every
    overlay of a page draws the same image, and a click redraws them all."""
    a = np.ascontiguousarray(image_rgb, dtype=np.uint8)
    return _png_data_uri(a.shape, a.tobytes())


def grid_path(grid: Grid, w_px: float, h_px: float) -> str:
    """The inner lines of an `H x W` patch grid over a `w_px x h_px` image as one SVG path (one
    layout shape instead of `H + W - 2`)."""
    H, W = grid
    ph, pw = h_px / H, w_px / W
    rows = [f"M0,{r * ph:g}H{w_px:g}" for r in range(1, H)]
    cols = [f"M{c * pw:g},0V{h_px:g}" for c in range(1, W)]
    return "".join(rows + cols)


def overlay_fig(image_rgb: np.ndarray, m: np.ndarray, grid: Grid, *, patch: tuple[int, int] | None = None,
                title: str = "", colorbar_title: str = "", colorscale: str = BIAS_SCALE,
                opacity: float = 0.6, zmin: float | None = 0.0, zmax: float | None = 1.0) -> go.Figure:
    """`image_rgb: (h_px, w_px, 3)` uint8 (the image as the model sees it, any upscaling),
    `m: (H, W)` drawn semi-transparent over it, with the patch grid (one path) and `patch` outlined."""
    h_px, w_px = image_rgb.shape[:2]
    H, W = grid
    assert m.shape == (H, W), (m.shape, grid)
    ph, pw = h_px / H, w_px / W
    zmin, zmax = _bounds(m, zmin, zmax)
    heat = {"type": "heatmap", "z": np.asarray(m), "x0": pw / 2, "dx": pw, "y0": ph / 2, "dy": ph,
            "colorscale": scale_stops(colorscale), "opacity": opacity,
            "colorbar": colorbar(colorbar_title),
            "customdata": np.stack(np.meshgrid(np.arange(H), np.arange(W), indexing="ij"), -1),
            "hovertemplate": "patch (%{customdata[0]}, %{customdata[1]})<br>value %{z:.4g}<extra></extra>"}
    if zmin is not None:
        heat["zmin"] = zmin
    if zmax is not None:
        heat["zmax"] = zmax
    shapes = []
    if H > 1 or W > 1:
        shapes.append({"type": "path", "path": grid_path(grid, w_px, h_px), "line": {"color": "white", "width": 1}})
    if patch is not None:
        shapes.append(_outline_shape(patch[1] * pw, patch[0] * ph, (patch[1] + 1) * pw, (patch[0] + 1) * ph))
    axis = {"showticklabels": False, "showgrid": False, "zeroline": False, "constrain": "domain"}
    layout = {**_sized_layout(title, *_plot_size(h_px, w_px), r=COLORBAR_PX), "shapes": shapes,
              "xaxis": {**axis, "range": [0, w_px]},
              "yaxis": {**axis, "range": [h_px, 0], "scaleanchor": "x", "scaleratio": 1}}
    image = {"type": "image", "source": png_data_uri(image_rgb), "x0": 0.5, "y0": 0.5, "hoverinfo": "skip"}
    return _fast([image, heat], layout)                                                  # image edges at 0


LAYERS_MAX_COLS = 3
_LAYERS_GAP_PX = 36       # between two tiles of a row: the next tile's row ticks


def _dtick(n: int) -> int:
    """A tick every `_dtick(n)` patches: four or five ticks along a side of `n` patches,
    on whole patches (an integer grid gets integer ticks only)."""
    return max(1, math.ceil(n / 4))


def layers_fig(maps: np.ndarray, *, title: str, colorbar_title: str, patch: tuple[int, int] | None = None,
               colorscale: str = BIAS_SCALE, zmin: float | None = 0.0, zmax: float | None = 1.0,
               labels: Sequence[str] | None = None) -> go.Figure:
    """`maps: (L, H, W)`, one small heatmap per layer, one shared colour scale: square tiles
    (each at least `MIN_TILE_PX` tall) in rows of at most `LAYERS_MAX_COLS`, with row and column
    ticks on every tile."""
    L, H, W = maps.shape
    zmin, zmax = _bounds(maps, zmin, zmax)   # one range for all layers
    labels = list(labels) if labels is not None else [f"layer {i}" for i in range(L)]
    cols = L if L <= LAYERS_MAX_COLS else min(LAYERS_MAX_COLS, math.ceil(math.sqrt(L)))   # 4 -> 2 x 2, 6 -> 3 x 2
    rows = max(1, math.ceil(L / cols))
    gap_px = SUBPLOT_TITLES_PX + 24                                   # a tile's title + the x ticks above the next
    plot_px = rows * MIN_TILE_PX + (rows - 1) * gap_px
    plot_w = cols * MIN_TILE_PX + (cols - 1) * _LAYERS_GAP_PX
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=labels, horizontal_spacing=_LAYERS_GAP_PX / plot_w,
                        vertical_spacing=gap_px / plot_px if rows > 1 else 0)
    for i in range(L):
        r, c = divmod(i, cols)
        at = dict(row=r + 1, col=c + 1)
        fig.add_trace(go.Heatmap(
            z=maps[i], colorscale=scale_stops(colorscale), zmin=zmin, zmax=zmax, showscale=i == L - 1,
            colorbar=colorbar(colorbar_title, len=1, y=0.5, yanchor="middle"),
            hovertemplate=f"{labels[i]}<br>patch (%{{y}}, %{{x}})<br>value %{{z:.4g}}<extra></extra>"), **at)
        _grid_axes(fig, **at)
        fig.update_xaxes(showticklabels=True, ticks="outside", ticklen=3, dtick=_dtick(W), tick0=0,
                         tickfont_size=10, scaleanchor=f"y{'' if i == 0 else i + 1}", **at)
        fig.update_yaxes(showticklabels=True, ticks="outside", ticklen=3, dtick=_dtick(H), tick0=0,
                         tickfont_size=10, **at)
        if patch is not None:
            _outline(fig, patch[1] - 0.5, patch[0] - 0.5, patch[1] + 0.5, patch[0] + 0.5, **at)
    fig.update_layout(**_sized_layout(title, plot_w, plot_px, subplot_titles=True, l=30, b=24, r=COLORBAR_PX))
    fig.update_annotations(font_size=SUBPLOT_FONT_PX)
    return fig


def pair_fig(left: np.ndarray, right: np.ndarray, *, titles: tuple[str, str], colorbar_titles: tuple[str, str],
             colorscales: tuple[str, str] = (BIAS_SCALE, ATTENTION_SCALE),
             ranges: tuple[tuple[float | None, float | None], tuple[float | None, float | None]] = ((0, 1), (0, None)),
             patch: tuple[int, int] | None = None, title: str = "") -> go.Figure:
    """Two `(H, W)` maps side by side, each with its own colour scale and colourbar (the
    compare page: an encoding's positional component and the attention row)."""
    H, W = np.shape(left)
    map_w, map_h = _plot_size(H, W, PAIR_PX)
    plot_w = 2 * map_w + COLORBAR_PX                           # map, its colour bar, map (its bar in the margin)
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=COLORBAR_PX / plot_w)
    for i, (m, cbt, cs, (lo, hi)) in enumerate(zip((left, right), colorbar_titles, colorscales, ranges)):
        lo, hi = _bounds(m, lo, hi)
        fig.add_trace(go.Heatmap(
            z=m, colorscale=scale_stops(cs), zmin=lo, zmax=hi,
            colorbar=colorbar(cbt, x=map_w / plot_w if i == 0 else 1.0),
            hovertemplate="patch (%{y}, %{x})<br>value %{z:.4g}<extra></extra>"), row=1, col=i + 1)
        _grid_axes(fig, row=1, col=i + 1)
        fig.update_xaxes(showticklabels=False, scaleanchor="y" if i == 0 else "y2", row=1, col=i + 1)
        fig.update_yaxes(showticklabels=False, row=1, col=i + 1)
        if patch is not None:
            _outline(fig, patch[1] - 0.5, patch[0] - 0.5, patch[1] + 0.5, patch[0] + 0.5, row=1, col=i + 1)
    fig.update_layout(**_sized_layout(title, plot_w, map_h, subplot_titles=True, r=COLORBAR_PX))
    fig.update_annotations(font_size=SUBPLOT_FONT_PX)
    return fig


DIFF_SCALE = "RdBu_r"        # difference maps: blue below, red above, white = equal


def shift_diff_fig(expected: np.ndarray, new: np.ndarray, diff: np.ndarray, *, title: str, colorbar_title: str,
                   patch: tuple[int, int] | None = None, colorscale: str = BIAS_SCALE,
                   titles: tuple[str, str, str] = ("original, moved with the content", "after the change",
                                                   "difference (after − moved)")) -> go.Figure:
    """The stress test's difference view, three `(H, W)` maps on the new grid: the original map
    carried with the content (`expected`, NaN = content from outside, left blank), the map after
    the shift or resize (`new`; the two share one colour scale) and `diff = new − expected` on a
    symmetric diverging scale (white = the map moved exactly with the content)."""
    H, W = np.shape(new)
    map_w, map_h = _plot_size(H, W, PAIR_PX)
    plot_w = 3 * map_w + 2 * COLORBAR_PX                       # the second map's bar between it and the third
    spacing = COLORBAR_PX / plot_w
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=spacing)
    both = np.concatenate([np.ravel(expected), np.ravel(new)])
    lo, hi = _bounds(both, None, None) if np.isfinite(both).any() else (None, None)
    span = float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else 0.0
    span = span if span > 0 else 1e-12
    width = map_w / plot_w
    for i, (m, cs, (zlo, zhi)) in enumerate(zip((expected, new, diff), (colorscale, colorscale, DIFF_SCALE),
                                                ((lo, hi), (lo, hi), (-span, span)))):
        bar = None if i == 0 else colorbar(colorbar_title if i == 1 else "difference",
                                           x=(2 * width + spacing) if i == 1 else 1.0)
        fig.add_trace(go.Heatmap(z=m, colorscale=scale_stops(cs), zmin=zlo, zmax=zhi, showscale=bar is not None,
                                 colorbar=bar, hoverongaps=False,
                                 hovertemplate="patch (%{y}, %{x})<br>value %{z:.4g}<extra></extra>"),
                      row=1, col=i + 1)
        _grid_axes(fig, row=1, col=i + 1)
        fig.update_xaxes(showticklabels=False, scaleanchor="y" if i == 0 else f"y{i + 1}", row=1, col=i + 1)
        fig.update_yaxes(showticklabels=False, row=1, col=i + 1)
        if patch is not None:
            _outline(fig, patch[1] - 0.5, patch[0] - 0.5, patch[1] + 0.5, patch[0] + 0.5, row=1, col=i + 1)
    fig.update_layout(**_sized_layout(title, plot_w, map_h, subplot_titles=True, r=COLORBAR_PX),
                      plot_bgcolor="#eeeeee")
    fig.update_annotations(font_size=SUBPLOT_FONT_PX)
    return fig
