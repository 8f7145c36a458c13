"""Emergence as a film: the ViT paper's Figure 7 over training, one frame per recorded epoch.

* `figure7_film_fig`: a Plotly animation with a play / pause button and an epoch slider.
* `figure7_gif`: an animated GIF of `raster.figure7_image` frames, rendered with Pillow (no
  browser), each below a band of `FILM_LABEL_PX` pixels saying the epoch.
"""
from __future__ import annotations

import io
from typing import Mapping

import numpy as np
import plotly.graph_objects as go
from PIL import Image

from .maps import figure7_canvas, figure7_grid_fig
from .raster import figure7_image


FILM_PX = 400              # the film's canvas, its longer side
FILM_CONTROLS_PX = 110     # below it: the x title, the play button and the slider


def figure7_film_fig(grids: Mapping[int, np.ndarray], *, title: str, frame_ms: int = 500) -> go.Figure:
    """The ViT paper's Figure 7 over training: epoch -> `(H, W, H, W)` similarity grid, one
    animation frame per epoch (named by it), a play / pause button and an epoch slider; the
    figure opens on the first epoch, drawn as `figure7_grid_fig` draws it."""
    epochs = list(grids)
    if not epochs:
        raise ValueError("a film needs at least one recorded epoch")
    fig = figure7_grid_fig(grids[epochs[0]], title=title, plot_px=FILM_PX)
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
        height=fig.layout.height - fig.layout.margin.b + FILM_CONTROLS_PX,
        margin={**fig.layout.margin.to_plotly_json(), "b": FILM_CONTROLS_PX})
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
