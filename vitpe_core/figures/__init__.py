"""Figures for the app: numpy in, Plotly `Figure` (or a PIL image) out, no Streamlit.

Every figure has a title saying what is shown and a labelled colourbar; maps are drawn on the
patch grid with row 0 at the top (row-major patches, docs/encodings.md), and the query patch
is outlined. Titles fit a phone and leave Plotly's modebar its band (`common`).

Modules, by kind (each re-exported here: `figures.patch_map_fig`, `from vitpe_core.figures
import overlay_fig`):
* `common`: colour scales, sizes, `export_config`, `wrap_title`, `checkpoint_colors`,
  `scale_stops`, `component_style`, and the layout helpers every builder uses.
* `maps`: heatmaps on the patch grid — `similarity_matrix_fig`, `figure7_grid_fig`
  (`figure7_canvas`), `patch_map_fig`, `overlay_fig` (`png_data_uri`, `grid_path`),
  `layers_fig`, `pair_fig`, `shift_diff_fig`.
* `kernels`: position-only kernels as small multiples — `kernels_fig`, `query_kernels_fig`; their
  panels' titles: `panel_title`, `short_name`.
* `curves`: line and bar charts — `curves_fig`, `topk_fig`, `line_fig`, `runs_fig`,
  `distance_by_depth_fig`, `encoding_scale_fig`.
* `raster`: PIL images for clicking and the click mapped back — `display_image`, `grid_image`,
  `pixel_to_patch`, `figure7_image`, `figure7_pixel_to_patch`.
* `film`: Figure 7 over training — `figure7_film_fig` (Plotly animation), `figure7_gif`.
* `picker`: the patch picker's figure, an image whose patches are chosen by clicking them —
  `patch_centres`, `picker_spec`, `with_outline` (a Plotly spec as a dict).
* `windows`: Swin's windows — `window_map_fig` (a patch's row over its window, with the block's
  shifted window grid), `window_lines_path`.
* `threadsafe`: `patch_plotly` (`plotly_patched` checks it), applied on import: Plotly's "is pandas
  loaded?" no longer sees a pandas that another thread is still importing (a Streamlit server's
  sessions are threads of one process).
* `resolution`: the input-size sweep (`vitpe_core.resolution`) — `resolution_fig` (what each size
  keeps), `distance_by_size_fig`.

A new builder goes in the module of its kind (or a new one), takes its style from `common`,
and is added to the imports and `__all__` below.
"""
from __future__ import annotations

from .common import (ATTENTION_SCALE, BIAS_SCALE, CHAR_EM, CHECKPOINT_PALETTE, COLORBAR_PX, COLORBAR_THICKNESS_PX,
                     COLORBAR_XPAD_PX, COMPONENT_STYLE, HIGHLIGHT, MAP_PX, MIN_TILE_PX, MODEBAR_PX,
                     MULTILINE_TITLE_LIFT_PX, NARROW_CHART_PX, PAIR_PX, SHIPPED_CHECKPOINTS, SIMILARITY_SCALE,
                     SUBPLOT_FONT_PX, SUBPLOT_LINE_PX, SUBPLOT_TITLES_PX, TITLE_FONT_PX, TITLE_LINE_PX,
                     TITLE_MAX_CHARS, TITLE_PAD_PX, Grid, checkpoint_colors, colorbar, component_style, export_config,
                     scale_stops, wrap_title)
from .common import _fast as _fast   # named in RELIABILITY.md
from .curves import curves_fig, distance_by_depth_fig, encoding_scale_fig, line_fig, runs_fig, topk_fig
from .film import FILM_CONTROLS_PX, FILM_LABEL_PX, FILM_PX, figure7_film_fig, figure7_gif
from .kernels import KERNEL_SCALE, PANEL_TITLE_CHARS, kernels_fig, panel_title, query_kernels_fig, short_name
from .maps import (DIFF_SCALE, LAYERS_MAX_COLS, figure7_canvas, figure7_grid_fig, grid_path, layers_fig, overlay_fig,
                   pair_fig, patch_map_fig, png_data_uri, shift_diff_fig, similarity_matrix_fig)
from .maps import _png_data_uri as _png_data_uri   # its cache is checked by tests/test_figures.py
from .picker import MAX_HEIGHT_PX, patch_centres, picker_spec, with_outline
from .resolution import RESOLUTION_SERIES, distance_by_size_fig, resolution_fig
from .raster import display_image, figure7_image, figure7_pixel_to_patch, grid_image, pixel_to_patch
from .windows import window_lines_path, window_map_fig
from .threadsafe import patch_plotly, plotly_patched

__all__ = [
    # common
    "Grid", "SIMILARITY_SCALE", "BIAS_SCALE", "ATTENTION_SCALE", "HIGHLIGHT", "COMPONENT_STYLE", "TITLE_FONT_PX",
    "SUBPLOT_FONT_PX", "SUBPLOT_LINE_PX", "NARROW_CHART_PX", "CHAR_EM", "TITLE_MAX_CHARS", "TITLE_LINE_PX",
    "MODEBAR_PX", "SUBPLOT_TITLES_PX", "MULTILINE_TITLE_LIFT_PX", "MIN_TILE_PX", "CHECKPOINT_PALETTE",
    "SHIPPED_CHECKPOINTS",
    "TITLE_PAD_PX", "MAP_PX", "PAIR_PX", "COLORBAR_PX", "COLORBAR_XPAD_PX", "COLORBAR_THICKNESS_PX", "colorbar",
    "component_style", "export_config", "wrap_title", "checkpoint_colors", "scale_stops",
    # maps
    "LAYERS_MAX_COLS", "DIFF_SCALE", "similarity_matrix_fig", "figure7_canvas", "figure7_grid_fig", "patch_map_fig",
    "png_data_uri", "grid_path", "overlay_fig", "layers_fig", "pair_fig", "shift_diff_fig",
    # kernels
    "KERNEL_SCALE", "PANEL_TITLE_CHARS", "kernels_fig", "query_kernels_fig", "panel_title", "short_name",
    # curves
    "curves_fig", "topk_fig", "line_fig", "runs_fig", "distance_by_depth_fig", "encoding_scale_fig",
    # raster
    "display_image", "grid_image", "pixel_to_patch", "figure7_image", "figure7_pixel_to_patch",
    # film
    "FILM_LABEL_PX", "FILM_PX", "FILM_CONTROLS_PX", "figure7_film_fig", "figure7_gif",
    # picker
    "MAX_HEIGHT_PX", "patch_centres", "picker_spec", "with_outline",
    # windows
    "window_map_fig", "window_lines_path",
    # resolution
    "RESOLUTION_SERIES", "resolution_fig", "distance_by_size_fig",
    # threadsafe
    "patch_plotly", "plotly_patched",
]

patch_plotly()   # before any figure of this process: see threadsafe
