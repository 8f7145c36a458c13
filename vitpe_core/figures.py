"""Figures for the app: numpy in, Plotly `Figure` out, no Streamlit.

Every figure has a title saying what is shown and a labelled colourbar; maps are drawn on
the patch grid with row 0 at the top (row-major patches, docs/encodings.md), and the query
patch is outlined. `export_config(name)` is the `config=` for `st.plotly_chart` that makes
the modebar's camera button save a PNG named after the figure.

Titles fit a phone: `wrap_title` breaks them into lines of at most `TITLE_MAX_CHARS`
characters (a chart `NARROW_CHART_PX` wide at `TITLE_FONT_PX`), and they sit below a band
left free for Plotly's modebar, so neither is cut off nor covered. Lines of several
checkpoints take one colour per checkpoint name everywhere (`checkpoint_colors`).

* `similarity_matrix_fig`: the full `(N, N)` cosine similarity of a position table.
* `figure7_grid_fig`: the ViT paper's Figure 7 — `H x W` small multiples, tile `(r, c)` is
  patch (r, c)'s similarity to every patch; drawn as one heatmap of an
  `(H(H+1)-1, W(W+1)-1)` array with NaN separators (one trace instead of `N` subplots).
* `patch_map_fig`: one `(H, W)` map, large.
* `overlay_fig`: an `(H, W)` map over the image, with the patch grid.
* `layers_fig`: one `(H, W)` map per layer (or head), square tiles with ticks, in rows of at most 3.
* `pair_fig`: two maps side by side with their own colour scales.
* `curves_fig`, `topk_fig`, `line_fig`: training curves, top-k probabilities, a score per epoch.
* Raster helpers for clicking (PIL images, not Plotly): `display_image`, `grid_image`,
  `figure7_image`, and `pixel_to_patch` / `figure7_pixel_to_patch` to map a click back.
"""
from __future__ import annotations

import base64
import functools
import io
import math
import re
from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from PIL import Image

Grid = tuple[int, int]

SIMILARITY_SCALE = "Viridis"
BIAS_SCALE = "Blues"        # SaPE²'s Figure 4: near = light, far = strong
ATTENTION_SCALE = "Magma"
HIGHLIGHT = "#ff2d55"
COMPONENT_STYLE = {   # positional component label -> (colour scale, range, colourbar title)
    "bias row": (BIAS_SCALE, (0, 1), "bias (0-1)"),
    "table similarity": (SIMILARITY_SCALE, (-1, 1), "cosine"),
    "RoPE kernel": (SIMILARITY_SCALE, (-1, 1), "mean cos Δθ"),
    "none": (BIAS_SCALE, (0, 1), "—"),
}


def component_style(label: str) -> tuple[str, tuple[float | None, float | None], str]:
    """How the compare page draws a positional component (`views.PanelView.label`)."""
    return COMPONENT_STYLE.get(label, (BIAS_SCALE, (None, None), label))


_MARGIN = dict(l=10, r=10, t=60, b=10)

TITLE_FONT_PX = 15
SUBPLOT_FONT_PX = 13
NARROW_CHART_PX = 340      # a chart's width on a 390 px wide phone (the page's padding taken off)
CHAR_EM = 0.6              # a generous mean glyph width of the sans-serif font, in font sizes
TITLE_MAX_CHARS = int(NARROW_CHART_PX / (CHAR_EM * TITLE_FONT_PX))   # 37
TITLE_LINE_PX = 20
MODEBAR_PX = 34            # the band at a chart's top where Plotly's modebar appears: no title there
SUBPLOT_TITLES_PX = 22
MULTILINE_TITLE_LIFT_PX = 12   # Plotly draws a title of several lines this much higher than its top pad says
MIN_TILE_PX = 160          # the smallest side of a small-multiple tile (layers_fig)
# One colour per checkpoint (`checkpoint_colors`): qualitative, dark enough on white, no greys.
CHECKPOINT_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#00838f",
                      "#393b79", "#637939", "#a55194", "#b8860b")


