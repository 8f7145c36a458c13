"""The patch picker: an image whose patches are chosen by clicking them.

`clickable` draws the figure of `vitpe_core.figures.picker` (the image, one invisible marker per
patch centre; a click anywhere in a patch selects it) as a Plotly chart with a selection event,
no iframe, and sets the view's `patch` to the clicked one (`TOUCH_HOVER` makes a tap on a touch
screen select the tapped patch, not the one tapped before it). `patch_picker` shows an image as a
checkpoint's model sees it, with its patch grid, the selected patch outlined, and the row /
column inputs below (the keyboard's way).
"""
from __future__ import annotations

import io

import numpy as np
import streamlit as st
from PIL import Image

from vitpe_core import figures
from vitpe_core.figures.picker import ToPatch, patch_centres, picker_spec, with_outline

from . import cache, report_button
from .prediction import prediction_or_features
from .widgets import patch_controls, patch_text


# Plotly selects "the clicked point" from its last hover (`gd._hoverdata`): on a touch screen
# nothing hovers before a tap, so a tap selected the point of the tap before it (the first tap:
# none; its click event, which computes the hover afresh, came after the selection). This
# script, run once per browser page, hovers the plot at the touch point when a touch starts on a
# Plotly chart's plot area (a mouse-move there, as a mouse would have made), before Plotly's own
# touch handler: the tap then selects the tapped point. The container it is drawn in is hidden
# (no gap in the layout).
TOUCH_HOVER = """<style>.st-key-{key} {{ display: none; }}</style>
<script>
(() => {{
  if (window.vitpeTouchHover) return;
  window.vitpeTouchHover = true;
  document.addEventListener("touchstart", (e) => {{
    const el = e.target, t = e.touches.length === 1 ? e.touches[0] : null;
    if (!t || !(el instanceof Element) || !el.matches(".stPlotlyChart .nsewdrag")) return;
    el.dispatchEvent(new MouseEvent("mousemove", {{bubbles: true, cancelable: true, view: window,
                                                  clientX: t.clientX, clientY: t.clientY}}));
  }}, {{capture: true, passive: true}});
}})();
</script>"""


def touch_hover(key: str) -> None:
    """`TOUCH_HOVER` in a hidden container with key `key` (the script installs its listener once
    per browser page, however many pickers draw it)."""
    with st.container(key=key):
        st.html(TOUCH_HOVER.format(key=key), unsafe_allow_javascript=True)


@cache.budgeted("picker figures", max_items=64)
def _picker_spec(png: bytes, w: int, h: int, cols: dict[int, float], rows: dict[int, float]) -> dict:
    """`picker_spec`, built once per picture (the selected patch is added per run)."""
    return picker_spec(png, w, h, cols, rows)


@cache.budgeted("picker images", max_items=32)
def _png_of(mode: str, size: tuple[int, int], raw: bytes) -> bytes:
    buf = io.BytesIO()
    Image.frombytes(mode, size, raw).convert("RGB").save(buf, "PNG", optimize=False, compress_level=1)
    return buf.getvalue()


def _png(img: Image.Image) -> bytes:
    """`img` as PNG; the last 32 images' are remembered by content (a click redraws the picker
    with the same image: encoding it again cost ~20 ms of the server's CPU per click)."""
    return _png_of(img.mode, img.size, img.tobytes())


def clickable(img: Image.Image, key: str, to_patch: ToPatch, *,
              box: tuple[float, float, float, float] | None = None) -> None:
    """An image that sets `session_state["patch"]` where it is clicked: a Plotly chart with one
    invisible marker per patch (selection event, no iframe). `to_patch(x, y, width, height)` maps
    a pixel to its patch; `box` (x0, y0, x1, y1 in pixels) outlines the selected patch."""
    import plotly.graph_objects as go

    w, h = img.size
    cols, rows = patch_centres(to_patch, w, h)
    spec = _picker_spec(_png(img), w, h, cols, rows)
    if box is not None:
        spec = with_outline(spec, box)
    valid = {(r, c) for r in rows for c in cols}

    def clicked() -> None:
        points = ((st.session_state.get(key) or {}).get("selection") or {}).get("points") or []
        for p in points[:1]:
            rc = p.get("customdata") if isinstance(p, dict) else None
            if isinstance(rc, (list, tuple)) and len(rc) == 2 and tuple(rc) in valid:
                st.session_state["patch"] = (int(rc[0]), int(rc[1]))

    touch_hover(f"{key}_touch")
    st.plotly_chart(go.Figure(spec, _validate=False), key=key, on_select=clicked, selection_mode="points",
                    config={"displayModeBar": False, "scrollZoom": False, "doubleClick": False})


@cache.budgeted("grid pictures", max_items=32)
def _grid_picture(display: np.ndarray, grid: tuple[int, int]) -> Image.Image:
    return figures.grid_image(display, grid)


def patch_picker(page: str, img: Image.Image, ckpt, patch: tuple[int, int], caption: str, *,
                 max_side: int = 320) -> np.ndarray:
    """The image as `ckpt`'s model sees it (its crop, at least 20 px per patch) with its patch
    grid, clickable, plus the keyboard row/column inputs; returns the displayed image
    `(h, w, 3)` for overlays."""
    grid = ckpt.config.grid
    st.caption(caption)
    display = figures.display_image(cache.model_crop(img, ckpt), ckpt.config.img_size,
                                    max_side=max(max_side, 20 * max(grid)))
    H, W = grid
    h_px, w_px = display.shape[:2]
    ph, pw = h_px / H, w_px / W
    clickable(_grid_picture(display, grid), f"{page}_click",
              lambda x, y, w, h: figures.pixel_to_patch(x, y, w, h, grid),
              box=(patch[1] * pw, patch[0] * ph, (patch[1] + 1) * pw, (patch[0] + 1) * ph))
    patch_controls(page, grid)
    patch_text(patch, grid)
    return display


def image_column(page: str, ckpt, view, image: tuple, trace) -> np.ndarray:
    """The bias page's left column, a ViT's and a Swin's: the clickable image (`image`: the page's
    `(img, key, caption)`), the prediction (or the features of a model without a head) and the
    report button; returns the image as displayed (for the maps' overlays)."""
    img, key, caption = image
    grid = ckpt.config.grid
    where = f"grid {grid[0]}×{grid[1]}, as the model sees the image"
    display = patch_picker(page, img, ckpt, view.patch, f"{caption} — click a patch ({where})")
    prediction_or_features(page, ckpt, trace, key)
    report_button.offer(page, view.ckpt, ckpt, (img, key, caption))
    return display
