"""Figures for the app: numpy in, Plotly `Figure` out, no Streamlit.

Every figure has a title saying what is shown and a labelled colourbar; maps are drawn on
the patch grid with row 0 at the top (row-major patches, docs/encodings.md), and the query
patch is outlined. `export_config(name)` is the `config=` for `st.plotly_chart` that makes
the modebar's camera button save a PNG named after the figure.

* `similarity_matrix_fig`: the full `(N, N)` cosine similarity of a position table.
* `figure7_grid_fig`: the ViT paper's Figure 7 — `H x W` small multiples, tile `(r, c)` is
  patch (r, c)'s similarity to every patch; drawn as one heatmap of an
  `(H(H+1)-1, W(W+1)-1)` array with NaN separators (one trace instead of `N` subplots).
* `patch_map_fig`: one `(H, W)` map, large.
* `overlay_fig`: an `(H, W)` map over the image, with the patch grid.
* `layers_fig`: one `(H, W)` map per layer, side by side.
* `pair_fig`: two maps side by side with their own colour scales.
* `curves_fig`, `topk_fig`, `line_fig`: training curves, top-k probabilities, a score per epoch.
* Raster helpers for clicking (PIL images, not Plotly): `display_image`, `grid_image`,
  `figure7_image`, and `pixel_to_patch` / `figure7_pixel_to_patch` to map a click back.
"""
from __future__ import annotations

import base64
import io
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


def export_config(filename: str) -> dict:
    """Plotly config: the modebar camera saves `filename`.png at twice the screen size."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in filename)[:100] or "figure"
    return {"toImageButtonOptions": {"format": "png", "filename": safe, "scale": 2},
            "displaylogo": False}


def _grid_axes(fig: go.Figure, *, row=None, col=None, reversed_y: bool = True) -> None:
    kw = {} if row is None else dict(row=row, col=col)
    fig.update_xaxes(showgrid=False, zeroline=False, constrain="domain", **kw)
    fig.update_yaxes(showgrid=False, zeroline=False, constrain="domain",
                     autorange="reversed" if reversed_y else True, **kw)


def _square(fig: go.Figure) -> None:
    fig.update_yaxes(scaleanchor="x", scaleratio=1)


def scale_stops(colorscale: str) -> list[list]:
    """A named Plotly colour scale as explicit `rgb()` stops. Streamlit's Plotly theme uses the
    hex colours `#000001`-`#0000xx` as placeholders and swaps them for theme colours in the
    browser: Magma's first stop, `#000004`, was drawn pink."""
    from plotly.colors import get_colorscale, hex_to_rgb
    return [[float(v), "rgb({},{},{})".format(*hex_to_rgb(c)) if c.startswith("#") else c]
            for v, c in get_colorscale(colorscale)]


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
    fig.update_layout(title=title, margin=_MARGIN, xaxis_title="patch n = r·W + c",
                      yaxis_title="patch n = r·W + c")
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
    fig.update_layout(title=title, margin=_MARGIN, plot_bgcolor="white")
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


def patch_map_fig(m: np.ndarray, *, title: str, colorbar_title: str, patch: tuple[int, int] | None = None,
                  colorscale: str = BIAS_SCALE, zmin: float | None = None, zmax: float | None = None) -> go.Figure:
    """`m: (H, W)` on the patch grid; `patch` outlined."""
    H, W = m.shape
    zmin, zmax = _bounds(m, zmin, zmax)
    fig = go.Figure(go.Heatmap(
        z=m, colorscale=scale_stops(colorscale), zmin=zmin, zmax=zmax,
        colorbar=dict(title=dict(text=colorbar_title)),
        hovertemplate="patch (%{y}, %{x})<br>value %{z:.4g}<extra></extra>"))
    if patch is not None:
        _outline(fig, patch[1] - 0.5, patch[0] - 0.5, patch[1] + 0.5, patch[0] + 0.5)
    fig.update_layout(title=title, margin=_MARGIN, xaxis_title="column c", yaxis_title="row r")
    _grid_axes(fig)
    _square(fig)
    return fig


def png_data_uri(image_rgb: np.ndarray) -> str:
    bio = io.BytesIO()
    Image.fromarray(np.asarray(image_rgb, dtype=np.uint8)).save(bio, format="PNG")
    return "data:image/png;base64," + base64.b64encode(bio.getvalue()).decode("ascii")


