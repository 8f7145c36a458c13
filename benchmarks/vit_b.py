"""Section 6 of the benchmark: a ViT-B/16-sized model at real size (imported-model scale).

D 768, 12 layers, 12 heads, 224 px, random weights, held as the app holds an imported timm
model (`vit_b_checkpoint`): a new image and a click on the pages' calls, p50 / p95; the size of
its trace and Streamlit's per-rerun copy of it; the resident memory of a subprocess with the
model and one cached trace (`python -m benchmarks.probes.vit_b_memory`); `sape2+ape` at that
size where an image takes under `VIT_B_SAPE2_LIMIT_S`. `python -m benchmarks.bench --only vit-b`
runs this section alone (`vit_b_section` records its own machine state).
"""
from __future__ import annotations

import gc
import logging
import os
import pickle
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from benchmarks.clicks import bias_page_compute, click_patches, compare_page_compute
from benchmarks.environment import environment, own_cpu_s
from benchmarks.harness import background_jobs, busy_cpu_s, proc_memory
from benchmarks.memory import probe_process
from benchmarks.timing import Plan, percentiles, timed_kinds
from vitpe_core import analysis, inputs
from vitpe_core.checkpoint import Checkpoint
from vitpe_core.config import ViTConfig
from vitpe_core.gallery import gallery_ids, gallery_image
from vitpe_core.metrics import sanitize_metrics
from vitpe_core.model import build_model

log = logging.getLogger(__name__)

VIT_B = {"img_size": (224, 224), "patch_size": 16, "dim": 768, "depth": 12, "heads": 12, "mlp_dim": 3072,
         "num_classes": 1000}
VIT_B_SAPE2_LIMIT_S = 10.0     # sape2+ape at ViT-B size is timed beyond one image only if that image takes less
VIT_B_STEPS = ("input", "trace", "stats", "views")   # the parts of a new image, in order
VIT_B_MEMORY_STAGES = {        # the stages of benchmarks/probes/vit_b_memory.py, in order
    "imported": "python + torch + vitpe_core imported, no model",
    "model": "+ the ViT-B/16 model (float32, eval)",
    "trace": "+ one image's trace and attention statistics (the page's objects)",
    "cached": "trace as `st.cache_data` holds it during a rerun: pickled bytes + the run's unpickled copy",
}


def vit_b_checkpoint(encoding: str = "ape", seed: int = 0) -> Checkpoint:
    """A ViT-B/16-sized model (`VIT_B`) with random weights, held as the app holds an imported
    timm model: its metrics are `importers.Imported.metrics` with timm's eval transform
    (ImageNet mean / std, crop_pct 0.875, bicubic), checked by `sanitize_metrics` as
    `pages.common.model_import.import_upload` does."""
    from vitpe_core.importers import DEFAULT_PREPROCESS, Imported

    torch.manual_seed(seed)
    cfg = ViTConfig(**VIT_B, encoding=encoding)
    model = build_model(cfg).eval()
    imp = Imported(model, "timm", preprocess=dict(DEFAULT_PREPROCESS["timm"]))
    metrics, _ = sanitize_metrics(imp.metrics(f"random ViT-B/16 ({encoding}), benchmarks/vit_b.py"))
    return Checkpoint(model, cfg, metrics, {}, f"vit-b16-{encoding}")


def vit_b_click(ckpt: Checkpoint, tr: analysis.Trace, stats: dict[str, np.ndarray], patch: tuple[int, int],
                page: str) -> None:
    """A click on a new patch with the trace cached: the bias explorer's calls
    (`bias_page_compute`: `patch_maps`, `top_class`, `bias_parts`, `bias_view` when there is a
    bias, `attention_view`, `prefix_share`) or this model's panel and row on the compare page
    (`compare_page_compute`: `clamp_view`, `pick_stat`, `positional_component`, `panel_view`)."""
    if page == "bias":
        bias_page_compute(ckpt, tr, patch)
    else:
        compare_page_compute({ckpt.name: ckpt}, {ckpt.name: tr}, {ckpt.name: stats}, patch,
                             ref_grid=ckpt.config.grid)