def export_config(filename: str) -> dict:
    """Plotly config: the modebar camera saves `filename`.png at twice the screen size; the
    modebar keeps only the buttons a heatmap or a line chart uses (it is narrower on a phone)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in filename)[:100] or "figure"
    return {"toImageButtonOptions": {"format": "png", "filename": safe, "scale": 2},
            "displaylogo": False,
            "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d", "toggleSpikelines",
                                       "hoverClosestCartesian", "hoverCompareCartesian"]}


def wrap_title(text: str, max_chars: int = TITLE_MAX_CHARS) -> list[str]:
    """`text` as lines of at most `max_chars` characters, broken at spaces (and at `<br>`); a
    word longer than a line (a long checkpoint name) is broken inside."""
    lines: list[str] = []
    for para in re.split(r"<br\s*/?>", text or ""):
        line = ""
        for word in para.split():
            while len(word) > max_chars:
                if line:
                    lines.append(line)
                    line = ""
                lines.append(word[:max_chars])
                word = word[max_chars:]
            if line and len(line) + 1 + len(word) > max_chars:
                lines.append(line)
                line = ""
            line = f"{line} {word}" if line else word
        if line:
            lines.append(line)
    return lines


def _title_layout(title: str, *, subplot_titles: bool = False, **margin) -> dict:
    """The layout entries `title` and `margin` of `_title`, as plain dicts."""
    lines = wrap_title(title)
    below = SUBPLOT_TITLES_PX if subplot_titles else 0
    pad = MODEBAR_PX + (MULTILINE_TITLE_LIFT_PX if len(lines) > 1 else 0)
    return {"title": {"text": "<br>".join(lines), "x": 0, "xref": "paper", "xanchor": "left", "y": 1,
                      "yref": "container", "yanchor": "top", "pad": {"t": pad}, "font": {"size": TITLE_FONT_PX}},
            "margin": {**_MARGIN, **margin, "t": pad + TITLE_LINE_PX * len(lines) + below + 8}}


def _title(fig: go.Figure, title: str, *, subplot_titles: bool = False, **margin) -> None:
    """`title` wrapped to fit a phone (`wrap_title`), left-aligned, its top `MODEBAR_PX` below the
    chart's top (the modebar's band); the top margin holds the band, every line and the subplot
    titles."""
    fig.update_layout(**_title_layout(title, subplot_titles=subplot_titles, **margin))   # top-anchored
    if subplot_titles:
        fig.update_annotations(font_size=SUBPLOT_FONT_PX)


def _fast(data: list[dict], layout: dict) -> go.Figure:
    """A Figure from plain dicts without Plotly's per-property validation (a tenth of the time
    of `add_trace` / `update_layout`; what a click on the bias page rebuilds). The dicts must be
    valid: tests/test_figures.py checks them against a validated copy."""
    return go.Figure({"data": data, "layout": layout}, _validate=False)


def checkpoint_colors(names: Sequence[str]) -> dict[str, str]:
    """name -> colour: the names sorted, one palette colour each (`CHECKPOINT_PALETTE`, repeated
    after 12). Pass every checkpoint on offer, not the ones a chart shows, and a checkpoint
    keeps its colour in every chart."""
    return {n: CHECKPOINT_PALETTE[i % len(CHECKPOINT_PALETTE)] for i, n in enumerate(sorted(set(names)))}


def _grid_axes(fig: go.Figure, *, row=None, col=None, reversed_y: bool = True) -> None:
    kw = {} if row is None else dict(row=row, col=col)
    fig.update_xaxes(showgrid=False, zeroline=False, constrain="domain", **kw)
    fig.update_yaxes(showgrid=False, zeroline=False, constrain="domain",
                     autorange="reversed" if reversed_y else True, **kw)


def _square(fig: go.Figure) -> None:
    fig.update_yaxes(scaleanchor="x", scaleratio=1)


@functools.lru_cache(maxsize=32)
def _scale_stops(colorscale: str) -> tuple[tuple[float, str], ...]:
    from plotly.colors import get_colorscale, hex_to_rgb
    return tuple((float(v), "rgb({},{},{})".format(*hex_to_rgb(c)) if c.startswith("#") else c)
                 for v, c in get_colorscale(colorscale))


def scale_stops(colorscale: str) -> list[list]:
    """A named Plotly colour scale as explicit `rgb()` stops. Streamlit's Plotly theme uses the
    hex colours `#000001`-`#0000xx` as placeholders and swaps them for theme colours in the
    browser: Magma's first stop, `#000004`, was drawn pink."""
    return [list(stop) for stop in _scale_stops(colorscale)]


