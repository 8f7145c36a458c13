"""The report as one HTML file: `template.html` filled with the sections' text (escaped here),
the report's data as JSON, the page's own `report.js` and `report.css`, and Plotly's JavaScript
once, gzip-compressed and base64-encoded (the page inflates it with the browser's
`DecompressionStream`: 1.9 MB instead of 4.8 MB; Chrome/Edge 80+, Firefox 113+, Safari 16.4+).
Nothing is fetched: the file opens from disk with no network.
"""
from __future__ import annotations

import base64
import functools
import gzip
import html
import re
from importlib.resources import files
from pathlib import Path

from .encode import script_json

_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")


def _resource(name: str) -> str:
    return files(__package__).joinpath(name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def plotly_js_gz_b64() -> str:
    """Plotly's bundled plotly.min.js (the version plotly.py draws with), gzip + base64."""
    from plotly.offline import get_plotlyjs

    return base64.b64encode(gzip.compress(get_plotlyjs().encode("utf-8"), 9, mtime=0)).decode("ascii")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fig(path: str, cls: str = "fig") -> str:
    """A chart's place; report.js draws the spec at `path` (dotted, in the data) into it."""
    return f'<div class="{cls}" data-fig="{_e(path)}"></div>'


def card_html(card: list[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in card)
    return f'<table class="card">{rows}</table>'


def similarity_html(sim: dict | None) -> str:
    if sim is None:
        return ("<p>This model has no absolute position table (its encoding brings in position another way), so "
                "there is no Figure 7 to draw.</p>")
    s = sim["score"]
    text = (f"<p><b>2D-structure score {s['spearman']:.3f}</b> (Spearman correlation of the table's cosine "
            "similarity with minus the spatial distance; 1 = perfectly 2D). Mean similarity of pairs in the same "
            f"row {s['same_row']:.3f}, the same column {s['same_col']:.3f}, neither {s['other']:.3f}, "
            f"4-neighbours {s['neighbour']:.3f}.</p>")
    film = (f"<h3>Over training</h3><p>The table at each of the {sim['film_epochs']} recorded epochs: press ▶ play or "
            f"drag the slider.</p>{_fig('similarity.film')}" if "film" in sim else
            "<p>No training history recorded: no film over the epochs.</p>")
    return text + _fig("similarity.figure7") + film


def position_html(pos: dict) -> str:
    if "kernels" not in pos:
        kernels = "<p>This model has no position information: no position-only kernel.</p>"
    else:
        scores = "".join(f"<td>{v:.3f}</td>" for v in pos["relative_by_layer"].values())
        heads = "".join(f"<th>{_e(k)}</th>" for k in pos["relative_by_layer"])
        kernels = (f"<p>Kind: <b>{_e(pos['kind'])}</b>. The part of the attention logit that depends on the "
                   "positions alone, over the offset (Δr, Δc) from the query (centre = the query itself; blue = "
                   "less, red = more, each map on its own scale). <b>rel</b>: the relative score, the share of the "
                   "kernel's variance the offset alone explains (1 = purely relative).</p>"
                   f"{_fig('position.kernels')}<table class='scores'><tr><th>relative score</th>{heads}</tr>"
                   f"<tr><th>mean of heads</th>{scores}</tr></table>"
                   "<h3>Per query patch</h3><p>The same kernels as one query patch sees them, to every key on the "
                   "grid: the grid's centre and its top-left corner, per layer. <b>fit</b>: the R² of the offset "
                   "fit on this query's row (1 = the shared pattern exactly; below 0 = worse than a flat row).</p>"
                   f"{_fig('position.query_kernels')}")
    sizes = ("<h3>At other input sizes</h3><p>The model at each input size (the gallery images resized; its position "
             "parameters resampled as it does at run time): how often its top-1 stays the native size's, the cosine of "
             "its pooled features to the native ones, the resampled table's 2D structure, the offset-only share of its "
             "position kernel (<code>vitpe_core/resolution.py</code>).</p>" + _fig("position.resolution")
             if "resolution" in pos else "")
    return kernels + "<h3>Attention distance by depth</h3>" + _fig("position.distance") + sizes


def _options(values: list[tuple[str, str]]) -> str:
    return "".join(f'<option value="{_e(v)}">{_e(label)}</option>' for v, label in values)


def explorer_html(ex: dict) -> str:
    images = _options([(str(i), im["label"]) for i, im in enumerate(ex["images"])])
    layers = _options([(str(i), f"layer {i}") for i in range(ex["depth"])])
    parts = _options([(k, v["label"]) for k, v in ex["parts"].items()])
    sources = _options([(s, "the clicked patch" if s == "patch" else s) for s in ex["rollout_sources"]])
    kept = ex["heads_layers"]
    kept_text = ("every layer keeps each head" if len(kept) == ex["depth"] else
                 f"layers {', '.join(map(str, kept)) or 'none'} keep each head; the others only their mean "
                 "(to keep the file small)")
    bias = (f"<div class='panel'><h3 id='bias-title'></h3><p class='caption' id='bias-caption'></p>"
            f"<label>Bias component <select id='sel-part'>{parts}</select></label>"
            f"{_fig('explorer.figures.bias', 'fig map')}</div>" if ex["parts"] else
            "<p class='note'>This model's encoding adds no attention bias: the explorer shows its attention "
            "rows.</p>")
    return (f"<p>Click any patch of a map to see its rows. Computed in advance for every patch ({kept_text}); "
            "nothing runs on a server.</p><div class='controls'>"
            f"<label>Image <select id='sel-image'>{images}</select></label>"
            f"<label>Layer <select id='sel-layer'>{layers}</select></label>"
            "<label>Heads <select id='sel-head'></select></label>"
            "<span id='patch-text' class='patch'></span></div>"
            "<p id='prediction' class='caption'></p><div class='maps'>"
            f"{bias}<div class='panel'><h3>Attention row of the full model</h3>"
            "<p class='caption' id='attn-caption'></p>"
            f"{_fig('explorer.figures.attn', 'fig map')}</div>"
            "<div class='panel'><h3>Attention rollout</h3><p class='caption' id='rollout-caption'></p>"
            f"<label>Rollout of <select id='sel-source'>{sources}</select></label> "
            "<label>Head fusion <select id='sel-fusion'><option>mean</option><option>max</option></select></label>"
            f"{_fig('explorer.figures.rollout', 'fig map')}</div></div>")


def footer_html(f: dict) -> str:
    commit = f["commit"] or "not in a git checkout"
    return (f"<p>Made by <code>{_e(f['command'] or 'vitpe_core.html_report')}</code> on {_e(f['written'])}.</p>"
            f"<p>vitpe commit <code>{_e(commit)}</code> · sha256 of {_e(f['hash_of'])}: "
            f"<code id='content-hash'>{_e(f['content_hash'])}</code></p>")


def render_html(report: dict) -> str:
    """The page: `template.html` with every `{{NAME}}` filled in one pass (filled text is never
    searched again for placeholders)."""
    js, css = _resource("report.js"), _resource("report.css")
    assert "</script" not in js.lower() and "</style" not in css.lower()
    data = {k: report[k] for k in ("similarity", "position", "explorer")}
    values = {"TITLE": _e(report["title"]), "CSS": css, "CARD": card_html(report["card"]),
              "SIMILARITY": similarity_html(report["similarity"]), "POSITION": position_html(report["position"]),
              "EXPLORER": explorer_html(report["explorer"]), "FOOTER": footer_html(report["footer"]),
              "PLOTLY_GZ": plotly_js_gz_b64(), "DATA": script_json(data), "JS": js}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], _resource("template.html"))


def write_html(report: dict, out: str | Path) -> Path:
    """`render_html(report)` written to `out` (UTF-8); the path."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(report), encoding="utf-8")
    return out