def overlay_fig(image_rgb: np.ndarray, m: np.ndarray, grid: Grid, *, patch: tuple[int, int] | None = None,
                title: str = "", colorbar_title: str = "", colorscale: str = BIAS_SCALE,
                opacity: float = 0.6, zmin: float | None = 0.0, zmax: float | None = 1.0) -> go.Figure:
    """`image_rgb: (h_px, w_px, 3)` uint8 (the image as the model sees it, any upscaling),
    `m: (H, W)` drawn semi-transparent over it, with the patch grid and `patch` outlined."""
    h_px, w_px = image_rgb.shape[:2]
    H, W = grid
    assert m.shape == (H, W), (m.shape, grid)
    ph, pw = h_px / H, w_px / W
    zmin, zmax = _bounds(m, zmin, zmax)
    fig = go.Figure(go.Image(source=png_data_uri(image_rgb), x0=0.5, y0=0.5, hoverinfo="skip"))  # edges at 0
    fig.add_trace(go.Heatmap(
        z=m, x0=pw / 2, dx=pw, y0=ph / 2, dy=ph, colorscale=scale_stops(colorscale), zmin=zmin, zmax=zmax,
        opacity=opacity, colorbar=dict(title=dict(text=colorbar_title)),
        customdata=np.stack(np.meshgrid(np.arange(H), np.arange(W), indexing="ij"), -1),
        hovertemplate="patch (%{customdata[0]}, %{customdata[1]})<br>value %{z:.4g}<extra></extra>"))
    for r in range(1, H):
        fig.add_shape(type="line", x0=0, x1=w_px, y0=r * ph, y1=r * ph, line=dict(color="white", width=1))
    for c in range(1, W):
        fig.add_shape(type="line", y0=0, y1=h_px, x0=c * pw, x1=c * pw, line=dict(color="white", width=1))
    if patch is not None:
        _outline(fig, patch[1] * pw, patch[0] * ph, (patch[1] + 1) * pw, (patch[0] + 1) * ph)
    fig.update_layout(title=title, margin=_MARGIN)
    fig.update_xaxes(showticklabels=False, showgrid=False, zeroline=False, range=[0, w_px], constrain="domain")
    fig.update_yaxes(showticklabels=False, showgrid=False, zeroline=False, range=[h_px, 0], constrain="domain")
    _square(fig)
    return fig


def layers_fig(maps: np.ndarray, *, title: str, colorbar_title: str, patch: tuple[int, int] | None = None,
               colorscale: str = BIAS_SCALE, zmin: float | None = 0.0, zmax: float | None = 1.0,
               labels: Sequence[str] | None = None) -> go.Figure:
    """`maps: (L, H, W)`, one small heatmap per layer, one shared colour scale."""
    L, H, W = maps.shape
    zmin, zmax = _bounds(maps, zmin, zmax)   # one range for all layers
    labels = list(labels) if labels is not None else [f"layer {i}" for i in range(L)]
    fig = make_subplots(rows=1, cols=L, subplot_titles=labels, horizontal_spacing=0.02)
    for i in range(L):
        fig.add_trace(go.Heatmap(
            z=maps[i], colorscale=scale_stops(colorscale), zmin=zmin, zmax=zmax, showscale=i == L - 1,
            colorbar=dict(title=dict(text=colorbar_title)),
            hovertemplate=f"{labels[i]}<br>patch (%{{y}}, %{{x}})<br>value %{{z:.4g}}<extra></extra>"),
            row=1, col=i + 1)
        _grid_axes(fig, row=1, col=i + 1)
        fig.update_xaxes(showticklabels=False, scaleanchor=f"y{'' if i == 0 else i + 1}", row=1, col=i + 1)
        fig.update_yaxes(showticklabels=False, row=1, col=i + 1)
        if patch is not None:
            _outline(fig, patch[1] - 0.5, patch[0] - 0.5, patch[1] + 0.5, patch[0] + 0.5, row=1, col=i + 1)
    fig.update_layout(title=title, margin=_MARGIN, height=max(220, 900 // max(L, 1) + 80))
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
    fig.update_layout(title=title, margin=dict(_MARGIN, r=60), height=320)
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
    fig.update_layout(title=title, margin=_MARGIN, legend=dict(orientation="h", y=-0.2))
    return fig


def topk_fig(probs: np.ndarray, class_names: Sequence[str], *, k: int = 5,
             title: str = "Prediction: top-5 probabilities") -> go.Figure:
    """Horizontal bars of the `k` most probable classes, the most probable on top."""
    probs = np.asarray(probs, dtype=np.float64)
    top = np.argsort(-probs)[:k]
    names = [class_names[i] if i < len(class_names) else f"class {i}" for i in top]
    fig = go.Figure(go.Bar(x=probs[top][::-1] * 100, y=names[::-1], orientation="h",
                           text=[f"{p * 100:.1f}%" for p in probs[top][::-1]], textposition="auto",
                           hovertemplate="%{y}: %{x:.2f}%<extra></extra>"))
    fig.update_layout(title=title, margin=_MARGIN, xaxis_title="probability (%)", xaxis_range=[0, 100],
                      height=260)
    return fig


def line_fig(x: Sequence[float], series: Mapping[str, Sequence[float]], *, title: str, x_title: str,
             y_title: str) -> go.Figure:
    fig = go.Figure([go.Scatter(x=list(x), y=list(v), mode="lines+markers", name=k) for k, v in series.items()])
    fig.update_layout(title=title, margin=_MARGIN, xaxis_title=x_title, yaxis_title=y_title, height=300)
    return fig


def runs_fig(runs: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str, x_title: str,
             y_title: str) -> go.Figure:
    """One line per run, each with its own x (runs may record different epochs)."""
    fig = go.Figure([go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=name)
                     for name, (x, y) in runs.items()])
    fig.update_layout(title=title, margin=_MARGIN, xaxis_title=x_title, yaxis_title=y_title, height=380,
                      hovermode="x unified")
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