def _outline(fig: go.Figure, x0: float, y0: float, x1: float, y1: float, **kw) -> None:
    fig.add_shape(type="rect", x0=x0, y0=y0, x1=x1, y1=y1, line=dict(color=HIGHLIGHT, width=3),
                  fillcolor="rgba(0,0,0,0)", **kw)


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
        colorbar=dict(title=dict(text="cosine<br>similarity")),
        hovertemplate="patch (%{customdata[0]}, %{customdata[1]}) vs (%{customdata[2]}, %{customdata[3]})"
                      "<br>similarity %{z:.3f}<extra></extra>"))
    if patch is not None:
        i = patch[0] * W + patch[1]
        _outline(fig, -0.5, i - 0.5, N - 0.5, i + 0.5)
    _title(fig, title)
    fig.update_layout(xaxis_title="patch n = r·W + c", yaxis_title="patch n = r·W + c")
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
                     title: str = "Similarity of each patch's position embedding to all others (ViT Figure 7)"
                     ) -> go.Figure:
    """`sim_grid: (H, W, H, W)`: tile `(r, c)` shows patch (r, c)'s similarity to every patch."""
    H, W = sim_grid.shape[:2]
    z = figure7_canvas(sim_grid)                                          # (H(H+1)-1, W(W+1)-1)
    y, x = np.divmod(np.arange(H * (H + 1) - 1), H + 1), np.divmod(np.arange(W * (W + 1) - 1), W + 1)
    cells = np.stack(np.broadcast_arrays(y[0][:, None], x[0][None], y[1][:, None], x[1][None]), -1)
    fig = go.Figure(go.Heatmap(
        z=z, customdata=cells, colorscale=scale_stops(SIMILARITY_SCALE), zmin=-1, zmax=1, hoverongaps=False,
        colorbar=dict(title=dict(text="cosine<br>similarity")),
        hovertemplate="tile = patch (%{customdata[0]}, %{customdata[1]})<br>"
                      "vs patch (%{customdata[2]}, %{customdata[3]}): %{z:.3f}<extra></extra>"))
    if patch is not None:
        r, c = patch
        _outline(fig, c * (W + 1) - 0.5, r * (H + 1) - 0.5, c * (W + 1) + W - 0.5, r * (H + 1) + H - 0.5)
    _title(fig, title)
    fig.update_layout(plot_bgcolor="white")
    fig.update_xaxes(showticklabels=False, title="tile column c")
    fig.update_yaxes(showticklabels=False, title="tile row r")
    _grid_axes(fig)
    _square(fig)
    return fig


def _bounds(m: np.ndarray, zmin: float | None, zmax: float | None) -> tuple[float | None, float | None]:
    """Complete a half-given colour range from the data: plotly keeps `zauto` on unless both
    ends are set, and its colour bar then shows a band that no cell uses."""
    if (zmin is None) == (zmax is None):
        return zmin, zmax
    finite = np.asarray(m, dtype=float)[np.isfinite(m)]
    if finite.size == 0:
        return None, None
    lo = float(finite.min()) if zmin is None else zmin
    hi = float(finite.max()) if zmax is None else zmax
    return (lo, hi) if hi > lo else (lo, lo + 1e-12)


def _outline_shape(x0: float, y0: float, x1: float, y1: float, **kw) -> dict:
    return {"type": "rect", "x0": x0, "y0": y0, "x1": x1, "y1": y1, "line": {"color": HIGHLIGHT, "width": 3},
            "fillcolor": "rgba(0,0,0,0)", **kw}


def patch_map_fig(m: np.ndarray, *, title: str, colorbar_title: str, patch: tuple[int, int] | None = None,
                  colorscale: str = BIAS_SCALE, zmin: float | None = None, zmax: float | None = None) -> go.Figure:
    """`m: (H, W)` on the patch grid; `patch` outlined."""
    zmin, zmax = _bounds(m, zmin, zmax)
    heat = {"type": "heatmap", "z": np.asarray(m), "colorscale": scale_stops(colorscale),
            "colorbar": {"title": {"text": colorbar_title}},
            "hovertemplate": "patch (%{y}, %{x})<br>value %{z:.4g}<extra></extra>"}
    if zmin is not None:
        heat["zmin"] = zmin
    if zmax is not None:
        heat["zmax"] = zmax
    axis = {"showgrid": False, "zeroline": False, "constrain": "domain"}
    layout = {**_title_layout(title), "xaxis": {**axis, "title": {"text": "column c"}},
              "yaxis": {**axis, "title": {"text": "row r"}, "autorange": "reversed", "scaleanchor": "x",
                        "scaleratio": 1}}
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
            "colorbar": {"title": {"text": colorbar_title}},
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
    layout = {**_title_layout(title), "shapes": shapes, "xaxis": {**axis, "range": [0, w_px]},
              "yaxis": {**axis, "range": [h_px, 0], "scaleanchor": "x", "scaleratio": 1}}
    image = {"type": "image", "source": png_data_uri(image_rgb), "x0": 0.5, "y0": 0.5, "hoverinfo": "skip"}
    return _fast([image, heat], layout)                                                  # image edges at 0


