"""The patch picker's figure: an image whose patches are chosen by clicking them (the app's
`pages.common.picker` draws it with a selection event). Plain data in, a Plotly figure spec (a
dict: cheap to cache and copy) out; no Streamlit.

The axes are the image's pixels, y pointing down. One invisible marker per patch centre carries
the patch `(r, c)` as its customdata; hover picks the nearest centre anywhere on the image
(`hoverdistance=-1`), so a click anywhere in a patch selects that patch.

* `patch_centres(to_patch, w, h)`: the pixel centre of every column and row of patches, from the
  picture's own pixel -> patch mapping (`raster.pixel_to_patch`, `raster.figure7_pixel_to_patch`).
* `picker_spec(png, w, h, cols, rows)`: the figure (the image and the markers).
* `with_outline(spec, box)`: the same figure with the selected patch outlined in `HIGHLIGHT`.
"""
from __future__ import annotations

import base64
from typing import Callable

from .common import HIGHLIGHT

ToPatch = Callable[[float, float, float, float], tuple[int, int]]   # (x, y, width, height) -> (r, c)
MAX_HEIGHT_PX = 420                                                 # a taller image is drawn scaled down


def patch_centres(to_patch: ToPatch, w: int, h: int) -> tuple[dict[int, float], dict[int, float]]:
    """(column -> x, row -> y): the pixel centre of every column and row of patches of a `w`×`h`
    picture, from `to_patch` sampled along its middle row and column (a picture maps x to a
    column and y to a row independently)."""
    cols: dict[int, list[float]] = {}
    rows: dict[int, list[float]] = {}
    for x in range(w):
        cols.setdefault(to_patch(x + 0.5, h / 2, w, h)[1], []).append(x + 0.5)
    for y in range(h):
        rows.setdefault(to_patch(w / 2, y + 0.5, w, h)[0], []).append(y + 0.5)
    return ({c: (v[0] + v[-1]) / 2 for c, v in cols.items()}, {r: (v[0] + v[-1]) / 2 for r, v in rows.items()})


def picker_spec(png: bytes, w: int, h: int, cols: dict[int, float], rows: dict[int, float]) -> dict:
    """The picker's Plotly figure as a dict: the `w`×`h` PNG `png` and one transparent marker per
    patch centre (`cols`, `rows`: `patch_centres`) carrying `(r, c)`. Nothing selected: the same
    spec serves every click on the same picture (`with_outline` adds the selected patch)."""
    pts = [(r, c) for r in sorted(rows) for c in sorted(cols)]
    hidden = {"marker": {"opacity": 0}}
    return {"data": [
        {"type": "image", "source": "data:image/png;base64," + base64.b64encode(png).decode(), "x0": 0.5, "dx": 1,
         "y0": 0.5, "dy": 1, "hoverinfo": "skip"},
        {"type": "scatter", "mode": "markers", "x": [cols[c] for _, c in pts], "y": [rows[r] for r, _ in pts],
         "customdata": [[r, c] for r, c in pts], "marker": {"size": 12, "opacity": 0, "color": "#ffffff"},
         "selected": hidden, "unselected": hidden, "showlegend": False,
         "hovertemplate": "patch (%{customdata[0]}, %{customdata[1]}) — click to select<extra></extra>"}],
        "layout": {"xaxis": {"range": [0, w], "visible": False, "fixedrange": True, "constrain": "domain"},
                   "yaxis": {"range": [h, 0], "visible": False, "fixedrange": True, "scaleanchor": "x",
                             "constrain": "domain"},
                   "margin": {"l": 0, "r": 0, "t": 0, "b": 0}, "height": min(h, MAX_HEIGHT_PX), "hovermode": "closest",
                   "hoverdistance": -1, "clickmode": "event+select", "dragmode": False,
                   "plot_bgcolor": "rgba(0,0,0,0)", "paper_bgcolor": "rgba(0,0,0,0)"}}


def with_outline(spec: dict, box: tuple[float, float, float, float]) -> dict:
    """`spec` (not changed) with the rectangle `box` = (x0, y0, x1, y1), in pixels, outlined in
    `HIGHLIGHT`: the selected patch."""
    x0, y0, x1, y1 = box
    return {**spec, "layout": {**spec["layout"], "shapes": [
        {"type": "rect", "x0": x0, "y0": y0, "x1": x1, "y1": y1, "line": {"color": HIGHLIGHT, "width": 3}}]}}
