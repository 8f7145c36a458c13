"""What every figure shares: colour scales, sizes, titles that fit a phone, export settings.

Maps are drawn on the patch grid with row 0 at the top (row-major patches, docs/encodings.md)
and the query patch is outlined in `HIGHLIGHT`. Titles fit a phone: `wrap_title` breaks them
into lines of at most `TITLE_MAX_CHARS` characters (a chart `NARROW_CHART_PX` wide at
`TITLE_FONT_PX`), and `_title` / `_title_layout` put them below a band left free for Plotly's
modebar (`MODEBAR_PX`), so neither is cut off nor covered.

* `export_config(name)`: the `config=` for `st.plotly_chart` whose camera button saves a PNG
  named after the figure.
* `wrap_title`, `checkpoint_colors` (one colour per checkpoint name everywhere),
  `scale_stops` (a colour scale as explicit `rgb()` stops), `component_style` (how the compare
  page draws a positional component).
* For the builders: `_title`, `_title_layout`, `_fast` (a Figure from plain dicts, unvalidated),
  `_grid_axes`, `_square`, `_outline` / `_outline_shape` (the query patch's frame), `_bounds`
  (complete a half-given colour range).
"""
from __future__ import annotations

import functools
import re
from typing import Sequence

import numpy as np
import plotly.graph_objects as go

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