LAYERS_MAX_COLS = 3


def _dtick(n: int) -> int:
    """A tick every `_dtick(n)` patches: four or five ticks along a side of `n` patches."""
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
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=labels, horizontal_spacing=0.06,
                        vertical_spacing=gap_px / plot_px if rows > 1 else 0)
    for i in range(L):
        r, c = divmod(i, cols)
        at = dict(row=r + 1, col=c + 1)
        fig.add_trace(go.Heatmap(
            z=maps[i], colorscale=scale_stops(colorscale), zmin=zmin, zmax=zmax, showscale=i == L - 1,
            colorbar=dict(title=dict(text=colorbar_title), len=1, y=0.5, yanchor="middle"),
            hovertemplate=f"{labels[i]}<br>patch (%{{y}}, %{{x}})<br>value %{{z:.4g}}<extra></extra>"), **at)
        _grid_axes(fig, **at)
        fig.update_xaxes(showticklabels=True, ticks="outside", ticklen=3, dtick=_dtick(W), tick0=0,
                         tickfont_size=10, scaleanchor=f"y{'' if i == 0 else i + 1}", **at)
        fig.update_yaxes(showticklabels=True, ticks="outside", ticklen=3, dtick=_dtick(H), tick0=0,
                         tickfont_size=10, **at)
        if patch is not None:
            _outline(fig, patch[1] - 0.5, patch[0] - 0.5, patch[1] + 0.5, patch[0] + 0.5, **at)
    _title(fig, title, subplot_titles=True, l=30, b=24)
    fig.update_layout(height=fig.layout.margin.t + plot_px + fig.layout.margin.b)
    return fig


def pair_fig(left: np.ndarray, right: np.ndarray, *, titles: tuple[str, str], colorbar_titles: tuple[str, str],
             colorscales: tuple[str, str] = (BIAS_SCALE, ATTENTION_SCALE),
             ranges: tuple[tuple[float | None, float | None], tuple[float | None, float | None]] = ((0, 1), (0, None)),
             patch: tuple[int, int] | None = None, title: str = "") -> go.Figure:
    """Two `(H, W)` maps side by side, each with its own colour scale and colourbar (the
    compare page: an encoding's positional component and the attention row)."""
    spacing = 0.3
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=spacing)
    for i, (m, cbt, cs, (lo, hi)) in enumerate(zip((left, right), colorbar_titles, colorscales, ranges)):
        lo, hi = _bounds(m, lo, hi)
        fig.add_trace(go.Heatmap(
            z=m, colorscale=scale_stops(cs), zmin=lo, zmax=hi,
            colorbar=dict(title=dict(text=cbt), x=(1 - spacing) / 2 + 0.02 if i == 0 else 1.02, xanchor="left",
                          len=0.9, thickness=12),
            hovertemplate="patch (%{y}, %{x})<br>value %{z:.4g}<extra></extra>"), row=1, col=i + 1)
        _grid_axes(fig, row=1, col=i + 1)
        fig.update_xaxes(showticklabels=False, scaleanchor="y" if i == 0 else "y2", row=1, col=i + 1)
        fig.update_yaxes(showticklabels=False, row=1, col=i + 1)
        if patch is not None:
            _outline(fig, patch[1] - 0.5, patch[0] - 0.5, patch[1] + 0.5, patch[0] + 0.5, row=1, col=i + 1)
    _title(fig, title, subplot_titles=True, r=60)
    fig.update_layout(height=260 + fig.layout.margin.t)
    return fig


def curves_fig(curves: Mapping[str, Sequence[float]], *, title: str = "Training curves") -> go.Figure:
    """`curves`: `epoch` plus any of `train_loss`, `test_loss` (left) and `train_acc`,
    `test_top1`, `test_top5` (right, percent), as recorded by `vitpe_core.train`."""
    epochs = list(curves.get("epoch") or range(1, 1 + max((len(v) for v in curves.values()), default=0)))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss", "accuracy (%)"))
    for col, keys in ((1, ("train_loss", "test_loss")), (2, ("train_acc", "test_top1", "test_top5"))):
        for key in keys:
            values = curves.get(key)
            if values:
                fig.add_trace(go.Scatter(x=epochs[:len(values)], y=list(values), mode="lines+markers", name=key),
                              row=1, col=col)
    fig.update_xaxes(title="epoch")
    _title(fig, title, subplot_titles=True, b=40)
    fig.update_layout(legend=dict(orientation="h", y=-0.2))
    return fig


