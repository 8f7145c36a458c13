"""What every figure shares: colour scales, sizes, titles that fit a phone, export settings.

Maps are drawn on the patch grid with row 0 at the top (row-major patches, docs/encodings.md)
and the query patch is outlined in `HIGHLIGHT`. Titles fit a phone: `wrap_title` breaks them
into lines of at most `TITLE_MAX_CHARS` characters (a chart `NARROW_CHART_PX` wide at
`TITLE_FONT_PX`), and `_title` / `_title_layout` put them below a band left free for Plotly's
modebar (`MODEBAR_PX`), so neither is cut off nor covered. A map's figure is as wide as its
maps and colour bars (`_sized_layout`: `MAP_PX`, `PAIR_PX`, `COLORBAR_PX`), not as the page: the
colour bar (`colorbar`) sits at the plot's edge and the title is as wide as the chart.

* `export_config(name)`: the `config=` for `st.plotly_chart` whose camera button saves a PNG
  named after the figure.
* `wrap_title`, `checkpoint_colors` (one colour per checkpoint name everywhere, fixed for the shipped
  names, `SHIPPED_CHECKPOINTS`),
  `scale_stops` (a colour scale as explicit `rgb()` stops), `component_style` (how the compare
  page draws a positional component).
* `colorbar`: a colour bar's settings, beside the plot area.
* For the builders: `_title`, `_title_layout`, `_sized_layout` (a chart sized to its plot area),
  `_fast` (a Figure from plain dicts, unvalidated),
  `_grid_axes`, `_square`, `_outline` / `_outline_shape` (the query patch's frame), `_bounds`
  (complete a half-given colour range).
"""
from __future__ import annotations

import functools
import re
import zlib
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
SUBPLOT_LINE_PX = 16       # each further line of a subplot title (`kernels.panel_title`: a name over its score)
MULTILINE_TITLE_LIFT_PX = 12   # Plotly draws a title of several lines this much higher than its top pad says
MIN_TILE_PX = 160          # the smallest side of a small-multiple tile (layers_fig)
TITLE_PAD_PX = 10          # a title's distance from the chart's left edge
MAP_PX = 340               # the longer side of a single map's plot area (a figure sized to it: `_sized_layout`)
PAIR_PX = 200              # the side of each map of `pair_fig` / `shift_diff_fig`
COLORBAR_PX = 90           # the right margin that holds a colour bar with its ticks and title
COLORBAR_XPAD_PX = 6
COLORBAR_THICKNESS_PX = 14
# One colour per checkpoint (`checkpoint_colors`): qualitative, dark enough on white, no greys; 20 colours, told apart
# by their CIEDE2000 difference (tests/test_figures.py computes it), in three tiers, each chosen to be as far as
# possible from the ones before: the first 10 are the checkpoints the compare page shows at first (`SHIPPED_CHECKPOINTS`
# order, `long/` left out), each pair at least 30 apart; the last 6 are drawn for any other name (an import), each at
# least 19 from those 10 and from each other; the 4 between them are the `long/` runs', each at least 18 from any
# other. (The palette before issue 44 had pairs 13-18 apart: ape's blue beside none's teal, rope_mixed's olive beside
# sape2's gold, an import's dark teal beside none's.)
CHECKPOINT_PALETTE = ("#0f87ff", "#ff1e0f", "#00c300", "#00a5a5", "#0000ff", "#005a00", "#96004b", "#c38700",
                      "#693c0f", "#ff5ac3",
                      "#c300b4", "#a5694b", "#3c875a", "#d24b69",
                      "#5a3c78", "#004b78", "#9669f0", "#788700", "#0f5a5a", "#a5000f")
SHIPPED_CHECKPOINTS = ("ape", "ape2d", "cope+ape", "none", "rope_axial", "rope_mixed", "rpb", "sape2", "sape2+ape",
                       "sincos2d", "long/ape", "long/none", "long/sape2", "long/sape2+ape")


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


def _title_chars(width: float | None) -> int:
    """How many characters a title line may have on a chart `width` px wide (None: one that
    stretches over its column): `TITLE_MAX_CHARS`, fewer on a chart narrower than a phone's."""
    if width is None:
        return TITLE_MAX_CHARS
    return max(12, min(TITLE_MAX_CHARS, int((width - 2 * TITLE_PAD_PX) / (CHAR_EM * TITLE_FONT_PX))))


