"""The report's data: a model card, the sections' Plotly figures (built by `vitpe_core.figures`
from what `analysis`, `positional` and `views` compute: no maths of its own) and the offline
explorer's packed arrays (`explorer`). `build_report` returns it all as one JSON-able dict;
`render.render_html` turns it into the page."""
from __future__ import annotations

import datetime
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .. import analysis, figures, positional, views
from ..checkpoint import Checkpoint
from ..gallery import gallery_caption, gallery_ids, gallery_image
from ..inputs import dataset_of
from .encode import compact_figure
from .render import plotly_js_gz_b64
from .explorer import (LayerPacks, ReportImage, choose_heads_layers, explorer_data, explorer_figures,
                       image_trace)

DEFAULT_MAX_BYTES = 24_000_000     # the whole page; the explorer's per-head layers fill what is left
DEFAULT_IMAGES = 4                 # gallery images when none are given: three CIFAR-10 test images, one photo
PAGE_CHARS = 100_000               # at most: the template, report.js / .css, the text, the explorer's 3 charts
QUERY_PATCHES = "centre", "corner"


def default_images(count: int = DEFAULT_IMAGES) -> list[ReportImage]:
    """`count` gallery images: the first CIFAR-10 test images and the first photo (`gallery`)."""
    ids = gallery_ids()
    photos, cifar = [i for i in ids if i.startswith("photo-")], [i for i in ids if not i.startswith("photo-")]
    chosen = cifar[:max(0, count - 1)] + photos[:1] if photos else cifar[:count]
    chosen = (chosen + [i for i in ids if i not in chosen])[:count]
    return [ReportImage(gallery_caption(i), i, gallery_image(i)) for i in chosen]


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes (the checkpoint's content hash in the footer)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def weights_sha256(ckpt: Checkpoint) -> str:
    """A content hash of a model held in memory only: sha256 over its state dict (names,
    shapes, dtypes, bytes, in name order)."""
    h = hashlib.sha256()
    for k, v in sorted(ckpt.model.state_dict().items()):
        t = v.detach().cpu().contiguous()
        h.update(f"{k}{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def git_commit() -> str | None:
    """HEAD of the git checkout vitpe_core runs from, or None when it runs from elsewhere (an
    installed package, even inside another repository). Read-only: `rev-parse` alone (the
    training's `train.git_commit` also runs `git status`, which may rewrite the index)."""
    package_root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=package_root, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != package_root:
        return None
    return lines[1]


# ----------------------------------------------------------------------------- sections
def model_card(ckpt: Checkpoint) -> list[tuple[str, str]]:
    """(field, value) rows: source/family, encoding, grid and image size, prefix tokens, size,
    accuracy where known, licence as recorded."""
    cfg, m = ckpt.config, ckpt.metrics if isinstance(ckpt.metrics, dict) else {}
    test = m.get("test") if isinstance(m.get("test"), dict) else {}
    imported = bool(m.get("imported"))
    acc = ", ".join(f"top-{k[-1]} {test[k]:.2f} %" for k in ("top1", "top5") if isinstance(test.get(k), (int, float)))
    options = json.dumps(cfg.encoding_options, sort_keys=True) if cfg.encoding_options else ""
    rows = [("model", ckpt.name or "(unnamed)"),
            ("source", f"imported from {m.get('source')} ({m.get('family') or 'family not recorded'})" if imported
             else f"trained with vitpe on {dataset_of(ckpt)}"),
            ("encoding", cfg.encoding + (f" {options}" if options else "")),
            ("how it brings in position", views.hooks_text(ckpt.model.pos_enc.hooks)),
            ("image size", f"{cfg.img_size[0]}×{cfg.img_size[1]} px, patch {cfg.patch_size} px"),
            ("patch grid", f"{cfg.grid[0]}×{cfg.grid[1]} = {cfg.grid[0] * cfg.grid[1]} patches"),
            ("prefix tokens", ", ".join(ckpt.model.prefix_names()) or "none"),
            ("size", f"{cfg.depth} layers, {cfg.heads} heads, width {cfg.dim}, "
                     f"{sum(p.numel() for p in ckpt.model.parameters()):,} parameters"),
            ("classes", str(cfg.num_classes)),
            ("accuracy", f"{acc} (test set, as recorded)" if acc else "not recorded"),
            ("training", f"{m.get('epochs')} epochs" if m.get("epochs") else "not recorded"),
            ("licence", str(m.get("licence") or "not stated"))]
    return rows


def _spec(fig, name: str) -> dict:
    """A figure as the page draws it: its compacted JSON and its Plotly config (file name)."""
    spec = compact_figure(json.loads(fig.to_json()))
    return {"data": spec.get("data", []), "layout": spec.get("layout", {}), "frames": spec.get("frames", []),
            "config": figures.export_config(name)}


def similarity_section(ckpt: Checkpoint) -> dict | None:
    """Figure 7 and the 2D-structure score of the model's table (None without a table); the
    film over the recorded epochs where there are at least two."""
    table = analysis.position_table(ckpt.model)
    if table is None:
        return None
    grid = ckpt.config.grid
    sim = analysis.cosine_similarity(table)                                      # (N, N)
    score = analysis.structure_score(sim, grid)
    out = {"score": {k: round(float(v), 4) for k, v in score.items()},
           "figure7": _spec(figures.figure7_grid_fig(analysis.similarity_grid(sim, grid)), f"{ckpt.name}_figure7")}
    sims = {}
    for epoch, params in ckpt.history.items():
        t = analysis.position_table(ckpt.model, params=params)
        if t is not None:
            sims[epoch] = analysis.cosine_similarity(t)
    if len(sims) >= 2:
        grids = views.film_grids(sims, grid)
        out["film"] = _spec(figures.figure7_film_fig(grids, title="Figure 7 epoch by epoch"), f"{ckpt.name}_film")
        out["film_epochs"] = len(grids)
    return out


def position_section(ckpt: Checkpoint, arrays: dict[str, np.ndarray]) -> dict:
    """Position-only kernels per layer with the relative score, the per-query kernels (the grid's
    centre and its corner), attention distance by depth (`positional.analyze`'s arrays)."""
    name, grid = ckpt.name or "model", ckpt.config.grid
    out: dict[str, Any] = {"kind": str(arrays["kind"]),
                           "relative_by_layer": views.relative_scores_by_layer(arrays)}
    layers = arrays["offset_kernel"].shape[0] if out["kind"] != "none" else 0
    kernels, scores, qmaps, qpatches, qfits = {}, {}, {}, {}, {}
    for layer in range(layers):
        label = f"layer {layer}"
        kernels[label], scores[label] = views.kernel_view(arrays, layer, None)
        for where, patch in zip(QUERY_PATCHES, ((grid[0] // 2, grid[1] // 2), (0, 0))):
            qlabel = f"L{layer} · {where}"
            (qmaps[qlabel], qfits[qlabel]), qpatches[qlabel] = views.query_kernel_view(arrays, layer, None, patch,
                                                                                      grid), patch
    if kernels:
        cols = min(6, len(kernels))
        out["kernels"] = _spec(figures.kernels_fig(kernels, scores, cols=cols,
                                                   title="Position-only kernels by layer, mean of heads"),
                               f"{name}_position_kernels")
        out["query_kernels"] = _spec(figures.query_kernels_fig(qmaps, qpatches, qfits, cols=2 * min(3, layers),
                                                               title="Per query: the centre and the corner patch"
                                                                     "<br>to every key, mean of heads"),
                                     f"{name}_query_kernels")
    out["distance"] = _spec(figures.distance_by_depth_fig({name: arrays["mean_distance"]},
                                                          title="Mean attention distance by depth<br>dots: heads, "
                                                                "line: their mean"), f"{name}_attention_distance")
    return out


def position_arrays(ckpt: Checkpoint, path: str | Path | None) -> dict[str, np.ndarray]:
    """`positional.analyze`'s arrays: the cache beside the checkpoint file when current, else
    computed on the gallery image set (not written: a report changes no file but its own)."""
    if path is not None and Path(path).is_file():
        cached = positional.read_cache(path)
        if cached is not None:
            return cached
    return positional.analyze(ckpt)[1]


# ----------------------------------------------------------------------------- the whole report
def build_report(ckpt: Checkpoint, *, images: Sequence[ReportImage] | None = None, path: str | Path | None = None,
                 content_hash: str | None = None, layers: Sequence[int] | None = None,
                 max_bytes: int = DEFAULT_MAX_BYTES, command: str = "", position: dict | None = None,
                 resolution: Sequence | None = None, progress: Callable[[str], None] = lambda _: None) -> dict:
    """Everything the page shows, as one JSON-able dict. `images`: default `default_images()`;
    `path`: the checkpoint file (its analysis cache is reused, its hash is the content hash
    unless `content_hash` is given); `layers`: the layers whose every head the explorer keeps
    (default: as many as fit `max_bytes`, `explorer.choose_heads_layers`); `command`: what made
    the report, for the footer; `position`: `positional.analyze`'s arrays when the caller has
    them (the app's cache); `resolution`: `resolution.sweep`'s rows, drawn under "How is position
    encoded?" when given; `progress(step)` is told each step (`progress_steps` of them)."""
    if getattr(ckpt.config, "arch", "vit") == "swin":
        raise ValueError(f"{ckpt.name} is a Swin model: the HTML report is built for ViTs (one global grid); the "
                         "app's bias explorer draws a Swin's windows (vitpe_core.swin.windows.window_rows)")
    images = list(images) if images is not None else default_images()
    if not images:
        raise ValueError("a report needs at least one image")
    depth = ckpt.config.depth
    if layers is not None:
        bad = [x for x in layers if not 0 <= int(x) < depth]
        if bad:
            raise ValueError(f"--layers {bad}: this model has layers 0-{depth - 1}")
    ckpt.model.eval()
    progress("model card and similarity")
    card, sim = model_card(ckpt), similarity_section(ckpt)
    progress("position analysis")
    pos = position_section(ckpt, position if position is not None else position_arrays(ckpt, path))
    if resolution:
        pos["resolution"] = _spec(figures.resolution_fig(resolution, title=f"{ckpt.name or 'model'} at other input "
                                                                           "sizes"), f"{ckpt.name}_resolution")
    traces = []
    for img in images:
        progress(f"trace of {img.label}")
        traces.append(image_trace(ckpt, img))
    packs = LayerPacks(traces)
    if layers is None:
        progress("choosing the layers kept per head")
        means_only = explorer_data(ckpt, packs, [])                 # the page with no layer's heads kept
        fixed = len(plotly_js_gz_b64()) + PAGE_CHARS + len(json.dumps([sim, pos, means_only]))
        heads_layers = choose_heads_layers(packs, max_bytes - fixed)
    else:
        heads_layers = sorted({int(x) for x in layers})
    patch = (ckpt.config.grid[0] // 2, ckpt.config.grid[1] // 2)
    explorer = explorer_data(ckpt, packs, heads_layers, progress)
    explorer["figures"] = {k: _strip_picture(_spec(f, f"{ckpt.name}_{k}"))
                           for k, f in explorer_figures(ckpt, traces[0], patch).items()}
    if content_hash is None:
        content_hash = file_sha256(path) if path is not None and Path(path).is_file() else weights_sha256(ckpt)
    footer = {"command": command, "commit": git_commit(), "content_hash": content_hash,
              "hash_of": "the checkpoint file" if path is not None else "the model's weights",
              "written": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    return {"title": f"vitpe report: {ckpt.name or ckpt.config.encoding}", "card": card, "similarity": sim,
            "position": pos, "explorer": explorer, "footer": footer}


def progress_steps(images: int, layers_given: bool) -> int:
    """How many times `build_report` (and `write_report`, one more) calls `progress`."""
    return 2 + 2 * images + (not layers_given)


def _strip_picture(spec: dict) -> dict:
    """An overlay's spec without its picture's data (the page sets each image's own)."""
    for trace in spec["data"]:
        if trace.get("type") == "image":
            trace["source"] = ""
    return spec