def topk_fig(probs: np.ndarray, class_names: Sequence[str], *, k: int = 5,
             title: str = "Prediction: top-5 probabilities") -> go.Figure:
    """Horizontal bars of the `k` most probable classes, the most probable on top."""
    probs = np.asarray(probs, dtype=np.float64)
    top = np.argsort(-probs)[:k]
    names = [class_names[i] if i < len(class_names) else f"class {i}" for i in top]
    bar = {"type": "bar", "x": probs[top][::-1] * 100, "y": names[::-1], "orientation": "h",
           "text": [f"{p * 100:.1f}%" for p in probs[top][::-1]], "textposition": "auto",
           "hovertemplate": "%{y}: %{x:.2f}%<extra></extra>"}
    layout = _title_layout(title)
    layout.update(xaxis={"title": {"text": "probability (%)"}, "range": [0, 100]}, height=200 + layout["margin"]["t"])
    return _fast([bar], layout)


def line_fig(x: Sequence[float], series: Mapping[str, Sequence[float]], *, title: str, x_title: str,
             y_title: str) -> go.Figure:
    fig = go.Figure([go.Scatter(x=list(x), y=list(v), mode="lines+markers", name=k) for k, v in series.items()])
    _title(fig, title, b=40)
    fig.update_layout(xaxis_title=x_title, yaxis_title=y_title, height=260 + fig.layout.margin.t,
                      legend=dict(orientation="h", y=-0.25, yanchor="top"))
    return fig


def runs_fig(runs: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str, x_title: str,
             y_title: str, colors: Mapping[str, str] | None = None) -> go.Figure:
    """One line per run, each with its own x (runs may record different epochs), coloured by
    `colors` (name -> colour; default `checkpoint_colors` of the runs shown: pass the one map of
    every checkpoint so that a name has the same colour in every chart)."""
    colors = colors if colors is not None else checkpoint_colors(list(runs))
    fig = go.Figure([go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=name,
                                line=dict(color=colors.get(name)), marker=dict(color=colors.get(name)))
                     for name, (x, y) in runs.items()])
    _title(fig, title, b=40)
    fig.update_layout(xaxis_title=x_title, yaxis_title=y_title, height=340 + fig.layout.margin.t,
                      hovermode="x unified", legend=dict(orientation="h", y=-0.2, yanchor="top"))
    return fig


# ----------------------------------------------------------------------------- raster images (for clicking)
def display_image(img: Image.Image, size: tuple[int, int], *, max_side: int = 320) -> np.ndarray:
    """The image as the model sees it (centre-cropped to the aspect of `size` = (H_img,
    W_img), like `images.prepare_for_model`), scaled so its longer side is `max_side`:
    small images are enlarged with nearest-neighbour (their pixels stay visible), large
    ones are resampled from the original. `(h_px, w_px, 3)` uint8."""
    from PIL import ImageOps

    h, w = size
    scale = max_side / max(h, w)
    out = (max(1, round(w * scale)), max(1, round(h * scale)))          # (width, height)
    img = img.convert("RGB")
    if img.width >= out[0] and img.height >= out[1]:
        return np.asarray(ImageOps.fit(img, out, method=Image.LANCZOS))
    small = ImageOps.fit(img, (w, h), method=Image.BICUBIC)
    return np.asarray(small.resize(out, Image.NEAREST))


def grid_image(image_rgb: np.ndarray, grid: Grid, patch: tuple[int, int] | None = None) -> Image.Image:
    """`image_rgb` with the patch grid drawn in white and `patch` outlined (for clicking)."""
    from PIL import ImageDraw

    img = Image.fromarray(np.asarray(image_rgb, dtype=np.uint8)).convert("RGB")
    H, W = grid
    ph, pw = img.height / H, img.width / W
    draw = ImageDraw.Draw(img)
    for r in range(1, H):
        draw.line([(0, round(r * ph)), (img.width, round(r * ph))], fill=(255, 255, 255), width=1)
    for c in range(1, W):
        draw.line([(round(c * pw), 0), (round(c * pw), img.height)], fill=(255, 255, 255), width=1)
    if patch is not None:
        r, c = patch
        draw.rectangle([round(c * pw), round(r * ph), round((c + 1) * pw) - 1, round((r + 1) * ph) - 1],
                       outline=HIGHLIGHT, width=3)
    return img


