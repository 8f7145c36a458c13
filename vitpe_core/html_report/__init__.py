"""A self-contained interactive HTML report of one model: a single file that opens from disk in a
browser with no server and no network (`python -m vitpe_core report CKPT --out report.html`,
`vitpe_core.explore.report`, the app's "Download this model's report (HTML)").

What the page holds:
* a model card (source or family, encoding, grid and image size, prefix tokens, accuracy as
  recorded, licence as recorded);
* Figure 7 and the 2D-structure score of a learned or fixed table, and the Figure-7 film over
  the recorded epochs where a history exists;
* the position-only kernels per layer with the relative score, the per-query kernels (the grid's
  centre and corner), attention distance by depth (`positional.analyze`; the checkpoint's
  `NAME.analysis.npz` cache is reused when current);
* with `--sizes`, the resolution sweep (`vitpe_core.resolution`): what each input size keeps;
* an offline bias explorer: for each image (default: three CIFAR-10 test images and one photo of
  the gallery), click any patch and see its bias row (SaPE²'s x and y parts and their sum) and
  attention row, per layer, for the mean of heads or one head, and attention rollout of the patch
  or a prefix token (mean or max fusion), redrawn by the page's own `report.js` from Plotly's
  click events;
* a footer with the command that wrote it, the vitpe commit and the checkpoint's sha256.

What is kept, at which precision (size budget: 5 MB for a shipped compact checkpoint with 4
images, 25 MB for a ViT-B/16 at 224 px with 4 images):
* Plotly's JavaScript once, gzip + base64 (1.9 MB of the file; the page inflates it with the
  browser's `DecompressionStream`);
* the charts' own arrays as float32 (Plotly's typed arrays; `encode.compact_figure`);
* the explorer's rows between patches as float16 (`encode.pack`: byte-shuffled, gzip, base64),
  every layer's mean over heads, and every head for the layers that fit `max_bytes`
  (default 24 MB for the whole file; `--layers` chooses them instead), spread from the first and
  last layer inwards (`explorer.layer_order`): every layer of a compact model (the shipped
  `sape2+ape`, x part, y part and attention: 4.8 MB); 6 of 12 of a ViT-B/16 with `ape` (21.7
  MB); rollout `(T, T)` per fusion from the float32 trace, stored as float16;
* each image as the model sees it, PNG or JPEG (quality 90), whichever is smaller.
Float16 keeps 3 significant digits: the maps the page draws agree with the app's (`views`) to
about 1e-3 of their range.

Modules: `build` (the data: `build_report`), `explorer` (the explorer's arrays), `encode`
(packing), `render` (the HTML: `render_html`, `write_html`); `template.html`, `report.js`,
`report.css` are package data.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from ..checkpoint import Checkpoint
from .build import DEFAULT_MAX_BYTES, build_report, default_images, progress_steps
from .encode import pack, unpack
from .explorer import ReportImage
from .render import render_html, write_html

__all__ = ["DEFAULT_MAX_BYTES", "ReportImage", "build_report", "default_images", "pack", "progress_steps", "unpack",
           "render_html", "write_html", "report_bytes", "report_html", "write_report"]


def report_html(ckpt: Checkpoint, **kw) -> str:
    """The report of `ckpt` as one HTML string (`build_report`'s keywords)."""
    return render_html(build_report(ckpt, **kw))


def write_report(ckpt: Checkpoint, out: str | Path, *, images: Sequence[ReportImage] | None = None,
                 path: str | Path | None = None, layers: Sequence[int] | None = None, command: str = "",
                 content_hash: str | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
                 resolution: Sequence | None = None, progress: Callable[[str], None] = lambda _: None) -> Path:
    """Build the report of `ckpt` and write it to `out` (`resolution`: a sweep's rows to draw too);
    the path written."""
    return write_html(_built(ckpt, progress, images=images, path=path, layers=layers, command=command,
                             content_hash=content_hash, max_bytes=max_bytes, resolution=resolution), out)


def report_bytes(ckpt: Checkpoint, *, progress: Callable[[str], None] = lambda _: None, **kw) -> bytes:
    """The report of `ckpt` as the bytes of its HTML file (UTF-8), `build_report`'s keywords:
    what the app offers as a download."""
    return render_html(_built(ckpt, progress, **kw)).encode("utf-8")


def _built(ckpt: Checkpoint, progress: Callable[[str], None], **kw) -> dict:
    report = build_report(ckpt, progress=progress, **kw)
    progress("writing the page")
    return report