def vit_b_new_image(ckpt: Checkpoint, image_id: str, patch: tuple[int, int]
                    ) -> tuple[analysis.Trace, dict[str, np.ndarray], dict[str, float]]:
    """A new image on the pages, step by step: `inputs.checkpoint_input` (the model's eval
    transform), `analysis.trace_image`, `analysis.attention_stats`, then the first patch's
    views on both pages; returns the trace, its statistics and wall ms per step (+ `total`),
    and this process's CPU ms per step as `cpu_<step>` (all threads)."""
    marks = [(time.perf_counter(), time.process_time())]
    x = inputs.checkpoint_input(gallery_image(image_id), ckpt)
    marks.append((time.perf_counter(), time.process_time()))
    tr = analysis.trace_image(ckpt.model, x)
    marks.append((time.perf_counter(), time.process_time()))
    stats = analysis.attention_stats(tr)
    marks.append((time.perf_counter(), time.process_time()))
    vit_b_click(ckpt, tr, stats, patch, "bias")
    vit_b_click(ckpt, tr, stats, patch, "compare")
    marks.append((time.perf_counter(), time.process_time()))
    ms: dict[str, float] = {}
    for step, (a, b) in zip([*VIT_B_STEPS, "total"], [*zip(marks, marks[1:]), (marks[0], marks[-1])]):
        ms[step], ms[f"cpu_{step}"] = 1e3 * (b[0] - a[0]), 1e3 * (b[1] - a[1])
    return tr, stats, ms


def trace_nbytes(tr: analysis.Trace) -> dict[str, int]:
    """Bytes of a trace's arrays: `attn` (L, h, T, T), `bias` (same, or 0), `parts` (each
    (L, h, N, N)), their `total`, and `pickled`: what `st.cache_data` stores for it."""
    out = {"attn": tr.attn.nbytes, "bias": 0 if tr.bias is None else tr.bias.nbytes,
           "parts": sum(a.nbytes for a in tr.parts.values())}
    out["total"] = sum(out.values()) + tr.logits.nbytes
    out["pickled"] = len(pickle.dumps(tr))
    return out


def _steps_summary(samples: list[dict[str, float]]) -> dict[str, dict]:
    keys = [*VIT_B_STEPS, "total"]
    return {k: {"n": len(samples), **percentiles([s[k] for s in samples]),
                **percentiles([s[f"cpu_{k}"] for s in samples], "cpu_"), "samples_ms": [s[k] for s in samples]}
            for k in keys}