def pixel_to_patch(x: float, y: float, width: float, height: float, grid: Grid) -> tuple[int, int]:
    """A click at `(x, y)` on an image displayed `width x height` -> patch `(r, c)`."""
    H, W = grid
    r = int(y / max(height, 1e-9) * H)
    c = int(x / max(width, 1e-9) * W)
    return (min(max(r, 0), H - 1), min(max(c, 0), W - 1))


def _lut(colorscale: str, n: int = 256) -> np.ndarray:
    from plotly.colors import get_colorscale, sample_colorscale, unlabel_rgb

    cols = sample_colorscale(get_colorscale(colorscale), list(np.linspace(0, 1, n)), colortype="rgb")
    return np.array([unlabel_rgb(c) for c in cols], dtype=np.float64).round().astype(np.uint8)  # (n, 3)


def figure7_image(sim_grid: np.ndarray, *, patch: tuple[int, int] | None = None, cell_px: int | None = None,
                  zmin: float = -1.0, zmax: float = 1.0) -> Image.Image:
    """The Figure-7 canvas as an RGB image (Viridis, white separators), `cell_px` pixels per
    cell, the tile of `patch` outlined: the clickable version of `figure7_grid_fig`."""
    from PIL import ImageDraw

    H, W = sim_grid.shape[:2]
    z = figure7_canvas(sim_grid)                                          # (H(H+1)-1, W(W+1)-1)
    cell_px = cell_px or max(2, 480 // max(z.shape))
    lut = _lut(SIMILARITY_SCALE)
    idx = np.clip((np.nan_to_num(z) - zmin) / (zmax - zmin), 0, 1) * (len(lut) - 1)
    rgb = lut[idx.round().astype(int)]                                    # (rows, cols, 3)
    rgb[np.isnan(z)] = 255
    rgb = rgb.repeat(cell_px, 0).repeat(cell_px, 1)
    img = Image.fromarray(rgb)
    if patch is not None:
        r, c = patch
        x0, y0 = c * (W + 1) * cell_px, r * (H + 1) * cell_px
        ImageDraw.Draw(img).rectangle([x0 - 1, y0 - 1, x0 + W * cell_px, y0 + H * cell_px],
                                      outline=HIGHLIGHT, width=2)
    return img


def figure7_pixel_to_patch(x: float, y: float, width: float, height: float, grid: Grid) -> tuple[int, int]:
    """A click on `figure7_image` shown `width x height` -> the tile's patch `(r, c)` (a click
    on a separator counts for the tile before it)."""
    H, W = grid
    rows, cols = H * (H + 1) - 1, W * (W + 1) - 1
    i = int(y / max(height, 1e-9) * rows)
    j = int(x / max(width, 1e-9) * cols)
    return (min(max(i // (H + 1), 0), H - 1), min(max(j // (W + 1), 0), W - 1))


# ----------------------------------------------------------------------------- how position is encoded
KERNEL_SCALE = "RdBu_r"


def _small_multiples(titles: Sequence[str], cols: int) -> tuple[go.Figure, int]:
    """A grid of `cols` small panels per row, one per title; returns the figure and its rows."""
    rows = max(1, math.ceil(len(titles) / cols))
    return make_subplots(rows=rows, cols=cols, subplot_titles=list(titles), horizontal_spacing=0.03,
                         vertical_spacing=0.12 / rows), rows


def _finish_small_multiples(fig: go.Figure, rows: int, title: str) -> go.Figure:
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, scaleanchor="x", scaleratio=1)
    _title(fig, title, subplot_titles=True)
    fig.update_layout(height=rows * 190 + fig.layout.margin.t + 10)
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
    fig, rows = _small_multiples([f"{n} · rel {scores[n]:.2f}" if scores.get(n) is not None else n for n in names],
                                 cols)
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


def distance_by_depth_fig(distances: Mapping[str, np.ndarray], *, title: str,
                          colors: Mapping[str, str] | None = None, y_title: str = "mean attention distance (patches)"
                          ) -> go.Figure:
    """The ViT paper's Figure 7 (right): per checkpoint, every head's statistic `(L, h)` as dots
    at its layer, and the mean over heads as a line; several checkpoints overlaid."""
    colors = colors if colors is not None else checkpoint_colors(list(distances))
    fig = go.Figure()
    for name, d in distances.items():
        d = np.asarray(d, dtype=float)
        L, h = d.shape
        color = colors.get(name)
        fig.add_trace(go.Scatter(x=np.repeat(np.arange(L), h) + np.tile(np.linspace(-0.15, 0.15, h), L),
                                 y=d.ravel(), mode="markers", marker=dict(color=color, size=5, opacity=0.6),
                                 name=name, legendgroup=name, showlegend=False,
                                 hovertemplate="layer %{x:.0f}: %{y:.2f}<extra>" + name + "</extra>"))
        fig.add_trace(go.Scatter(x=np.arange(L), y=d.mean(1), mode="lines", line=dict(color=color), name=name,
                                 legendgroup=name))
    _title(fig, title, b=40)
    fig.update_layout(xaxis_title="layer (depth)", yaxis_title=y_title, height=340 + fig.layout.margin.t,
                      legend=dict(orientation="h", y=-0.2, yanchor="top"))
    return fig


def query_kernels_fig(maps: Mapping[str, np.ndarray], patches: Mapping[str, tuple[int, int]],
                      scores: Mapping[str, float | None], *, title: str, cols: int = 5) -> go.Figure:
    """Per-query position-only kernels side by side: name -> `(H, W)` logits of the query patch
    `patches[name]` (outlined) to every key, on each checkpoint's own grid, each on its own
    symmetric colour range around its mean (set by the keys other than the query itself, as in
    `kernels_fig`), titled with `scores[name]` (how much of this row the offset kernel explains)."""
    names = list(maps)
    fig, rows = _small_multiples([f"{n} · fit {scores[n]:.2f}" if scores.get(n) is not None else n for n in names],
                                 cols)
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


# ----------------------------------------------------------------------------- emergence as a film
def figure7_film_fig(grids: Mapping[int, np.ndarray], *, title: str, frame_ms: int = 500) -> go.Figure:
    """The ViT paper's Figure 7 over training: epoch -> `(H, W, H, W)` similarity grid, one
    animation frame per epoch (named by it), a play / pause button and an epoch slider; the
    figure opens on the first epoch, drawn as `figure7_grid_fig` draws it."""
    epochs = list(grids)
    if not epochs:
        raise ValueError("a film needs at least one recorded epoch")
    fig = figure7_grid_fig(grids[epochs[0]], title=title)
    fig.frames = [go.Frame(data=[go.Heatmap(z=figure7_canvas(grids[e]))], traces=[0], name=str(e)) for e in epochs]
    step = dict(mode="immediate", frame=dict(duration=frame_ms, redraw=True), transition=dict(duration=0))
    fig.update_layout(
        updatemenus=[dict(type="buttons", direction="left", x=0, xanchor="left", y=0, yanchor="top",
                          pad=dict(t=34), showactive=False,
                          buttons=[dict(label="▶ play", method="animate", args=[None, {**step, "fromcurrent": True}]),
                                   dict(label="❚❚ pause", method="animate",
                                        args=[[None], dict(mode="immediate", frame=dict(duration=0, redraw=False))])])],
        sliders=[dict(active=0, x=0.22, len=0.78, y=0, yanchor="top", pad=dict(t=30),   # below the x title
                      currentvalue=dict(prefix="epoch ", font=dict(size=12)),
                      steps=[dict(label=str(e), method="animate", args=[[str(e)], step]) for e in epochs])],
        height=580, margin={**fig.layout.margin.to_plotly_json(), "b": 110})
    return fig


FILM_LABEL_PX = 22


def _exact_palette(rgb: np.ndarray) -> Image.Image:
    """`(h, w, 3)` uint8 -> a "P" image with exactly its colours when it has at most 256 (a
    Figure-7 frame: the colour scale's levels, white and black), else Pillow's quantisation."""
    colors, idx = np.unique(rgb.reshape(-1, 3), axis=0, return_inverse=True)
    if len(colors) > 256:
        return Image.fromarray(rgb).quantize(256)
    img = Image.fromarray(idx.reshape(rgb.shape[:2]).astype(np.uint8), mode="P")
    img.putpalette(colors.astype(np.uint8).ravel().tolist())
    return img


def figure7_gif(grids: Mapping[int, np.ndarray], *, cell_px: int | None = None, frame_ms: int = 500) -> bytes:
    """An animated GIF (looping) of the Figure-7 grid over training: epoch -> `(H, W, H, W)`,
    one frame per epoch, each `figure7_image` of that epoch (no patch outlined) below a white
    band of `FILM_LABEL_PX` pixels saying the epoch. Rendered from the arrays with Pillow (no
    browser); the colours are exact (`_exact_palette`)."""
    from PIL import ImageDraw, ImageFont

    if not grids:
        raise ValueError("a film needs at least one recorded epoch")
    font = ImageFont.load_default(size=14)
    frames = []
    for epoch, sim_grid in grids.items():
        tile = np.asarray(figure7_image(sim_grid, cell_px=cell_px))                # (h, w, 3)
        img = Image.new("RGB", (tile.shape[1], tile.shape[0] + FILM_LABEL_PX), (255, 255, 255))
        img.paste(Image.fromarray(tile), (0, FILM_LABEL_PX))
        draw = ImageDraw.Draw(img)
        draw.fontmode = "1"                                     # no anti-aliasing: black and white only
        draw.text((4, 3), f"epoch {epoch}", fill=(0, 0, 0), font=font)
        frames.append(_exact_palette(np.asarray(img)))
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=frame_ms, loop=0,
                   disposal=1, optimize=False)
    return buf.getvalue()


# ----------------------------------------------------------------------------- encoding scale in training
def encoding_scale_fig(series: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]], *,
                       title: str) -> go.Figure:
    """`views.encoding_scale_series`: quantity -> layer -> (epochs, values); one panel per
    quantity, one line per layer (a layer keeps its colour in every panel)."""
    names = list(series)
    layers = sorted({lay for s in series.values() for lay in s}, key=lambda s: int(s[1:]) if s[1:].isdigit() else 0)
    colors = {lay: CHECKPOINT_PALETTE[i % len(CHECKPOINT_PALETTE)] for i, lay in enumerate(layers)}
    fig = make_subplots(rows=1, cols=max(1, len(names)), subplot_titles=names, horizontal_spacing=0.08)
    for col, name in enumerate(names, start=1):
        for lay, (x, y) in series[name].items():
            fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=f"layer {lay[1:]}",
                                     legendgroup=lay, showlegend=col == 1, line=dict(color=colors[lay]),
                                     marker=dict(color=colors[lay], size=4),
                                     hovertemplate=f"layer {lay[1:]}, epoch %{{x}}: %{{y:.4g}}<extra>{name}</extra>"),
                          row=1, col=col)
    fig.update_xaxes(title="epoch")
    _title(fig, title, subplot_titles=True, b=40)
    fig.update_layout(height=320 + fig.layout.margin.t, legend=dict(orientation="h", y=-0.25, yanchor="top"))
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
    spacing = 0.12
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=spacing)
    both = np.concatenate([np.ravel(expected), np.ravel(new)])
    lo, hi = _bounds(both, None, None) if np.isfinite(both).any() else (None, None)
    span = float(np.nanmax(np.abs(diff))) if np.isfinite(diff).any() else 0.0
    span = span if span > 0 else 1e-12
    width = (1 - 2 * spacing) / 3
    for i, (m, cs, (zlo, zhi)) in enumerate(zip((expected, new, diff), (colorscale, colorscale, DIFF_SCALE),
                                                ((lo, hi), (lo, hi), (-span, span)))):
        bar = None if i == 0 else dict(title=dict(text=colorbar_title if i == 1 else "difference"), len=0.9,
                                       thickness=10, x=(2 * width + spacing + 0.01) if i == 1 else 1.01,
                                       xanchor="left")
        fig.add_trace(go.Heatmap(z=m, colorscale=scale_stops(cs), zmin=zlo, zmax=zhi, showscale=bar is not None,
                                 colorbar=bar, hoverongaps=False,
                                 hovertemplate="patch (%{y}, %{x})<br>value %{z:.4g}<extra></extra>"),
                      row=1, col=i + 1)
        _grid_axes(fig, row=1, col=i + 1)
        fig.update_xaxes(showticklabels=False, scaleanchor="y" if i == 0 else f"y{i + 1}", row=1, col=i + 1)
        fig.update_yaxes(showticklabels=False, row=1, col=i + 1)
        if patch is not None:
            _outline(fig, patch[1] - 0.5, patch[0] - 0.5, patch[1] + 0.5, patch[0] + 0.5, row=1, col=i + 1)
    _title(fig, title, subplot_titles=True, r=60)
    fig.update_layout(height=240 + fig.layout.margin.t, plot_bgcolor="#eeeeee")
    return fig
