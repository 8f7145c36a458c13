"""Raster images for clicking (PIL / numpy, not Plotly), and clicks on them mapped back.

* `display_image`: the image as the model sees it, scaled for display.
* `grid_image`: an image with the patch grid drawn and a patch outlined.
* `pixel_to_patch`: a click on such an image -> patch `(r, c)`.
* `figure7_image`: the Figure-7 canvas (`maps.figure7_canvas`) as an RGB image, the clickable
  version of `maps.figure7_grid_fig`.
* `figure7_pixel_to_patch`: a click on `figure7_image` -> the tile's patch `(r, c)`.
"""
from __future__ import annotations

import numpy as np
from PIL import Image

from .common import HIGHLIGHT, SIMILARITY_SCALE, Grid
from .maps import figure7_canvas


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