def bench_vit_b_encoding(plan: Plan, encoding: str, images: list[str], n_images: int, n_clicks: int,
                         limit_s: float | None = None) -> dict:
    """New images and clicks on the ViT-B/16-sized `encoding` model; with `limit_s`, stops
    after the first timed image when it took longer than that."""
    ckpt = vit_b_checkpoint(encoding)
    grid = ckpt.config.grid
    centre = (grid[0] // 2, grid[1] // 2)
    out: dict[str, Any] = {"encoding": encoding, "name": ckpt.name, "grid": list(grid),
                           "tokens": ckpt.model.num_prefix + grid[0] * grid[1],
                           "parameters": sum(p.numel() for p in ckpt.model.parameters())}
    tr, stats, first = vit_b_new_image(ckpt, images[0], centre)       # untimed: first calls, allocations
    out["first_image_ms"] = first
    samples = []
    for i in range(n_images):
        tr, stats, ms = vit_b_new_image(ckpt, images[(i + 1) % len(images)], centre)
        samples.append(ms)
        if limit_s is not None and ms["total"] > 1e3 * limit_s:
            out["over_limit"] = True
            break
    out["image"] = _steps_summary(samples)
    out["trace_bytes"] = trace_nbytes(tr)
    blob = pickle.dumps(tr)                                           # the cached trace, as st.cache_data holds it
    kinds = {"bias": lambda p: vit_b_click(ckpt, tr, stats, p, "bias"),
             "compare": lambda p: vit_b_click(ckpt, tr, stats, p, "compare"),
             "cache_copy": lambda p: pickle.loads(blob)}
    patches = click_patches(grid, n_clicks if not out.get("over_limit") else 0)
    wall, cpu = timed_kinds(kinds, [(patch,) for patch in patches])   # the kinds interleaved
    out["clicks"] = {k: {"n": len(wall[k]), **percentiles(wall[k]), **percentiles(cpu[k], "cpu_"),
                         "samples_ms": wall[k]} for k in kinds if wall[k]}
    return out


def vit_b_memory(encoding: str, threads: int) -> list[dict]:
    """Resident memory (VmRSS, and VmHWM: the peak so far) of a subprocess at each stage of
    benchmarks/probes/vit_b_memory.py: imports, the model built, one trace kept, the trace as
    the cache holds it."""
    rows = []
    with probe_process("benchmarks.probes.vit_b_memory", [encoding], threads, wait_s=60) as proc:
        for stage in VIT_B_MEMORY_STAGES:
            line = proc.stdout.readline().strip()
            if line != stage:
                raise RuntimeError(f"ViT-B memory subprocess failed at {stage!r}: {proc.stderr.read()[-2000:]}")
            mem = proc_memory(proc.pid)
            rows.append({"encoding": encoding, "stage": stage, "what": VIT_B_MEMORY_STAGES[stage],
                         "vmrss_mib": mem["VmRSS"], "vmhwm_mib": mem["VmHWM"]})
            proc.stdin.write("\n")
            proc.stdin.flush()
    return rows


def bench_vit_b(plan: Plan) -> dict:
    """Section 6: the ViT-B/16-sized `ape` model (new images, clicks, trace size, memory), and
    `sape2+ape` at that size where one image takes under VIT_B_SAPE2_LIMIT_S."""
    images = gallery_ids()
    for image_id in images:                           # warm-up: photo decoding (cached, as in the app)
        gallery_image(image_id)
    threads = torch.get_num_threads()
    log.info("ViT-B/16 ape: %d images, %d clicks per kind", plan.vit_b_images, plan.vit_b_clicks)
    out: dict[str, Any] = {"config": {**VIT_B, "img_size": list(VIT_B["img_size"])}, "images": images,
                           "threads": threads}
    out["ape"] = bench_vit_b_encoding(plan, "ape", images, plan.vit_b_images, plan.vit_b_clicks)
    gc.collect()
    log.info("ViT-B/16 ape: memory subprocess")
    out["memory"] = vit_b_memory("ape", threads)
    log.info("ViT-B/16 sape2+ape: up to %d images (stops after one over %.0f s)", plan.vit_b_sape2_images,
             VIT_B_SAPE2_LIMIT_S)
    out["sape2+ape"] = bench_vit_b_encoding(plan, "sape2+ape", images, plan.vit_b_sape2_images,
                                            max(plan.vit_b_clicks // 2, 1), limit_s=VIT_B_SAPE2_LIMIT_S)
    gc.collect()
    return out


def vit_b_section(plan: Plan, argv: list[str], mode: str) -> dict:
    """`bench_vit_b` with its own record of the machine (CPU, load, background jobs), its
    mode and wall time: the section can be run alone (`--only vit-b`) on another day."""
    t0 = time.perf_counter()
    env = environment(argv, torch.get_num_threads())
    busy0, own0 = busy_cpu_s(), own_cpu_s()
    out = bench_vit_b(plan)
    wall = time.perf_counter() - t0
    env["loadavg_end"] = list(os.getloadavg())
    env["background_end"] = background_jobs()
    if busy0 is not None:
        others = (busy_cpu_s() - busy0) - (own_cpu_s() - own0)
        env["others_cpu_share"] = max(0.0, others) / (wall * len(os.sched_getaffinity(0)))
    return {**out, "environment": env, "mode": mode, "plan": asdict(plan), "wall_time_s": wall}
