"""Section 3 of the benchmark: the compute a click triggers in the app.

The `vitpe_core.views` / `analysis` calls that pages/bias.py and pages/compare.py make, without
the Streamlit cache (`bias_page_compute`, `compare_page_compute`, `cold_trace`): a new patch
with the trace cached, and a new image (cold trace); p50 / p95 of wall and CPU time. No
Streamlit runtime is started: Streamlit's own costs (the cache's copy of cached results,
widgets, figures, protobuf) are in the browser's end-to-end numbers (`benchmarks.app`).
"""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from benchmarks.checkpoints import CheckpointSet, app_default
from benchmarks.timing import Plan, percentiles, timed_kinds
from vitpe_core import analysis, inputs, views
from vitpe_core.checkpoint import Checkpoint, load_checkpoint, resolve_checkpoint
from vitpe_core.gallery import gallery_ids, gallery_image

log = logging.getLogger(__name__)


def cold_trace(ckpt: Checkpoint, image_id: str) -> analysis.Trace:
    """pages.common.cache._trace without the cache: gallery image -> model input -> trace."""
    return analysis.trace_image(ckpt.model, inputs.checkpoint_input(gallery_image(image_id), ckpt))


def bias_page_compute(ckpt: Checkpoint, tr: analysis.Trace, patch: tuple[int, int], layer: int = 0,
                      head: int | None = None) -> None:
    """The calls pages/bias.py makes from a trace for one patch (main, show_prediction,
    show_bias with its default part, show_attention), all layers and heads."""
    maps = analysis.patch_maps(tr, patch)                                 # name -> (L, h, H, W)
    views.top_class(tr)
    parts = views.bias_parts(tr)
    if parts:
        views.bias_view(tr, maps, ckpt.config.encoding, layer, head, parts[0])
    views.attention_view(maps, layer, head)
    views.prefix_share(tr, patch, layer, head)


def compare_page_compute(ckpts: dict[str, Checkpoint], traces: dict[str, analysis.Trace],
                         stats: dict[str, dict[str, np.ndarray]], patch: tuple[int, int], layer: int = 0,
                         head: int | None = None, ref_grid: tuple[int, int] | None = None) -> None:
    """The calls pages/compare.py makes per checkpoint for a new patch (`summary_row` from the
    attention statistics cached per image, see `compare_cold`; `panel` with the positional
    component, which the page caches per patch); `patch` is on `ref_grid`, the grid of the
    page's reference checkpoint."""
    for name, ckpt in ckpts.items():
        _, lay, hd = views.clamp_view(ckpt.config, (0, 0), layer, head)
        views.pick_stat(stats[name], "mean_distance", lay, hd)
        views.pick_stat(stats[name], "entropy", lay, hd)
        p, lay, hd = views.clamp_view(ckpt.config, patch, layer, head, ref_grid)
        views.panel_view(traces[name], analysis.positional_component(ckpt.model, traces[name], p), p, lay, hd)


def compare_cold(ckpts: dict[str, Checkpoint], image_id: str, patch: tuple[int, int],
                 ref_grid: tuple[int, int] | None = None
                 ) -> tuple[dict[str, analysis.Trace], dict[str, dict[str, np.ndarray]]]:
    """A new image on the compare page: per checkpoint its trace and attention statistics,
    then the per-patch work."""
    traces = {name: cold_trace(ckpt, image_id) for name, ckpt in ckpts.items()}
    stats = {name: analysis.attention_stats(tr) for name, tr in traces.items()}
    compare_page_compute(ckpts, traces, stats, patch, ref_grid=ref_grid)
    return traces, stats


def click_patches(grid: tuple[int, int], n: int, seed: int = 0) -> list[tuple[int, int]]:
    """`n` pseudo-random patches, each different from the one before."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, int]] = []
    while len(out) < n:
        p = (int(rng.integers(grid[0])), int(rng.integers(grid[1])))
        if not out or p != out[-1]:
            out.append(p)
    return out


def bench_clicks(plan: Plan, cs: CheckpointSet) -> dict:
    """The four click kinds (bias / compare page, new patch / new image), interleaved click by
    click: `cs.single` alone on the bias page, every checkpoint of `cs` on the compare page."""
    ckpts = {n: load_checkpoint(resolve_checkpoint(n, cs.root)) for n in cs.names}
    one = ckpts[cs.single]
    images = gallery_ids()
    log.info("click compute: %s alone, and the compare page over %d checkpoints; %d clicks each",
             cs.single, len(ckpts), plan.clicks)
    for image_id in images:                           # warm-up: imports, photo decoding (cached, as in the app)
        gallery_image(image_id)
    trace_one = cold_trace(one, images[0])
    ref = ckpts[app_default(cs)].config.grid            # the compare page's reference grid (its default view)
    traces_all, stats_all = compare_cold(ckpts, images[0], (0, 0), ref)  # also warms every model's first call
    clicks: dict[str, Callable[[int, tuple[int, int]], object]] = {
        "bias_patch": lambda i, patch: bias_page_compute(one, trace_one, patch),
        "bias_image": lambda i, patch: bias_page_compute(one, cold_trace(one, images[i]), patch),
        "compare_patch": lambda i, patch: compare_page_compute(ckpts, traces_all, stats_all, patch, ref_grid=ref),
        "compare_image": lambda i, patch: compare_cold(ckpts, images[i], patch, ref)}
    patches = click_patches(one.config.grid, plan.clicks)
    wall, cpu = timed_kinds(clicks, [((i + 1) % len(images), patch) for i, patch in enumerate(patches)])
    return {"single": cs.single, "single_fresh": cs.single in cs.fresh, "checkpoints": list(ckpts),
            "fresh": cs.fresh, "images": images,
            **{k: {"n": len(wall[k]), **percentiles(wall[k]), **percentiles(cpu[k], "cpu_"), "samples_ms": wall[k],
                   "cpu_samples_ms": cpu[k]} for k in clicks}}