def _title_layout(title: str, *, subplot_titles: bool = False, width: float | None = None,
                  subplot_title_lines: int = 1, **margin) -> dict:
    """The layout entries `title` and `margin` of `_title`, as plain dicts; `width`: the chart's
    width where the figure sets one (`_sized_layout`), the title then wraps to fit it;
    `subplot_title_lines`: the lines of the tallest subplot title."""
    lines = wrap_title(title, _title_chars(width))
    below = SUBPLOT_TITLES_PX + (subplot_title_lines - 1) * SUBPLOT_LINE_PX if subplot_titles else 0
    pad = MODEBAR_PX + (MULTILINE_TITLE_LIFT_PX if len(lines) > 1 else 0)
    return {"title": {"text": "<br>".join(lines), "x": 0, "xref": "container", "xanchor": "left", "y": 1,
                      "yref": "container", "yanchor": "top", "pad": {"t": pad, "l": TITLE_PAD_PX},
                      "font": {"size": TITLE_FONT_PX}},
            "margin": {**_MARGIN, **margin, "t": pad + TITLE_LINE_PX * len(lines) + below + 8}}


def _sized_layout(title: str, plot_w: float, plot_h: float, *, subplot_titles: bool = False,
                  subplot_title_lines: int = 1, **margin) -> dict:
    """`_title_layout` for a chart whose plot area is `plot_w x plot_h` px, plus the `width` and
    `height` that hold exactly that: maps keep square cells, and a chart as wide as the page
    left them small in its middle, the colour bar far to their right and the title in a narrow
    box at the left. `pages/common/output.chart` draws a figure that sets its width at that
    width (a narrower column or a phone shrinks it, the proportions kept); the title wraps to
    it."""
    m = {**_MARGIN, **margin}
    width = round(m["l"] + plot_w + m["r"])
    layout = _title_layout(title, subplot_titles=subplot_titles, width=width, subplot_title_lines=subplot_title_lines,
                           **margin)
    layout["width"] = width
    layout["height"] = round(layout["margin"]["t"] + plot_h + layout["margin"]["b"])
    return layout


def colorbar(title: str, x: float = 1.0, **kw) -> dict:
    """A colour bar titled `title` beside the plot area (`x`: the paper position of its left
    edge; 1 = just right of the plot, in the right margin `COLORBAR_PX` holds)."""
    return {"title": {"text": title}, "x": x, "xanchor": "left", "xpad": COLORBAR_XPAD_PX,
            "thickness": COLORBAR_THICKNESS_PX, **kw}


def _title(fig: go.Figure, title: str, *, subplot_titles: bool = False, width: float | None = None,
           **margin) -> None:
    """`title` wrapped to fit a phone (`wrap_title`; and a chart `width` px wide, if given), at
    the chart's left edge, its top `MODEBAR_PX` below the chart's top (the modebar's band); the
    top margin holds the band, every line and the subplot titles."""
    fig.update_layout(**_title_layout(title, subplot_titles=subplot_titles, width=width, **margin))   # top-anchored
    if subplot_titles:
        fig.update_annotations(font_size=SUBPLOT_FONT_PX)


def _fast(data: list[dict], layout: dict) -> go.Figure:
    """A Figure from plain dicts without Plotly's per-property validation (a tenth of the time
    of `add_trace` / `update_layout`; what a click on the bias page rebuilds). The dicts must be
    valid: tests/test_figures.py checks them against a validated copy."""
    return go.Figure({"data": data, "layout": layout}, _validate=False)


def _name_hash(name: str) -> int:
    """A hash of `name` that is the same in every process (Python's `hash` of a str is not)."""
    return zlib.crc32(name.encode("utf-8"))


def checkpoint_colors(names: Sequence[str]) -> dict[str, str]:
    """name -> colour, the same for a name whatever else is listed or shown, in every chart and
    in a reopened link (the colours depend on the names alone). A shipped checkpoint
    (`SHIPPED_CHECKPOINTS`) has its own fixed `CHECKPOINT_PALETTE` colour; any other name
    starts at a colour of the remaining six picked by a hash of the name and takes the next
    one free if an earlier name (sorted order) took it, then any palette colour no name here
    uses, so the names passed get distinct colours while there are colours left (20), and
    then the hashed pick. Pass every checkpoint on offer, not only the ones a chart shows:
    a name then keeps its colour however the selection changes."""
    ordered = sorted(set(names))
    out = {n: CHECKPOINT_PALETTE[SHIPPED_CHECKPOINTS.index(n)] for n in ordered if n in SHIPPED_CHECKPOINTS}
    spare = CHECKPOINT_PALETTE[len(SHIPPED_CHECKPOINTS):]
    for name in (n for n in ordered if n not in out):
        used, start = set(out.values()), _name_hash(name)
        rotated = [spare[(start + k) % len(spare)] for k in range(len(spare))]
        free = [c for c in rotated + list(CHECKPOINT_PALETTE) if c not in used]
        out[name] = free[0] if free else CHECKPOINT_PALETTE[start % len(CHECKPOINT_PALETTE)]
    return out


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
