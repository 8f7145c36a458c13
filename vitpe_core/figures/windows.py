"""Swin's windows (Plotly): a patch's bias or attention row over the window it sits in, on its
stage's token grid, with the block's window boundaries (shifted on odd blocks) as lines.

* `window_lines_path`: the boundaries as one SVG path (one layout shape).
* `window_map_fig`: an `(H, W)` map (NaN outside the window: left blank, or the image shows
  through), the window lines, the window outlined dashed and the patch's token outlined; over the
  image when `image_rgb` is given. The inputs are `swin.windows.WindowRows`' fields.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from .common import BIAS_SCALE, COLORBAR_PX, HIGHLIGHT, Grid, _bounds, _fast, _outline_shape, _sized_layout, colorbar, \
    scale_stops
from .maps import _plot_size, png_data_uri

_WINDOW_LINE = {"color": "#111111", "width": 2}            # the window grid
_WINDOW_LINE_ON_IMAGE = {"color": "white", "width": 2}
_WINDOW_BOX = {"color": HIGHLIGHT, "width": 2, "dash": "dash"}   # the patch's own window


def window_lines_path(row_lines: Sequence[int], col_lines: Sequence[int], grid: Grid, ph: float = 1.0,
                      pw: float = 1.0) -> str:
    """Window boundaries on an `H x W` grid of `ph x pw` cells as one SVG path: a line at row `y`
    runs between rows y-1 and y, across the grid (coordinates: cell edges at multiples of the cell)."""
    H, W = grid
    rows = [f"M0,{y * ph:g}H{W * pw:g}" for y in row_lines]
    cols = [f"M{x * pw:g},0V{H * ph:g}" for x in col_lines]
    return "".join(rows + cols)


def window_map_fig(m: np.ndarray, *, row_lines: Sequence[int], col_lines: Sequence[int], title: str,
                   colorbar_title: str, patch: tuple[int, int] | None = None,
                   box: tuple[int, int, int, int] | None = None, image_rgb: np.ndarray | None = None,
                   colorscale: str = BIAS_SCALE, zmin: float | None = None, zmax: float | None = None,
                   opacity: float = 0.75) -> go.Figure:
    """`m: (H, W)` on a Swin stage's token grid, NaN outside the patch's window; `row_lines` /
    `col_lines` the block's window boundaries (`swin.windows.window_lines`), `box = (r0, c0, r1, c1)`
    the patch's window (end exclusive), `patch` its token, both outlined. With `image_rgb (h_px,
    w_px, 3)` uint8 the map is drawn semi-transparent over the image (the grid spread over it)."""
    m = np.asarray(m, dtype=float)
    H, W = m.shape
    if image_rgb is not None:
        h_px, w_px = image_rgb.shape[:2]
        ph, pw = h_px / H, w_px / W
    else:
        ph = pw = 1.0
    zmin, zmax = _bounds(m, zmin, zmax)
    rows, cols = np.meshgrid(np.arange(H), np.arange(W), indexing="ij")
    heat = {"type": "heatmap", "z": m, "x0": pw / 2, "dx": pw, "y0": ph / 2, "dy": ph,
            "colorscale": scale_stops(colorscale), "colorbar": colorbar(colorbar_title), "hoverongaps": False,
            "customdata": np.stack([rows, cols], -1),
            "hovertemplate": "token (%{customdata[0]}, %{customdata[1]})<br>value %{z:.4g}<extra></extra>"}
    if zmin is not None:
        heat["zmin"], heat["zmax"] = zmin, zmax
    shapes = []
    path = window_lines_path(row_lines, col_lines, (H, W), ph, pw)
    if path:
        shapes.append({"type": "path", "path": path,
                       "line": _WINDOW_LINE_ON_IMAGE if image_rgb is not None else _WINDOW_LINE})
    if box is not None:
        r0, c0, r1, c1 = box
        shapes.append({"type": "rect", "x0": c0 * pw, "y0": r0 * ph, "x1": c1 * pw, "y1": r1 * ph,
                       "line": _WINDOW_BOX, "fillcolor": "rgba(0,0,0,0)"})
    if patch is not None:
        r, c = patch
        shapes.append(_outline_shape(c * pw, r * ph, (c + 1) * pw, (r + 1) * ph))
    axis = {"showgrid": False, "zeroline": False, "constrain": "domain"}
    size = _plot_size(H * ph, W * pw) if image_rgb is not None else _plot_size(H, W)
    layout = {**_sized_layout(title, *size, l=30, b=30, r=COLORBAR_PX), "shapes": shapes,
              "plot_bgcolor": "white",
              "xaxis": {**axis, "range": [0, W * pw], "showticklabels": False, "title": {"text": "column"}},
              "yaxis": {**axis, "range": [H * ph, 0], "showticklabels": False, "title": {"text": "row"},
                        "scaleanchor": "x", "scaleratio": 1}}
    data = [heat]
    if image_rgb is not None:
        heat["opacity"] = opacity
        data = [{"type": "image", "source": png_data_uri(image_rgb), "x0": 0.5, "y0": 0.5, "hoverinfo": "skip"}, heat]
    return _fast(data, layout)
