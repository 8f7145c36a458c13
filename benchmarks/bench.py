"""Benchmarks: `python -m benchmarks.bench [--quick] [--skip-app] [--only vit-b] [--out DIR] [--threads N]
[--checkpoints DIR]`.

One run measures, as ratios between variants timed in the same run (absolute times only
beside their ratio; these machines are noisy), and writes `BENCHMARKS.md` and
`benchmarks.json` into `--out` (default: the repository root):

1. attention layer forward+backward per encoding (`model.Attention` + `build_encoding`,
   `attn(x, pos, grid, layer=0)`) vs the same layer with `none` (plain SDPA) and vs `rpb`,
   at the compact width (D 128, 4 heads) and ViT-S width (D 384, 6 heads), T = 65 tokens
   (CLS + 8x8 patches), batch 1 and 128;
2. whole-model training throughput (forward + backward + AdamW step, batch 128, compact
   preset) per encoding vs `none` and `ape`, and for a reference ViT of the same size built
   from plain `torch.nn` (timm's VisionTransformer too, when `import timm` works);
3. the compute a click triggers in the app: the `vitpe_core.views` / `analysis` calls that
   pages/bias.py and pages/compare.py make, without the Streamlit cache: a new patch with the
   trace cached, and a new image (cold trace); p50 / p95;
4. the app's cold start (`python -m streamlit run app.py`): to `/_stcore/health`, to `GET /`,
   and in headless Debian chromium (playwright) to the first element and to the end of the
   first script run; a patch change end to end in the browser (informational);
5. peak memory (VmHWM) of a training subprocess and of the app server with every checkpoint
   loaded (after the compare page ran in the browser);
6. a ViT-B/16-sized model (D 768, 12 layers, 12 heads, 224 px, random weights, held as the app
   holds an imported timm model): a new image and a click on the pages' calls, p50 / p95;
   the size of its trace and Streamlit's per-rerun copy of it; the resident memory of a
   subprocess with the model and one cached trace; `sape2+ape` at that size where an image
   takes under 10 s. `--only vit-b` runs this section alone and writes it (and the targets
   table) into an existing report, leaving the other sections as they are.

Method: the variants of one comparison are run round-robin, the starting variant rotating
every round, so load changes hit all of them alike; a variant's time is the median over
rounds and a ratio is the median of the per-round ratios (paired), the verdict of a target.
Beside it, the ratio of the variants' fastest samples (best-of-N) is a cross-check: load
only adds time, and where the two differ by more than 20 % the table flags the row. A timed
sample repeats a call as often as fits `min_sample_s` in a calibration pass (batch-1 layers
take a fraction of a millisecond). Targets that are missed get a **Why** line for the
maintainers; its text survives a rerun (`written_whys`).

Checkpoints: the shipped set is `vitpe_core.report.ORDER` (the ten of
scripts/train_checkpoints.sh). Those present in `checkpoints/` are used as they are; missing
ones are replaced by compact models with random weights in the same format (a 15-epoch
history included; `harness.write_random_checkpoints`), in a temporary folder, and every
table says which is which. Compute per click does not depend on the weights' values.

The server, browser, memory and process helpers are `benchmarks.harness`'s (shared with the
load test and the browser tests).

Deliberate limits:
* this module uses `vitpe_core.inputs.checkpoint_input` and `vitpe_core.views`, the exact
  preprocessing and view functions the pages use; no Streamlit runtime is started in this
  process;
* click compute excludes Streamlit's own costs (the cache's copy of cached results,
  widgets, figures, protobuf): the browser end-to-end number includes them;
* the process does not pause other jobs; whether a background `vitpe_core train` was
  stopped during the run is detected (process state `T`) and written into the report.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import logging
import os
import pickle
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.harness import (REPO, Server, background_jobs, chromium_or_reason, launch_chromium, patch_label,
                                proc_memory, streamlit_server, wait_script_run, write_random_checkpoints)
from vitpe_core import analysis, inputs, views
from vitpe_core.checkpoint import (Checkpoint, list_checkpoints, listed_checkpoints, load_checkpoint,
                                   resolve_checkpoint, sanitize_metrics)
from vitpe_core.config import ViTConfig, preset_config
from vitpe_core.encodings import EncodingContext, available_encodings, build_encoding
from vitpe_core.gallery import gallery_ids, gallery_image
from vitpe_core.model import Attention, build_model
from vitpe_core.report import ORDER
from vitpe_core.viewstate import PREFERRED_CKPT, show_value

log = logging.getLogger(__name__)

SHIPPED = tuple(ORDER)                         # the shipped checkpoints (scripts/train_checkpoints.sh)
GRID = (8, 8)                                  # 32x32 images, patch 4: T = 1 + 64 tokens
WIDTHS = {"compact": (128, 4), "vit-s": (384, 6)}
BATCHES = (1, 128)
TRAIN_BATCH = 128
EXTRA_TRAIN = ("sape2+ape", "cope+ape")        # shipped compositions, also timed whole-model
GB = 1e9
NOISY = 0.2          # paired-median and best-of-N ratios further apart than this: flagged
BORDERLINE = 0.05    # a target measured this close to its limit is marked borderline


@dataclass(frozen=True)
class Plan:
    """Repetitions of one run."""

    attn_rounds: int          # timed rounds per attention comparison
    attn_min_sample_s: float  # a timed sample repeats the call until it lasts this long
    train_rounds: int         # timed optimiser steps per whole-model variant
    warmup: int               # untimed calls per variant before timing
    clicks: int               # clicks per click kind
    app_runs: int             # cold starts of the app
    e2e_clicks: int           # patch changes in the browser, per page
    memory_steps: int         # optimiser steps of the training-memory subprocess
    memory_encodings: tuple[str, ...] = ("ape", "sape2+ape", "cope+ape")
    vit_b_images: int = 0     # new images timed on the ViT-B/16-sized model (after one untimed); 0: no section 6
    vit_b_clicks: int = 0     # clicks per click kind on it
    vit_b_sape2_images: int = 0   # new images timed with `sape2+ape` at that size (while one takes < 10 s)
    functional_rounds: int = 0    # timed rounds of the functional attentions (section 7); 0: no section
    profile_steps: int = 0        # profiled fwd+bwd steps of the SaPE² layer, before and now (section 8); 0: none
    analysis: bool = False        # time `positional.analyze` on a shipped checkpoint (section 9)
    train_steps_per_sample: int = 1   # consecutive optimiser steps of one variant per training sample (their mean)


FULL = Plan(attn_rounds=7, attn_min_sample_s=0.1, train_rounds=8, warmup=1, clicks=50, app_runs=3, e2e_clicks=6,
            memory_steps=3, vit_b_images=20, vit_b_clicks=50, vit_b_sape2_images=5, functional_rounds=7,
            profile_steps=5, analysis=True, train_steps_per_sample=3)
QUICK = Plan(attn_rounds=2, attn_min_sample_s=0.0, train_rounds=1, warmup=0, clicks=8, app_runs=1, e2e_clicks=2,
             memory_steps=1, memory_encodings=("sape2+ape",), vit_b_images=2, vit_b_clicks=4, vit_b_sape2_images=1,
             functional_rounds=2, profile_steps=1, analysis=True)


# ----------------------------------------------------------------------------- timing
def _time_calls(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _calls_within(fn: Callable[[], object], seconds: float) -> int:
    """How many calls of `fn` fill `seconds` (at least 1); doubles as a warm-up."""
    n, t0 = 0, time.perf_counter()
    while n == 0 or time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return n


def interleaved(fns: dict[str, Callable[[], object]], *, rounds: int, warmup: int,
                min_sample_s: float = 0.0, calls_per_sample: int = 1) -> dict[str, list[float]]:
    """Seconds per call of every variant, one sample per round, variants round-robin with the
    starting variant rotating each round. After `warmup` calls, a calibration pass counts how
    many calls fill `min_sample_s`; a sample is the mean over that many calls (over
    `calls_per_sample` consecutive calls if `min_sample_s` is 0). Returns name -> `rounds` samples."""
    names = list(fns)
    inner = {name: max(1, calls_per_sample) for name in names}
    for name in names:
        for _ in range(warmup):
            fns[name]()
        if min_sample_s > 0:
            inner[name] = _calls_within(fns[name], min_sample_s)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            samples[name].append(_time_calls(fns[name], inner[name]))
    return samples


def paired_ratio(samples: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of `time(a) / time(b)` measured in the same round."""
    return float(np.median(np.asarray(samples[a]) / np.asarray(samples[b])))


def best_ratio(samples: dict[str, list[float]], a: str, b: str) -> float:
    """`min time(a) / min time(b)`: the best-of-N cross-check of `paired_ratio` (load only
    ever adds time, so each minimum is the sample least disturbed by it)."""
    return float(min(samples[a]) / min(samples[b]))


def ratios(samples: dict[str, list[float]], a: str, b: str, key: str, *, invert: bool = False) -> dict[str, Any]:
    """`key`: paired median of time(a)/time(b) (or b/a with `invert`, for throughput),
    `key_best`: the best-of-N ratio, `key_noisy`: the two differ by more than NOISY."""
    if invert:
        a, b = b, a
    med, best = paired_ratio(samples, a, b), best_ratio(samples, a, b)
    return {key: med, f"{key}_best": best, f"{key}_noisy": bool(abs(med / best - 1) > NOISY)}


def percentiles(ms: list[float], prefix: str = "") -> dict[str, float]:
    a = np.asarray(ms)
    return {f"{prefix}p50_ms": float(np.percentile(a, 50)), f"{prefix}p95_ms": float(np.percentile(a, 95)),
            f"{prefix}max_ms": float(a.max())}


# ----------------------------------------------------------------------------- 1. attention layer
def attention_step(encoding: str, dim: int, heads: int, batch: int, grid: tuple[int, int] = GRID
                   ) -> Callable[[], None]:
    """Forward + backward of one `Attention` layer with `encoding` (all its gradients)."""
    torch.manual_seed(0)
    attn = Attention(dim, heads)
    pos = build_encoding(encoding, EncodingContext(dim, heads, 1, grid, 1))
    T = 1 + grid[0] * grid[1]
    x = torch.randn(batch, T, dim, requires_grad=True)                        # (B, T, D)
    grad_out = torch.randn(batch, T, dim)                                     # (B, T, D)
    params = [*attn.parameters(), *pos.parameters(), x]

    def step() -> None:
        for p in params:
            p.grad = None
        attn(x, pos, grid, layer=0).backward(grad_out)
    return step


def bench_attention(plan: Plan, encodings: list[str]) -> list[dict]:
    rows = []
    for width, (dim, heads) in WIDTHS.items():
        for batch in BATCHES:
            log.info("attention layer: %s (D %d, %d heads), batch %d", width, dim, heads, batch)
            fns = {e: attention_step(e, dim, heads, batch) for e in encodings}
            s = interleaved(fns, rounds=plan.attn_rounds, warmup=plan.warmup, min_sample_s=plan.attn_min_sample_s)
            for e in encodings:
                rows.append({"width": width, "dim": dim, "heads": heads, "tokens": 1 + GRID[0] * GRID[1],
                             "batch": batch, "encoding": e, "median_ms": 1e3 * float(np.median(s[e])),
                             "min_ms": 1e3 * min(s[e]), **ratios(s, e, "none", "vs_none"),
                             **ratios(s, e, "rpb", "vs_rpb"), "samples_ms": [1e3 * t for t in s[e]]})
            del fns
            gc.collect()
    return rows


# ----------------------------------------------------------------------------- 2. training throughput
class TorchViT(nn.Module):
    """Reference ViT from plain `torch.nn` at a vitpe config: conv patch embed, CLS token,
    learned position table, `nn.TransformerEncoder` (pre-norm, GELU, batch-first, no
    dropout), final norm, linear head on CLS."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        H, W = cfg.grid
        self.patch_embed = nn.Conv2d(cfg.in_chans, cfg.dim, cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + H * W, cfg.dim) * 0.02)
        layer = nn.TransformerEncoderLayer(cfg.dim, cfg.heads, cfg.mlp_dim, dropout=0.0, activation="gelu",
                                           layer_norm_eps=cfg.norm_eps, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)                       # (B, N, D)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)     # (B, T, D)
        return self.head(self.norm(self.encoder(x + self.pos_embed))[:, 0])      # (B, classes)


def reference_models(cfg: ViTConfig) -> dict[str, Callable[[], nn.Module]]:
    """The plain-torch reference, and timm's VisionTransformer when timm is importable."""
    out: dict[str, Callable[[], nn.Module]] = {"torch.nn ViT (reference)": lambda: TorchViT(cfg)}
    try:
        from timm.models.vision_transformer import VisionTransformer
    except ImportError:
        return out
    out["timm VisionTransformer (reference)"] = lambda: VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, embed_dim=cfg.dim, depth=cfg.depth, num_heads=cfg.heads,
        mlp_ratio=cfg.mlp_dim / cfg.dim, num_classes=cfg.num_classes, qkv_bias=cfg.qkv_bias)
    return out


def train_step(model: nn.Module, batch: int = TRAIN_BATCH) -> Callable[[], None]:
    """One training step as train.py does it on its normalised batch: label-smoothed cross
    entropy, backward, grad-norm clip 1.0, AdamW with train.py's parameter groups."""
    from vitpe_core.train import TrainConfig, _optimizer

    torch.manual_seed(0)
    model.train()
    opt = _optimizer(model, TrainConfig())
    x = torch.randn(batch, 3, 32, 32)                                           # (B, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))

    def step() -> None:
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return step


def bench_training(plan: Plan, encodings: list[str]) -> list[dict]:
    cfg = preset_config("compact")
    builders: dict[str, Callable[[], nn.Module]] = {
        e: (lambda e=e: build_model(preset_config("compact", encoding=e))) for e in [*encodings, *EXTRA_TRAIN]}
    builders.update(reference_models(cfg))
    log.info("training throughput: %d variants, batch %d", len(builders), TRAIN_BATCH)
    fns = {}
    for name, build in builders.items():
        torch.manual_seed(0)
        fns[name] = train_step(build())
    s = interleaved(fns, rounds=plan.train_rounds, warmup=plan.warmup, calls_per_sample=plan.train_steps_per_sample)
    rows = []
    for name in builders:
        rows.append({"variant": name, "images_per_s": TRAIN_BATCH / float(np.median(s[name])),
                     "median_step_ms": 1e3 * float(np.median(s[name])), "min_step_ms": 1e3 * min(s[name]),
                     **ratios(s, name, "none", "throughput_vs_none", invert=True),
                     **ratios(s, name, "ape", "throughput_vs_ape", invert=True),
                     "samples_ms": [1e3 * t for t in s[name]]})
    return rows


# ----------------------------------------------------------------------------- 7. functional attention
FUNCTIONAL_BASE = "SDPA + `rpb` mask"


def functional_steps(batch: int = TRAIN_BATCH, dim: int = 128, heads: int = 4, grid: tuple[int, int] = GRID
                     ) -> dict[str, Callable[[], None]]:
    """Forward + backward of attention as a researcher calls it in their own model, compact shapes:
    `q, k, v: (B, h, 1 + H·W, d)` leaves; every variant's gradients flow into q, k, v and its tables."""
    from vitpe_core.encodings import cope_bias, sape2_bias
    from vitpe_core.encodings.functional import cope_attention, sape2_attention
    torch.manual_seed(0)
    d, P, T = dim // heads, 1, 1 + grid[0] * grid[1]
    q, k, v = (torch.randn(batch, heads, T, d, requires_grad=True) for _ in range(3))
    e_x, e_y, e = (torch.empty(d, 10).normal_(std=0.02).requires_grad_() for _ in range(3))
    rpb = build_encoding("rpb", EncodingContext(dim, heads, 1, grid, P))
    grad = torch.randn(batch, heads, T, d)
    leaves = [q, k, v, e_x, e_y, e, *rpb.parameters()]

    def step(fn: Callable[[], Tensor]) -> Callable[[], None]:
        def run() -> None:
            for t in leaves:
                t.grad = None
            fn().backward(grad)
        return run

    sdpa = F.scaled_dot_product_attention
    return {
        "SDPA (no bias)": step(lambda: sdpa(q, k, v)),
        FUNCTIONAL_BASE: step(lambda: sdpa(q, k, v, attn_mask=rpb.bias(q, k, grid=grid, layer=0))),
        "`sape2_attention`": step(lambda: sape2_attention(q, k, v, e_x, e_y, grid, num_prefix=P)),
        "SDPA + `sape2_bias` mask": step(lambda: sdpa(q, k, v, attn_mask=sape2_bias(
            q[:, :, P:], k[:, :, P:], e_x, e_y, grid, num_prefix=P))),
        "`cope_attention`": step(lambda: cope_attention(q, k, v, e)),
        "SDPA + `cope_bias` mask": step(lambda: sdpa(q, k, v, attn_mask=cope_bias(q, k, e))),
    }


def bench_functional(plan: Plan) -> list[dict]:
    log.info("functional attention: %d variants, batch %d", 6, TRAIN_BATCH)
    fns = functional_steps()
    s = interleaved(fns, rounds=plan.functional_rounds, warmup=plan.warmup, min_sample_s=plan.attn_min_sample_s)
    return [{"variant": name, "median_ms": 1e3 * float(np.median(s[name])), "min_ms": 1e3 * min(s[name]),
             **ratios(s, name, FUNCTIONAL_BASE, "vs_base"), "samples_ms": [1e3 * t for t in s[name]]}
            for name in fns]


# ----------------------------------------------------------------------------- C++ kernel A/B
def _kernel_toggle(fn: Callable[[], None], eager: bool) -> Callable[[], None]:
    def run() -> None:
        if eager:
            os.environ["VITPE_NO_CPP"] = "1"
        else:
            os.environ.pop("VITPE_NO_CPP", None)
        fn()
    return run


def kernel_ab(what: str, rounds: int, *, batch: int = TRAIN_BATCH) -> list[str]:
    """SaPE² / CoPE with the fused C++ kernel and with the eager code, interleaved in one process
    (`--kernel-ab layer|train`): the layer ratio vs `rpb` (compact shapes, fwd+bwd) or training
    images/s vs `ape`. CPU time (`process_time`) at 1 torch thread, else wall time; paired
    medians with their interquartile range and the best-of-N ratio, one line per variant."""
    from vitpe_core.encodings import _kernels
    if not _kernels.available():
        raise RuntimeError("the C++ kernel is not available here (VITPE_NO_CPP set, or no compiler)")
    if what == "layer":
        base = "rpb"
        fns = {"rpb": _kernel_toggle(attention_step("rpb", 128, 4, batch), False)}
        for name, eager in (("sape2 cpp", False), ("sape2 eager", True)):
            fns[name] = _kernel_toggle(attention_step("sape2", 128, 4, batch), eager)
    else:
        base, fns = "ape", {}
        for name, enc, eager in (("ape", "ape", False), ("sape2 cpp", "sape2", False), ("sape2 eager", "sape2", True),
                                 ("cope+ape cpp", "cope+ape", False), ("cope+ape eager", "cope+ape", True)):
            torch.manual_seed(0)
            fns[name] = _kernel_toggle(train_step(build_model(preset_config("compact", encoding=enc)), batch), eager)
    clock = time.process_time if torch.get_num_threads() == 1 else time.perf_counter
    names = list(fns)
    for name in names:
        for _ in range(2):
            fns[name]()
    s: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            t0 = clock()
            fns[name]()
            s[name].append(clock() - t0)
    os.environ.pop("VITPE_NO_CPP", None)
    lines = []
    for name in names:
        a, b = np.asarray(s[name]), np.asarray(s[base])
        rr = a / b if what == "layer" else b / a
        best = a.min() / b.min() if what == "layer" else b.min() / a.min()
        q1, q3 = np.percentile(rr, [25, 75])
        lines.append(f"{what} {torch.get_num_threads()} thread(s) {name:15s} median {1e3 * np.median(a):8.1f} ms  "
                     f"vs {base}: paired median {np.median(rr):.3f} (IQR {q1:.3f}-{q3:.3f}), best-of-N {best:.3f}")
    return lines


# ----------------------------------------------------------------------------- 8. profile of the SaPE² layer
PROFILE_BEFORE = "5405daa"   # main before the fused SaPE² / CoPE attention (issue 14): the "before" profile
PROFILE_TOP = 12
_PROFILE_CHILD = r"""
import json, sys, torch
from torch.profiler import ProfilerActivity, profile, record_function
from vitpe_core.encodings import EncodingContext, build_encoding
from vitpe_core.model import Attention
steps, threads = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
torch.manual_seed(0)
dim, heads, batch, grid = 128, 4, 128, (8, 8)
attn, pos = Attention(dim, heads), build_encoding("sape2", EncodingContext(dim, heads, 1, grid, 1))
x, grad = torch.randn(batch, 65, dim, requires_grad=True), torch.randn(batch, 65, dim)
for _ in range(2):
    attn(x, pos, grid, layer=0).backward(grad)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(steps):
        with record_function("phase:forward"):
            out = attn(x, pos, grid, layer=0)
        with record_function("phase:backward"):
            out.backward(grad)
events = prof.events()
phases = [(e.time_range.start, e.time_range.end, e.name[6:]) for e in events if e.name.startswith("phase:")]
acc = {"forward": {}, "backward": {}}
for e in events:
    if e.name.startswith("phase:"):
        continue
    ph = next((p for a, b, p in phases if a <= e.time_range.start <= b), None)
    if ph is not None:
        row = acc[ph].setdefault(e.name, [0.0, 0])
        row[0] += e.self_cpu_time_total / 1e3 / steps
        row[1] += 1
wall = {p: sum(b - a for a, b, q in phases if q == p) / 1e3 / steps for p in acc}
print(json.dumps({p: {"wall_ms": wall[p], "ops": {n: {"self_ms": v[0], "calls": v[1] / steps}
                                                    for n, v in ops.items()}} for p, ops in acc.items()}))
"""


def profile_layer(root: Path, steps: int, threads: int) -> dict:
    """`torch.profiler` op table of the compact SaPE² layer (batch 128) by phase, in a child
    process importing `vitpe_core` from `root`."""
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-c", _PROFILE_CHILD, str(steps), str(threads)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise RuntimeError(f"profile child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_profile(plan: Plan) -> dict:
    """The SaPE² layer profiled at `PROFILE_BEFORE` (its `vitpe_core` taken with `git archive`)
    and as it is now; the "before" is skipped with a reason where git or the commit is missing."""
    threads = torch.get_num_threads()
    res: dict[str, Any] = {"steps": plan.profile_steps, "threads": threads, "before_commit": PROFILE_BEFORE}
    log.info("profile: SaPE² layer now")
    res["after"] = profile_layer(REPO, plan.profile_steps, threads)
    with tempfile.TemporaryDirectory(prefix="vitpe-before-") as tmp:
        try:
            archive = subprocess.run(["git", "archive", PROFILE_BEFORE, "vitpe_core"], cwd=REPO, capture_output=True,
                                     check=True, timeout=60).stdout
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            res["before_reason"] = f"no `git archive {PROFILE_BEFORE}` here ({type(e).__name__})"
            return res
        log.info("profile: SaPE² layer at %s", PROFILE_BEFORE)
        res["before"] = profile_layer(Path(tmp), plan.profile_steps, threads)
    return res


# ----------------------------------------------------------------------------- 9. analysis budget
ANALYSIS_CHECKPOINT = "sape2+ape"


def bench_analysis(checkpoints: Path) -> dict:
    """Wall time of `vitpe_core.positional.analyze` (what `python -m vitpe_core analyze` runs, without
    its cache) on a compact shipped checkpoint."""
    from vitpe_core.positional import analyze
    path = checkpoints / f"{ANALYSIS_CHECKPOINT}.safetensors"
    if not path.exists():
        return {"checkpoint": ANALYSIS_CHECKPOINT, "reason": f"{path} not found"}
    ckpt = load_checkpoint(path)
    t0, c0 = time.perf_counter(), time.process_time()
    summary, _ = analyze(ckpt)
    return {"checkpoint": ANALYSIS_CHECKPOINT, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "images": summary["images"]}


# ----------------------------------------------------------------------------- checkpoints
@dataclass
class CheckpointSet:
    root: Path                 # folder the app and the click benchmark read
    names: list[str]           # all checkpoints in it
    fresh: list[str]           # those built here with random weights
    single: str                # the one-checkpoint case


@contextlib.contextmanager
def checkpoint_set(source: Path) -> Iterator[CheckpointSet]:
    """The shipped set: `source` itself when it holds all of them, else a temporary folder
    with copies of those present and random-weight compact models for the rest."""
    present = list_checkpoints(source)
    missing = [e for e in SHIPPED if e not in present]
    single = next((n for n in ("sape2+ape", "ape") if n in present), "sape2+ape")
    if not missing:
        yield CheckpointSet(source, present, [], single)
        return
    with tempfile.TemporaryDirectory(prefix="vitpe-bench-ckpts-") as tmp:
        root = Path(tmp)
        for name in present:
            path = resolve_checkpoint(name, source)
            shutil.copy2(path, root / path.name)
            if path.with_suffix(".json").is_file():
                shutil.copy2(path.with_suffix(".json"), root / path.with_suffix(".json").name)
        write_random_checkpoints(root, missing, preset="compact", epochs=15)
        log.info("checkpoints: %d from %s, %d fresh (%s)", len(present), source, len(missing), ", ".join(missing))
        yield CheckpointSet(root, list_checkpoints(root), missing, single)


# ----------------------------------------------------------------------------- 3. click compute
def cold_trace(ckpt: Checkpoint, image_id: str) -> analysis.Trace:
    """pages.common.cache._trace without the cache: gallery image -> model input -> trace."""
    return analysis.trace_image(ckpt.model, inputs.checkpoint_input(gallery_image(image_id), ckpt))


def bias_page_compute(ckpt: Checkpoint, tr: analysis.Trace, patch: tuple[int, int], layer: int = 0,
                      head: int | None = None) -> None:
    """The calls pages/bias.py makes from a trace for one patch (main, show_prediction,
    show_bias with its default part, show_attention), all layers and heads."""
    maps = analysis.patch_maps(tr, patch)                                 # name -> (L, h, H, W)
    views.top_class(tr)
    parts = views.bias_parts(tr, ckpt.model.pos_enc)
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
    wall: dict[str, list[float]] = {k: [] for k in clicks}
    cpu: dict[str, list[float]] = {k: [] for k in clicks}
    for i, patch in enumerate(click_patches(one.config.grid, plan.clicks)):   # the four kinds interleaved
        for kind, click in clicks.items():
            w0, c0 = time.perf_counter(), time.process_time()
            click((i + 1) % len(images), patch)
            wall[kind].append(1e3 * (time.perf_counter() - w0))
            cpu[kind].append(1e3 * (time.process_time() - c0))
    return {"single": cs.single, "single_fresh": cs.single in cs.fresh, "checkpoints": list(ckpts),
            "fresh": cs.fresh, "images": images,
            **{k: {"n": len(wall[k]), **percentiles(wall[k]), **percentiles(cpu[k], "cpu_"), "samples_ms": wall[k],
                   "cpu_samples_ms": cpu[k]} for k in clicks}}


# ----------------------------------------------------------------------------- memory
_TRAIN_CHILD = r"""
import sys, torch, torch.nn.functional as F
from vitpe_core import build_model, preset_config
from vitpe_core.train import TrainConfig, _optimizer
enc, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = build_model(preset_config("compact", encoding=enc)).train()
opt = _optimizer(model, TrainConfig(encoding=enc))
x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
for _ in range(steps):
    loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
print("done", flush=True)
sys.stdin.readline()
"""


@contextlib.contextmanager
def _child(code: str, args: list[str], threads: int, *, wait_s: float) -> Iterator[subprocess.Popen]:
    """`python -c code *args` from the repository with `threads` OpenMP threads and piped
    stdin/stdout/stderr (the memory probes answer on stdout and wait on stdin); on leaving,
    stdin is closed and the child given `wait_s` to exit before it is killed."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def train_memory(encoding: str, steps: int, threads: int) -> dict:
    """Peak memory of a subprocess that trains the compact `encoding` model `steps` steps on
    random data at batch 128 (read from /proc/<pid>/status while it waits)."""
    with _child(_TRAIN_CHILD, [encoding, str(steps), str(TRAIN_BATCH)], threads, wait_s=30) as proc:
        line = proc.stdout.readline()
        if line.strip() != "done":
            raise RuntimeError(f"training subprocess failed: {proc.stderr.read()[-2000:]}")
        mem = proc_memory(proc.pid)
    return {"encoding": encoding, "steps": steps, "batch": TRAIN_BATCH, "vmhwm_mib": mem["VmHWM"],
            "vmrss_mib": mem["VmRSS"]}


def bench_train_memory(plan: Plan) -> list[dict]:
    threads = torch.get_num_threads()
    log.info("training memory: %s, %d steps", ", ".join(plan.memory_encodings), plan.memory_steps)
    rows = [{**train_memory("ape", 0, threads), "what": "import + build only (0 steps)"}]
    for enc in plan.memory_encodings:
        steps = f"{plan.memory_steps} step" + ("s" if plan.memory_steps != 1 else "")
        rows.append({**train_memory(enc, plan.memory_steps, threads), "what": steps})
    return rows


# ----------------------------------------------------------------------------- 6. ViT-B/16 at real size
VIT_B = {"img_size": (224, 224), "patch_size": 16, "dim": 768, "depth": 12, "heads": 12, "mlp_dim": 3072,
         "num_classes": 1000}
VIT_B_SAPE2_LIMIT_S = 10.0     # sape2+ape at ViT-B size is timed beyond one image only if that image takes less
VIT_B_STEPS = ("input", "trace", "stats", "views")   # the parts of a new image, in order


def vit_b_checkpoint(encoding: str = "ape", seed: int = 0) -> Checkpoint:
    """A ViT-B/16-sized model (`VIT_B`) with random weights, held as the app holds an imported
    timm model: its metrics are `importers.Imported.metrics` with timm's eval transform
    (ImageNet mean / std, crop_pct 0.875, bicubic), checked by `sanitize_metrics` as
    `pages.common.cache.import_upload` does."""
    from vitpe_core.importers import DEFAULT_PREPROCESS, Imported

    torch.manual_seed(seed)
    cfg = ViTConfig(**VIT_B, encoding=encoding)
    model = build_model(cfg).eval()
    imp = Imported(model, "timm", preprocess=dict(DEFAULT_PREPROCESS["timm"]))
    metrics, _ = sanitize_metrics(imp.metrics(f"random ViT-B/16 ({encoding}), benchmarks/bench.py"))
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
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for patch in click_patches(grid, n_clicks if not out.get("over_limit") else 0):
        for kind, fn in kinds.items():                                # the kinds interleaved
            w0, c0 = time.perf_counter(), time.process_time()
            fn(patch)
            wall[kind].append(1e3 * (time.perf_counter() - w0))
            cpu[kind].append(1e3 * (time.process_time() - c0))
    out["clicks"] = {k: {"n": len(wall[k]), **percentiles(wall[k]), **percentiles(cpu[k], "cpu_"),
                         "samples_ms": wall[k]} for k in kinds if wall[k]}
    return out


_VIT_B_CHILD = r"""
import gc, pickle, sys
from benchmarks.bench import vit_b_checkpoint, vit_b_new_image
from vitpe_core.gallery import gallery_ids

def stage(name):
    gc.collect()
    print(name, flush=True)
    sys.stdin.readline()

stage("imported")
ckpt = vit_b_checkpoint(sys.argv[1])
stage("model")
tr, stats, _ = vit_b_new_image(ckpt, gallery_ids()[0], (7, 7))
stage("trace")
blob = pickle.dumps(tr)                   # st.cache_data keeps these bytes; a rerun unpickles its own copy
del tr
copy = pickle.loads(blob)
stage("cached")
"""
VIT_B_MEMORY_STAGES = {
    "imported": "python + torch + vitpe_core imported, no model",
    "model": "+ the ViT-B/16 model (float32, eval)",
    "trace": "+ one image's trace and attention statistics (the page's objects)",
    "cached": "trace as `st.cache_data` holds it during a rerun: pickled bytes + the run's unpickled copy",
}


def vit_b_memory(encoding: str, threads: int) -> list[dict]:
    """Resident memory (VmRSS, and VmHWM: the peak so far) of a subprocess at each stage of
    `_VIT_B_CHILD`: imports, the model built, one trace kept, the trace as the cache holds it."""
    rows = []
    with _child(_VIT_B_CHILD, [encoding], threads, wait_s=60) as proc:
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


def vit_b_section(plan: Plan, argv: list[str], mode: str) -> dict:
    """`bench_vit_b` with its own record of the machine (CPU, load, background jobs), its
    mode and wall time: the section can be run alone (`--only vit-b`) on another day."""
    t0 = time.perf_counter()
    env = environment(argv, torch.get_num_threads())
    busy0, own0 = _busy_cpu_s(), _own_cpu_s()
    out = bench_vit_b(plan)
    wall = time.perf_counter() - t0
    env["loadavg_end"] = list(os.getloadavg())
    env["background_end"] = background_jobs()
    if busy0 is not None:
        others = (_busy_cpu_s() - busy0) - (_own_cpu_s() - own0)
        env["others_cpu_share"] = max(0.0, others) / (wall * len(os.sched_getaffinity(0)))
    return {**out, "environment": env, "mode": mode, "plan": asdict(plan), "wall_time_s": wall}


def _busy_cpu_s() -> float | None:
    """Seconds all CPUs spent busy since boot (/proc/stat: all but idle and iowait), None without it."""
    try:
        f = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process and its finished children (the memory subprocess)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


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


# ----------------------------------------------------------------------------- 4./5. the app
def e2e_patch_changes(page, n: int, grid: tuple[int, int], start: tuple[int, int], prefix: str = "bias") -> list[float]:
    """Type a new row into the patch's row input and press Enter; time until the page shows
    the new patch and the rerun finished (ms)."""
    ms = []
    row_input = page.locator(f".st-key-{prefix}_row input").first   # the page's row input (ui.patch_controls)
    r, c = start
    for i in range(n):
        r = (r + 1 + i % (grid[0] - 1)) % grid[0]
        t0 = time.perf_counter()
        row_input.fill(str(r))
        row_input.press("Enter")
        wait_script_run(page, 120, patch_label((r, c)))
        ms.append(1e3 * (time.perf_counter() - t0))
    return ms


def bench_app(plan: Plan, cs: CheckpointSet, workdir: Path) -> dict:
    """Cold starts (HTTP always; browser where chromium + playwright work), then in the last
    run: patch changes on the bias page, the compare page with every checkpoint, its memory."""
    exe, reason = chromium_or_reason()
    runs: list[dict] = []
    out: dict[str, Any] = {"checkpoints": cs.names, "listed": listed_checkpoints(cs.root), "fresh": cs.fresh,
                           "default": app_default(cs),
                           "browser": reason is None, "browser_reason": reason}
    with contextlib.ExitStack() as stack:
        browser = None
        if exe is not None:
            from playwright.sync_api import sync_playwright

            try:
                browser = launch_chromium(stack.enter_context(sync_playwright()))
                stack.callback(browser.close)
            except Exception as e:  # a browser that will not start is reported, not fatal
                out["browser"], out["browser_reason"] = False, f"chromium did not launch: {e}"
                browser = None
        for i in range(plan.app_runs):
            last = i == plan.app_runs - 1
            log.info("app cold start %d/%d", i + 1, plan.app_runs)
            with streamlit_server(cs.root, log=workdir / f"streamlit-{i}.log", timeout=120) as server:
                run, t0 = dict(server.ready), server.started
                if browser is not None:
                    page = browser.new_page(viewport={"width": 1400, "height": 1000})
                    page.goto(server.url + "/")
                    page.locator("h1").first.wait_for(state="visible", timeout=180_000)
                    run["first_element_s"] = time.perf_counter() - t0
                    wait_script_run(page)
                    run["first_run_s"] = time.perf_counter() - t0
                    run["after_first_page_mib"] = proc_memory(server.pid)
                    if last:
                        out.update(_browse(page, server, plan, cs, out["listed"]))
                    page.close()
                runs.append(run)
    out["runs"] = runs
    for key in ("health_s", "get_root_s", "first_element_s", "first_run_s"):
        values = [r[key] for r in runs if key in r]
        if values:
            out[key] = float(np.median(values))
    return out


def app_default(cs: CheckpointSet) -> str:
    """The checkpoint the app opens with (viewstate.default_view)."""
    return PREFERRED_CKPT if PREFERRED_CKPT in cs.names else cs.names[0]


def _browse(page, server: Server, plan: Plan, cs: CheckpointSet, listed: list[str]) -> dict:
    cfg = load_checkpoint(resolve_checkpoint(app_default(cs), cs.root)).config
    start = (cfg.grid[0] // 2, cfg.grid[1] // 2)            # the default view's patch
    out: dict[str, Any] = {"e2e_bias": e2e_patch_changes(page, plan.e2e_clicks, cfg.grid, start)}
    t0 = time.perf_counter()
    page.goto(server.url + "/compare")
    wait_script_run(page)
    out["compare_first_run_s"] = time.perf_counter() - t0
    out["after_compare"] = proc_memory(server.pid)
    out["e2e_compare"] = e2e_patch_changes(page, plan.e2e_clicks, cfg.grid, start, prefix="compare")
    # the most the page can hold: every listed one shown
    page.goto(server.url + "/compare?show=" + quote(show_value(listed), safe=",/"))
    wait_script_run(page)
    out["after_compare_all"] = proc_memory(server.pid)
    return out


# ----------------------------------------------------------------------------- environment
def _first(pattern: str, text: str, default: str = "unknown") -> str:
    m = re.search(pattern, text, re.M)
    return m.group(1).strip() if m else default


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_id(cpuinfo: str) -> str:
    """Vendor, family / model / stepping numbers, vector extensions and hypervisor of the first
    CPU of /proc/cpuinfo (the model name alone can be generic under a hypervisor)."""
    if not cpuinfo:
        return platform.machine() or "unknown"
    field = {k: _first(rf"^{k}\s*:\s*(.*)$", cpuinfo) for k in ("vendor_id", "cpu family", "model", "stepping")}
    flags = _first(r"^flags\s*:\s*(.*)$", cpuinfo, "").split()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return (f"{field['vendor_id']}, family {field['cpu family']} model {field['model']} stepping {field['stepping']}"
            + (f"; {' '.join(isa)}" if isa else "") + ("; under a hypervisor" if "hypervisor" in flags else ""))


def environment(argv: list[str], threads: int) -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    chromium = shutil.which("chromium")
    chromium_version = "not found"
    if chromium:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            res = subprocess.run([chromium, "--version"], capture_output=True, text=True, timeout=30)
            chromium_version = _first(r"^(Chromium.*)$", res.stdout, res.stdout.strip() or "unknown")
    from vitpe_core.train import git_commit
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks.bench" + "".join(" " + shlex.quote(a) for a in argv),
        "cpu": _first(r"^model name\s*:\s*(.*)$", cpuinfo, platform.processor() or "unknown"),
        "cpu_id": cpu_id(cpuinfo),
        "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)), "torch_threads": threads,
        "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
        "numpy": np.__version__, "streamlit": _version("streamlit"), "playwright": _version("playwright"),
        "chromium": chromium_version, "git_commit": git_commit(), "loadavg_start": list(os.getloadavg()),
        "background_start": background_jobs(), "cpp_kernel": cpp_kernel_state(),
    }


def cpp_kernel_state() -> str:
    """Which path the fused SaPE² / CoPE attentions take here (vitpe_core/encodings/_kernels.py);
    builds the kernel if it is not cached yet, so no timed section pays for it."""
    from vitpe_core.encodings import _kernels
    if os.environ.get("VITPE_NO_CPP", "") not in ("", "0"):
        return "off (VITPE_NO_CPP): eager PyTorch"
    return "fused C++ kernel" if _kernels.available() else "eager PyTorch (kernel build failed)"


# ----------------------------------------------------------------------------- targets
@dataclass
class Target:
    key: str
    text: str            # what is measured
    limit: float
    kind: str            # "max": measured <= limit passes; "min": measured >= limit passes
    unit: str            # "x" ratio, "ms", "s", "MiB"
    measured: float | None = None
    note: str = ""
    check: float | None = None   # the best-of-N ratio, for ratio targets

    def verdict(self, value: float | None) -> str:
        if value is None:
            return "NOT MEASURED"
        ok = value <= self.limit if self.kind == "max" else value >= self.limit
        return "PASS" if ok else "MISS"

    @property
    def status(self) -> str:
        return self.verdict(self.measured)

    @property
    def borderline(self) -> bool:
        """Within BORDERLINE of the limit: another run on a loaded machine may flip the verdict."""
        return self.measured is not None and abs(self.measured / self.limit - 1) < BORDERLINE

    @property
    def check_text(self) -> str:
        if self.check is None:
            return "—"
        same = self.verdict(self.check) == self.status
        return f"{_fmt(self.check, self.unit)} ({'same verdict' if same else '**verdict differs**'})"

    @property
    def miss_by(self) -> str:
        if self.status != "MISS":
            return ""
        m, lim = self.measured, self.limit
        if self.kind == "max":
            return f"{_fmt(m - lim, self.unit)} over the limit ({100 * (m / lim - 1):.0f} % over)"
        return f"{_fmt(lim - m, self.unit)} under the limit ({100 * (1 - m / lim):.0f} % under)"


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "x":
        return f"{v:.2f}x"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "s":
        return f"{v:.2f} s"
    return f"{v:.0f} {unit}"


def targets(res: dict) -> list[Target]:
    attn = {(r["width"], r["batch"], r["encoding"]): r for r in res["attention"]}
    train = {r["variant"]: r for r in res["training"]}
    clicks, app = res["clicks"], res["app"]
    mib_1gb = GB / 2**20
    out = [
        # targets of the speed issue: they must hold on Intel and AMD alike (the report names the CPU)
        Target("sape2_attention_vs_rpb", "SaPE² attention layer fwd+bwd / `rpb`, compact, batch 128", 1.3, "max", "x",
               attn.get(("compact", 128, "sape2"), {}).get("vs_rpb"),
               check=attn.get(("compact", 128, "sape2"), {}).get("vs_rpb_best")),
        Target("sape2_training_vs_ape", "SaPE² training throughput / `ape` (compact, batch 128)", 0.8, "min", "x",
               train.get("sape2", {}).get("throughput_vs_ape"),
               check=train.get("sape2", {}).get("throughput_vs_ape_best")),
        Target("cope_training_vs_ape", "CoPE+APE training throughput / `ape` (compact, batch 128)", 0.8, "min", "x",
               train.get("cope+ape", {}).get("throughput_vs_ape"),
               check=train.get("cope+ape", {}).get("throughput_vs_ape_best")),
        Target("bias_click_patch_p95",
               f"bias explorer click, new patch (trace cached), p95 compute, `{clicks['single']}`",
               50, "max", "ms", clicks["bias_patch"]["p95_ms"]),
        Target("bias_click_image_p95", f"bias explorer, new image (cold trace), p95 compute, `{clicks['single']}`",
               50, "max", "ms", clicks["bias_image"]["p95_ms"]),
        Target("compare_click_patch_p95",
               f"compare page click, new patch, p95 compute, {len(clicks['checkpoints'])} checkpoints",
               300, "max", "ms", clicks["compare_patch"]["p95_ms"]),
        Target("compare_click_image_p95",
               f"compare page, new image (cold traces), p95 compute, {len(clicks['checkpoints'])} checkpoints",
               300, "max", "ms", clicks["compare_image"]["p95_ms"]),
    ]
    skipped = "skipped (--skip-app)" if app.get("skipped") else ""
    no_browser = skipped or (app.get("browser_reason") or "")
    after = app.get("after_compare_all") or app.get("after_compare") or {}   # older results: the page loaded all
    out += [
        Target("cold_start_http", "app cold start: process start -> `GET /` answered (HTTP only)", 5, "max", "s",
               app.get("get_root_s"), skipped),
        Target("cold_start_first_element", "app cold start: process start -> first element shown (browser)", 5, "max",
               "s", app.get("first_element_s"), no_browser),
        Target("cold_start_first_run", "app cold start: process start -> first script run complete (browser)", 5,
               "max", "s", app.get("first_run_s"), no_browser),
        Target("app_memory_peak", f"app server peak resident (VmHWM) with all {len(_listed(app))} "
               "listed checkpoints loaded (compare page)", mib_1gb, "max", "MiB", after.get("VmHWM"), no_browser),
        Target("app_memory_rss", "app server resident (VmRSS) after the compare page showing all", mib_1gb, "max",
               "MiB", after.get("VmRSS"), no_browser),
    ]
    an = res.get("analysis")
    if an:
        out.append(Target("analysis_budget", f"`python -m vitpe_core analyze` (`positional.analyze`, no cache), "
                          f"`{an['checkpoint']}`", 30, "max", "s", an.get("wall_s"), an.get("reason", "")))
    return out + vit_b_targets(res)


def vit_b_targets(res: dict) -> list[Target]:
    """Section 6's targets, where the run (or a `--only vit-b` run merged into it) has it."""
    vb = res.get("vit_b")
    if not vb:
        return []
    ape = vb["ape"]
    return [
        Target("vit_b_click_bias_p95", "ViT-B/16 (`ape`, 14×14), bias explorer click, new patch (trace cached), "
               "p95 compute", 100, "max", "ms", ape["clicks"]["bias"]["p95_ms"]),
        Target("vit_b_click_compare_p95", "ViT-B/16 (`ape`, 14×14), compare page click, its panel (trace cached), "
               "p95 compute", 100, "max", "ms", ape["clicks"]["compare"]["p95_ms"]),
        Target("vit_b_image_p95", "ViT-B/16 (`ape`, 224 px), new image: input + trace + attention stats + views, "
               "p95", 2, "max", "s", ape["image"]["total"]["p95_ms"] / 1e3),
    ]


# ----------------------------------------------------------------------------- report
def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _load(avg: list[float]) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


def _jobs_text(jobs: list[dict]) -> str:
    if not jobs:
        return "none"
    names = {"T": "**stopped (paused)**", "R": "running", "D": "running (waiting on I/O)"}
    busy = [j for j in jobs if j["state"] != "S"]
    idle = [j for j in jobs if j["state"] == "S"]
    parts = [f"pid {j['pid']} `{j['args']}`: {names.get(j['state'], j['state'])}" for j in busy]
    if idle:
        parts.append(f"{len(idle)} sleeping (pids {', '.join(str(j['pid']) for j in idle)})")
    return "; ".join(parts)


WHY_TODO = "_TODO (maintainers): explanation not yet written._"
_WHY_LINE = re.compile(r"^\s*\*\*Why:\*\* (.*?) <!-- why:([\w-]+) -->\s*$", re.M)


def written_whys(path: Path) -> dict[str, str]:
    """The maintainers' **Why** texts of an existing BENCHMARKS.md, by target key (kept
    when the file is rewritten and the target is still missed)."""
    if not path.is_file():
        return {}
    return {key: text for text, key in _WHY_LINE.findall(path.read_text()) if text != WHY_TODO}


GENERATOR = "`python -m benchmarks.bench` (benchmarks/bench.py)"


def render_markdown(res: dict, tgts: list[Target], whys: dict[str, str] | None = None) -> str:
    """BENCHMARKS.md from a run's results (`run`'s dict), its targets and the kept **Why** texts."""
    sections = (_md_header(res), _md_machine(res), _md_targets(tgts, whys or {}), _md_attention(res),
                _md_training(res), _md_clicks(res), _md_app(res), _md_memory(res), _md_vit_b(res),
                _md_functional(res), _md_profile(res), _md_analysis(res))
    return "\n".join(line for section in sections for line in section)


def _md_header(res: dict) -> list[str]:
    out = ["# Benchmarks", "",
           f"Generated by {GENERATOR}; the numbers are in "
           "`benchmarks.json` beside this file. Edit only the text of the **Why** lines by hand (a rerun "
           "keeps it while the target is still missed) and rerun the command to refresh the rest. Ratios come "
           "from variants timed round-robin in the same run (paired medians); absolute times are only context "
           "for them.", ""]
    if res["mode"] == "quick":
        out += ["> **QUICK smoke run** (`--quick`): few repetitions, numbers not fit for comparison.", ""]
    return out


def _md_machine(res: dict) -> list[str]:
    env, plan = res["environment"], res["plan"]
    return ["## Machine and run", "", md_table(["", ""], [
        ["date (UTC)", env["date"]], ["command", f"`{env['command']}`"], ["mode", res["mode"]],
        ["CPU", env["cpu"]], ["cores (logical / usable)", f"{env['cores']} / {env['usable_cores']}"],
        ["torch threads", env["torch_threads"]], ["python", env["python"]], ["torch", env["torch"]],
        ["SaPE² / CoPE attention", env.get("cpp_kernel", "not recorded")],
        ["streamlit", env["streamlit"]], ["numpy", env["numpy"]],
        ["playwright / chromium", f"{env['playwright']} / {env['chromium']}"],
        ["platform", env["platform"]], ["git commit", env["git_commit"]],
        ["background `vitpe_core train` at start", _jobs_text(env["background_start"])],
        ["background `vitpe_core train` at end", _jobs_text(env["background_end"])],
        ["load average (1/5/15 min) start → end", f"{_load(env['loadavg_start'])} → {_load(env['loadavg_end'])}"],
        ["wall time of this run", f"{res['wall_time_s']:.0f} s ("
         + ", ".join(f"{k} {v:.0f} s" for k, v in res["section_s"].items()) + ")"],
        ["repetitions", ", ".join(f"{k} {v}" for k, v in plan.items())]]), ""]


def _md_targets(tgts: list[Target], whys: dict[str, str]) -> list[str]:
    """The targets' table, then one line per miss with its **Why** (`whys[key]`, else WHY_TODO)."""
    out = ["## Targets", "", md_table(["target", "measured", "limit", "result", "best-of-N cross-check"], [
        [t.text, _fmt(t.measured, t.unit), ("≤ " if t.kind == "max" else "≥ ") + _fmt(t.limit, t.unit),
         f"**{t.status}**" + (f" ({t.note})" if t.status == "NOT MEASURED" and t.note else "")
         + (f" (borderline: within {BORDERLINE:.0%} of the limit)" if t.borderline else ""), t.check_text]
        for t in tgts]), "",
        "Ratios are paired medians (the verdict); the cross-check is the ratio of the variants' fastest "
        "samples. Latencies are p95 of wall time.", ""]
    if any(t.unit == "MiB" for t in tgts):
        out += ["1 GB is taken as 10⁹ bytes = 954 MiB.", ""]
    misses = [t for t in tgts if t.status == "MISS"]
    for t in misses:
        out += [f"* **MISS — {t.text}**: {_fmt(t.measured, t.unit)}, {t.miss_by}.",
                f"  **Why:** {whys.get(t.key, WHY_TODO)} <!-- why:{t.key} -->"]
    if misses:
        out.append("")
    return out


def _md_attention(res: dict) -> list[str]:
    out = ["## 1. Attention layer, forward + backward", "",
           "`vitpe_core.model.Attention` with the encoding from `build_encoding(name, EncodingContext(D, h, 1, "
           "(8, 8), 1))`, called as `attn(x, pos, (8, 8), layer=0)`, 65 tokens (CLS + 8×8 patches), "
           "backward from a fixed random output gradient into x, the layer's and the encoding's parameters. "
           "`none` = plain SDPA; `rpb` = the floor for bias encodings. Ratios: paired medians; below 1 is "
           "within noise when the encoding has no attention hook.", ""]
    for width in WIDTHS:
        for batch in BATCHES:
            rows = [r for r in res["attention"] if r["width"] == width and r["batch"] == batch]
            if not rows:
                continue
            out += [f"**{width}** (D {rows[0]['dim']}, {rows[0]['heads']} heads), batch {batch}", "",
                    md_table(["encoding", "× none (SDPA)", "× rpb", "best-of-N × none / × rpb", "median ms",
                              "min ms"],
                             [[f"`{r['encoding']}`", _ratio(r, "vs_none"), _ratio(r, "vs_rpb"),
                               f"{r['vs_none_best']:.2f} / {r['vs_rpb_best']:.2f}", f"{r['median_ms']:.2f}",
                               f"{r['min_ms']:.2f}"] for r in rows]), ""]
    if any(r[f"{k}_noisy"] for r in res["attention"] for k in ("vs_none", "vs_rpb")):
        out += [NOISY_NOTE, ""]
    return out


def _md_training(res: dict) -> list[str]:
    steps = (res.get("plan") or {}).get("train_steps_per_sample", 1)
    out = ["## 2. Training throughput (whole model)", "",
           f"Compact preset (D 128, 6 layers, 4 heads, MLP 256, patch 4, 32×32), batch {TRAIN_BATCH}, one "
           "step = forward, label-smoothed cross entropy, backward, grad-norm clip, AdamW (train.py's "
           f"optimiser); random input. A sample is the mean of {steps} consecutive step(s) of one variant, "
           "variants round-robin (training runs one model for many steps). The reference is the same "
           "architecture from plain `torch.nn` "
           "(`nn.TransformerEncoder`, norm_first, GELU, conv patch embed, CLS, learned table)"
           + ("" if any("timm" in r["variant"] for r in res["training"]) else "; timm is not installed, so no "
              "timm ViT row") + ".", "",
           md_table(["variant", "throughput × none", "throughput × ape", "best-of-N × none / × ape", "images/s",
                     "median ms/step", "min ms/step"],
                    [[f"`{r['variant']}`" if "reference" not in r["variant"] else r["variant"],
                      _ratio(r, "throughput_vs_none"), _ratio(r, "throughput_vs_ape"),
                      f"{r['throughput_vs_none_best']:.2f} / {r['throughput_vs_ape_best']:.2f}",
                      f"{r['images_per_s']:.0f}", f"{r['median_step_ms']:.0f}", f"{r['min_step_ms']:.0f}"]
                     for r in res["training"]]), ""]
    if any(r[f"{k}_noisy"] for r in res["training"] for k in ("throughput_vs_none", "throughput_vs_ape")):
        out += [NOISY_NOTE, ""]
    return out


def _md_functional(res: dict) -> list[str]:
    rows = res.get("functional")
    if not rows:
        return []
    return ["## 7. SaPE² and CoPE as functions (for your own model)", "",
            "`vitpe_core.encodings.functional.sape2_attention(q, k, v, e_x, e_y, grid, num_prefix=1)` and "
            "`cope_attention(q, k, v, e)` (the whole attention, logits formed once, hand-written backward) "
            "against `F.scaled_dot_product_attention` with an additive mask: `rpb`'s bias (the floor for a "
            "bias encoding), or the bias functions `sape2_bias` / `cope_bias` (what plugging the bias into "
            f"one's own SDPA layer costs). Compact shapes: batch {TRAIN_BATCH}, 4 heads, 65 tokens, d 32; "
            "forward + backward into q, k, v and the tables; paired medians.", "",
            md_table(["variant", f"× {FUNCTIONAL_BASE}", "best-of-N", "median ms", "min ms"],
                     [[r["variant"], _ratio(r, "vs_base"), f"{r['vs_base_best']:.2f}", f"{r['median_ms']:.2f}",
                       f"{r['min_ms']:.2f}"] for r in rows]), ""]


def _profile_rows(phase: dict, top: int = PROFILE_TOP) -> list[list[Any]]:
    ops = sorted(phase["ops"].items(), key=lambda kv: -kv[1]["self_ms"])
    total = sum(v["self_ms"] for v in phase["ops"].values()) or 1.0
    return [[f"`{name}`", f"{v['self_ms']:.2f}", f"{100 * v['self_ms'] / total:.1f} %", f"{v['calls']:g}"]
            for name, v in ops[:top]]


def _md_profile(res: dict) -> list[str]:
    pr = res.get("profile")
    if not pr:
        return []
    out = ["## 8. Profile of the SaPE² attention layer", "",
           f"`torch.profiler` (CPU) over {pr['steps']} forward + backward steps of the compact `sape2` layer of "
           f"section 1 (batch {TRAIN_BATCH}, {pr['threads']} threads), in a child process; ops by self CPU time "
           f"per step, top {PROFILE_TOP} per phase. **Before**: `vitpe_core` at {pr['before_commit']} (the "
           "bias computed apart, then SDPA-style softmax under autograd); **now**: this commit (fused "
           "`sape2_attention`). Self times include the profiler's overhead and, on a loaded machine, time "
           "waiting for a CPU: compare the shares and the phases' totals, not single rows.", ""]
    for label, key in (("Before", "before"), ("Now", "after")):
        if key not in pr:
            out += [f"**{label}**: {pr.get('before_reason', 'not measured')}.", ""]
            continue
        for phase in ("forward", "backward"):
            ph = pr[key][phase]
            out += [f"**{label}, {phase}** (phase wall time {ph['wall_ms']:.1f} ms per step)", "",
                    md_table(["op", "self ms / step", "share", "calls / step"], _profile_rows(ph)), ""]
    return out


def _md_analysis(res: dict) -> list[str]:
    an = res.get("analysis")
    if not an:
        return []
    if "wall_s" not in an:
        return ["## 9. Analysis budget", "", f"Not measured: {an['reason']}.", ""]
    return ["## 9. Analysis budget", "",
            f"`vitpe_core.positional.analyze` on `checkpoints/{an['checkpoint']}.safetensors` (what `python -m "
            "vitpe_core analyze` runs, without its cache): position-only kernels, relative score, attention "
            f"distance and entropy over {an['images']} gallery images, in this process.", "",
            md_table(["checkpoint", "wall s", "CPU s (all threads)", "limit"],
                     [[f"`{an['checkpoint']}`", f"{an['wall_s']:.1f}", f"{an['cpu_s']:.1f}", "30 s"]]), ""]


CLICK_ROWS = (("bias explorer", "single", "new patch (trace cached)", "bias_patch"),
              ("bias explorer", "single", "new image (cold trace)", "bias_image"),
              ("compare", "all", "new patch (traces cached)", "compare_patch"),
              ("compare", "all", "new image (cold traces)", "compare_image"))


def _md_clicks(res: dict) -> list[str]:
    c = res["clicks"]
    who = {"single": f"`{c['single']}`" + (" (freshly built compact model, random weights)" if c["single_fresh"]
                                           else ""),
           "all": f"all {len(c['checkpoints'])}"}
    return ["## 3. Click compute (app, without Streamlit)", "",
            "The calls the pages make, without the Streamlit cache (benchmarks/bench.py `bias_page_compute`, "
            "`compare_page_compute`, `cold_trace`, calling `vitpe_core.views` as pages/bias.py and "
            "pages/compare.py do): a new patch = per-patch maps from a cached trace and the page's views "
            "(compare: plus each checkpoint's positional component); a new image = gallery image → "
            "`inputs.checkpoint_input` → `analysis.trace_image` (compare: plus `attention_stats`) → the same views. "
            f"All layers and heads, layer 0 / mean of heads shown. Images cycle through the {len(c['images'])} "
            "gallery images. Not included: Streamlit's cache copy, widgets, Plotly figures, transport (see "
            "section 4's browser numbers). p50 / p95 / max are wall-clock latency (what the targets judge); the "
            "CPU columns are this process's CPU time over all its threads, context for a loaded machine.", "",
            md_table(["page", "checkpoints", "click", "n", "p50 ms", "p95 ms", "max ms", "CPU p50 ms", "CPU p95 ms"], [
                [page, who[whom], what, c[k]["n"], f"{c[k]['p50_ms']:.1f}", f"{c[k]['p95_ms']:.1f}",
                 f"{c[k]['max_ms']:.1f}", f"{c[k]['cpu_p50_ms']:.1f}", f"{c[k]['cpu_p95_ms']:.1f}"]
                for page, whom, what, k in CLICK_ROWS]), "",
            _checkpoint_note(c["checkpoints"], c["fresh"]), ""]


def _md_app(res: dict) -> list[str]:
    app = res["app"]
    out = ["## 4. App cold start and browser end to end", ""]
    if app.get("skipped"):
        return out + ["Not measured in this run (`--skip-app`).", ""]
    out += ["`python -m streamlit run app.py --server.headless true --server.port <free>` with "
            "`VITPE_CHECKPOINTS` set to the checkpoint folder; times from process start, median over "
            f"{len(app['runs'])} cold starts (each run listed in benchmarks.json). The default page is the "
            f"bias explorer on `{app['default']}`.", ""]
    rows = [["`/_stcore/health` answers ok (HTTP)", _fmt(app.get("health_s"), "s")],
            ["`GET /` answered 200 (HTTP)", _fmt(app.get("get_root_s"), "s")]]
    if app["browser"]:
        rows += [["first element (`h1`) visible (chromium)", _fmt(app.get("first_element_s"), "s")],
                 ["first script run complete (chromium)", _fmt(app.get("first_run_s"), "s")]]
        if "compare_first_run_s" in app:
            loaded = len(app["checkpoints"]) if "after_compare_all" in app else len(_listed(app))
            rows += [[f"compare page, first run: {loaded} checkpoints loaded, the default "
                      f"{len(app['checkpoints'])} shown (after the bias page)", _fmt(app["compare_first_run_s"], "s")]]
    out += [md_table(["measure", "median"], rows), "",
            "HTTP readiness is the server and its static page shell; the app's Python script (imports, "
            "checkpoint, trace, figures) runs only when a browser session connects, which the browser rows "
            "include.", ""]
    if not app["browser"]:
        out += [f"Browser measurements not taken: {app['browser_reason']}.", ""]
    if app.get("e2e_bias"):
        e2e = [("bias explorer", app["e2e_bias"]), ("compare", app.get("e2e_compare", []))]
        out += ["Patch change end to end (informational, no target): type a row into the patch's row input, "
                "press Enter, until the new patch is shown and the rerun finished — includes the "
                "Streamlit rerun, Plotly figures and rendering in headless chromium.", "",
                md_table(["page", "n", "p50 ms", "max ms"],
                         [[p, len(v), f"{np.percentile(v, 50):.0f}", f"{max(v):.0f}"] for p, v in e2e if v]), ""]
    return out


def _listed(app: dict) -> list[str]:
    """The checkpoints the app listed (its groups' too); results from before this was recorded
    listed only the main folder's."""
    return app.get("listed") or app.get("checkpoints") or []


def _md_memory(res: dict) -> list[str]:
    app = res["app"]
    rows = [[f"training `{r['encoding']}`, {r['what']}", f"{r['vmhwm_mib']:.0f}", f"{r['vmrss_mib']:.0f}"]
            for r in res["memory"]["training"]]
    first = app["runs"][-1].get("after_first_page_mib") if app.get("runs") else None
    if first:
        rows.append(["app server after the first (bias) page", f"{first['VmHWM']:.0f}", f"{first['VmRSS']:.0f}"])
    if app.get("after_compare_all"):            # the page loads what it shows (since 2026-12-02)
        for key, what in (("after_compare", f"the default {len(app['checkpoints'])} shown and loaded"),
                          ("after_compare_all", f"then all {len(_listed(app))} listed shown and loaded")):
            mem = app[key]
            rows.append([f"app server after the compare page ({what})", f"{mem['VmHWM']:.0f}", f"{mem['VmRSS']:.0f}"])
    elif app.get("after_compare"):
        mem = app["after_compare"]
        rows.append([f"app server after the compare page (all {len(_listed(app))} listed checkpoints loaded, "
                     f"{len(app['checkpoints'])} shown)",
                     f"{mem['VmHWM']:.0f}", f"{mem['VmRSS']:.0f}"])
    out = ["## 5. Peak memory", "",
           "Training: a subprocess builds the compact model, trains on random data at batch "
           f"{TRAIN_BATCH} (train.py's step) and waits; VmHWM / VmRSS read from `/proc/<pid>/status`. "
           "App: the streamlit server process of the last cold start.", "",
           md_table(["process", "VmHWM MiB", "VmRSS MiB"], rows), ""]
    if app.get("skipped"):
        out += ["App memory not measured in this run (`--skip-app`).", ""]
    elif not app.get("after_compare"):
        out += [f"App memory not measured: {app.get('browser_reason') or 'the browser part did not run'}.", ""]
    return out


VIT_B_HEADING = "## 6. ViT-B/16 at real size"
_MIB = 2 ** 20


def _mib(b: float) -> str:
    return f"{b / _MIB:.1f}"


def _steps_rows(steps: dict, label: str) -> list[list[Any]]:
    names = {"input": "`inputs.checkpoint_input` (crop, resize, normalise)", "trace": "`analysis.trace_image`",
             "stats": "`analysis.attention_stats`", "views": "first patch's views (bias page + compare panel)",
             "total": f"**{label}, total**"}
    return [[names[k], steps[k]["n"], f"{steps[k]['p50_ms']:.0f}", f"{steps[k]['p95_ms']:.0f}",
             f"{steps[k]['max_ms']:.0f}", f"{steps[k]['cpu_p50_ms']:.0f}" if "cpu_p50_ms" in steps[k] else "—"]
            for k in names if k in steps]


STEP_HEADERS = ["step", "n", "p50 ms", "p95 ms", "max ms", "CPU p50 ms"]


def _md_vit_b(res: dict) -> list[str]:
    vb = res.get("vit_b")
    if not vb:
        return []
    env, ape, sape = vb["environment"], vb["ape"], vb.get("sape2+ape")
    cfg, grid, T = vb["config"], ape["grid"], ape["tokens"]
    L, h = cfg["depth"], cfg["heads"]
    tb = ape["trace_bytes"]
    from pages.common.cache import TRACE_CACHE_BYTES as cache_bytes   # the app's own bound
    out = [f"{VIT_B_HEADING} (imported-model scale)", "",
           f"A ViT-B/16-sized model — D {cfg['dim']}, {L} layers, {h} heads, MLP {cfg['mlp_dim']}, patch "
           f"{cfg['patch_size']}, {cfg['img_size'][0]}×{cfg['img_size'][1]} px ({grid[0]}×{grid[1]} grid, T = {T} "
           f"tokens), {cfg['num_classes']} classes, {ape['parameters'] / 1e6:.1f} M parameters — with random weights "
           "(`ViTConfig` / `build_model`, `encoding=\"ape\"`), held as the app holds an imported timm model "
           "(metrics from `vitpe_core.importers.Imported.metrics`: timm's eval transform, crop_pct 0.875, "
           "ImageNet mean / std). Timed on the calls the pages make, in one process, without Streamlit "
           "(benchmarks/bench.py `bench_vit_b`): a **new image** = `inputs.checkpoint_input` → "
           "`analysis.trace_image` → `analysis.attention_stats` → the first patch's views; a **click** on a new "
           "patch with the trace cached = the bias explorer's calls (`analysis.patch_maps`, `views.top_class`, "
           "`bias_parts`, `bias_view` when there is a bias, `attention_view`, `prefix_share`) or the compare "
           "page's panel for this model (`clamp_view`, `pick_stat`, `analysis.positional_component`, "
           "`views.panel_view`). Layer 0, mean of heads shown; all layers and heads computed. Images cycle "
           f"through the {len(vb['images'])} gallery images; patches are pseudo-random. Compute per click does "
           "not depend on the weights' values.", "",
           f"Run: `{env['command']}` at {env['date']} (mode {vb['mode']}, {vb['wall_time_s']:.0f} s), commit "
           f"{env['git_commit']}. **CPU: {env['cpu']}** ({env.get('cpu_id', 'vendor not recorded')}), "
           f"{env['cores']} logical / {env['usable_cores']} usable cores, torch {env['torch']} with "
           f"{vb['threads']} threads. Background `vitpe_core train` at start: {_jobs_text(env['background_start'])}; "
           f"at end: {_jobs_text(env['background_end'])}. Load average start → end: "
           f"{_load(env['loadavg_start'])} → {_load(env['loadavg_end'])}"
           + (f"; other processes kept {100 * env['others_cpu_share']:.0f} % of the usable CPU time busy during "
              "the section" if "others_cpu_share" in env else "") + ". CPU columns: this process's CPU time over "
           "all its threads (up to threads × wall time): wall time well above CPU time / threads means waiting "
           "for CPUs others held.", "",
           "**New image** (`ape`; ms; the first image, untimed, took "
           f"{ape['first_image_ms']['total']:.0f} ms):", "",
           md_table(STEP_HEADERS, _steps_rows(ape["image"], "new image")), "",
           f"Fastest new image: {min(ape['image']['total']['samples_ms']):.0f} ms. A spread far above it comes "
           "from other processes holding a CPU (see the share above), not from the image: the work per image "
           "is the same for every image.", "",
           "**Click on a new patch, trace cached** (`ape`; wall-clock ms; CPU = this process's CPU time):", "",
           md_table(["click", "n", "p50 ms", "p95 ms", "max ms", "CPU p50 ms"], [
               [what, c[k]["n"], f"{c[k]['p50_ms']:.1f}", f"{c[k]['p95_ms']:.1f}", f"{c[k]['max_ms']:.1f}",
                f"{c[k]['cpu_p50_ms']:.1f}"]
               for c in [ape["clicks"]] for k, what in (
                   ("bias", "bias explorer (no bias for `ape`: attention row, prefix share)"),
                   ("compare", "compare page, this model's panel and row"),
                   ("cache_copy", "not in the targets: Streamlit's copy of the cached trace on every rerun "
                                  f"(`pickle.loads` of {_mib(tb['pickled'])} MiB)"))]), "",
           ]
    # the trace's size and what the app would keep
    per = tb["pickled"]
    out += ["**Trace size.** One image's trace keeps every layer's and head's attention, "
            f"(L, h, T, T) = ({L}, {h}, {T}, {T}) float32 = {_mib(tb['attn'])} MiB for `ape` "
            f"({_mib(per)} MiB pickled)"
            + (f"; `sape2+ape` adds its bias (same shape) and SaPE²'s x and y parts ((L, h, N, N) each): "
               f"{_mib(sape['trace_bytes']['total'])} MiB ({_mib(sape['trace_bytes']['pickled'])} MiB pickled)"
               if sape else "")
            + f". The app caches traces with `st.cache_data(max_entries=64, max_size={_mib(cache_bytes)} MiB)` "
            f"(pages/common/cache.py `_trace`; the stress test's `_transformed` alike): entries alone would allow "
            f"64 images × {_mib(per)} MiB = {64 * per / 2**30:.2f} GiB of pickled traces for one such model"
            + (f" ({64 * sape['trace_bytes']['pickled'] / 2**30:.1f} GiB for `sape2+ape`)" if sape else "")
            + f"; the byte bound keeps about {int(cache_bytes // per)} of them"
            + (f" ({int(cache_bytes // sape['trace_bytes']['pickled'])} `sape2+ape` ones)" if sape else "")
            + ". Every rerun (each click) unpickles "
            f"its own copy: {ape['clicks']['cache_copy']['p50_ms']:.0f} ms p50 / "
            f"{ape['clicks']['cache_copy']['p95_ms']:.0f} ms p95 here, on top of the click compute above, and "
            f"{_mib(per)} MiB more while the run lasts.", "",
            "**What to keep.** One trace is affordable (the model's "
            f"float32 weights alone are {_mib(4 * ape['parameters'])} MiB); 64 of them are not, and each rerun "
            "copies a whole one for a click that reads a few rows of it. The full (L, h, T, T) array is still "
            "needed while any patch can be clicked next (a click "
            "reads the query's row in every layer and head, `patch_maps`; the per-image statistics are cached "
            "apart, (L, h) each), so the caches bound and could share it rather than cut it: "
            "(1) the trace caches are bounded by bytes as well as entries (done, above); proposals not "
            "implemented: "
            "(2) hold traces in a byte-bounded server-wide LRU (`st.cache_resource` over "
            "`vitpe_core.store.LRUStore`, as imported models are, arrays made read-only) so that a click slices "
            "the stored arrays instead of unpickling a copy (the cache-copy row above); "
            "(3) optionally store attn / bias / parts as float16 after `attention_stats` has read the float32 "
            f"arrays: {_mib(per / 2)} MiB per `ape` trace, rounding each value by at most 0.05 % (float16's 11-bit "
            "significand; under 6·10⁻⁵, by at most 3·10⁻⁸), invisible in the maps. "
            "Recomputing the trace on each click instead would cost the `trace_image` row above per click, "
            "over the 100 ms click target.", ""]
    mem = vb.get("memory") or []
    if mem:
        out += ["**Resident memory** of a subprocess (`_VIT_B_CHILD`: the same model, one gallery image) at each "
                "stage, read from `/proc/<pid>/status` (VmHWM: the peak so far):", "",
                md_table(["stage", "VmRSS MiB", "VmHWM MiB"],
                         [[r["what"], f"{r['vmrss_mib']:.0f}", f"{r['vmhwm_mib']:.0f}"] for r in mem]), ""]
        by = {r["stage"]: r for r in mem}
        if "trace" in by and "model" in by:
            grow = by["trace"]["vmrss_mib"] - by["model"]["vmrss_mib"]
            out += [f"A process with the ViT-B/16 model and one cached trace is resident at "
                    f"**{by['trace']['vmrss_mib']:.0f} MiB** ({by['model']['vmrss_mib']:.0f} MiB with the model "
                    f"alone, {by['imported']['vmrss_mib']:.0f} MiB before it; peak {by['trace']['vmhwm_mib']:.0f} "
                    f"MiB during the forward pass). Of the {grow:.0f} MiB the trace stage added, "
                    f"{_mib(tb['total'])} MiB are the trace's arrays; the rest is memory the allocator kept from "
                    "the forward pass, which later allocations (the cache's pickled bytes and copy) reuse. The "
                    "app server adds Streamlit and its other caches (section 5).", ""]
    if sape is None:
        return out
    out += [f"**`sape2+ape` at the same size** (new images stop after one over {VIT_B_SAPE2_LIMIT_S:.0f} s):", ""]
    if sape.get("over_limit"):
        out += [f"One image took {sape['image']['total']['max_ms'] / 1e3:.1f} s (over {VIT_B_SAPE2_LIMIT_S:.0f} s): "
                "not timed further.", ""]
    out += [md_table(STEP_HEADERS, _steps_rows(sape["image"], "new image")), ""]
    if sape.get("clicks"):
        c = sape["clicks"]
        out += [md_table(["click (`sape2+ape`)", "n", "p50 ms", "p95 ms", "max ms"], [
            [what, c[k]["n"], f"{c[k]['p50_ms']:.1f}", f"{c[k]['p95_ms']:.1f}", f"{c[k]['max_ms']:.1f}"]
            for k, what in (("bias", "bias explorer (SaPE² x + y bias row: `bias_view`)"),
                            ("compare", "compare page, this model's panel (bias row)"),
                            ("cache_copy", f"Streamlit's copy of the cached trace "
                                           f"({_mib(sape['trace_bytes']['pickled'])} MiB), not in the targets"))
            if k in c]), ""]
    return out


NOISY_NOTE = (f"† the paired median and the best-of-N ratio differ by more than {NOISY:.0%}: the machine's load "
              "disturbed this comparison; read both (samples in benchmarks.json).")


def _ratio(row: dict, key: str) -> str:
    return f"{row[key]:.2f}" + (" †" if row[f"{key}_noisy"] else "")


def _checkpoint_note(names: list[str], fresh: list[str]) -> str:
    real = [n for n in names if n not in fresh]
    text = f"Checkpoints: {len(names)} ({', '.join(f'`{n}`' for n in names)}). "
    text += (f"From `checkpoints/`: {', '.join(f'`{n}`' for n in real)}. " if real else "`checkpoints/` held none. ")
    if fresh:
        text += (f"Freshly built compact models with random weights (same format and size, 15-epoch history): "
                 f"{', '.join(f'`{n}`' for n in fresh)}.")
    return text


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


# ----------------------------------------------------------------------------- main
def run(plan: Plan, *, out: Path, skip_app: bool, argv: list[str], checkpoints: Path, mode: str) -> dict:
    t_start = time.perf_counter()
    env = environment(argv, torch.get_num_threads())
    encodings = available_encodings()
    res: dict[str, Any] = {"schema": 1, "mode": mode, "environment": env, "plan": asdict(plan), "section_s": {}}

    def section(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        value = fn()
        res["section_s"][name] = time.perf_counter() - t0
        gc.collect()
        return value

    res["attention"] = section("attention", lambda: bench_attention(plan, encodings))
    res["training"] = section("training", lambda: bench_training(plan, encodings))
    res["memory"] = {"training": section("training_memory", lambda: bench_train_memory(plan))}
    with checkpoint_set(checkpoints) as cs, tempfile.TemporaryDirectory(prefix="vitpe-bench-") as work:
        res["clicks"] = section("clicks", lambda: bench_clicks(plan, cs))
        res["app"] = {"skipped": True} if skip_app else section("app", lambda: bench_app(plan, cs, Path(work)))
    if plan.vit_b_images > 0:
        res["vit_b"] = section("vit_b", lambda: vit_b_section(plan, argv, mode))
    if plan.functional_rounds > 0:
        res["functional"] = section("functional", lambda: bench_functional(plan))
    if plan.profile_steps > 0:
        res["profile"] = section("profile", lambda: bench_profile(plan))
    if plan.analysis:
        res["analysis"] = section("analysis", lambda: bench_analysis(checkpoints))
    env["loadavg_end"] = list(os.getloadavg())
    env["background_end"] = background_jobs()
    res["wall_time_s"] = time.perf_counter() - t_start
    tgts = targets(res)
    res["targets"] = [{**asdict(t), "status": t.status, "miss_by": t.miss_by, "borderline": t.borderline}
                      for t in tgts]
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks.json").write_text(json.dumps(_jsonable(res), indent=1) + "\n")
    whys = written_whys(out / "BENCHMARKS.md")
    (out / "BENCHMARKS.md").write_text(render_markdown(res, tgts, whys) + "\n")
    return res


def replace_section(md: str, heading: str, lines: list[str]) -> str:
    """`md` with its section that starts with the line `heading...` (up to the next `## `
    heading) replaced by `lines`; appended at the end when it has none."""
    text = "\n".join(lines).rstrip("\n") + "\n"
    m = re.search(rf"^{re.escape(heading)}.*$", md, re.M)
    if m is None:
        return md.rstrip("\n") + "\n\n" + text
    nxt = re.search(r"^## ", md[m.end():], re.M)
    end = m.end() + nxt.start() if nxt else len(md)
    return md[:m.start()] + text + ("\n" if nxt else "") + md[end:]


def run_vit_b_only(plan: Plan, *, out: Path, argv: list[str], mode: str) -> dict:
    """`--only vit-b`: section 6 alone, merged into the report in `out` (an earlier run's
    benchmarks.json): its `vit_b` and `targets` are replaced, and in BENCHMARKS.md only the
    Targets table and section 6; the other sections and their numbers are left as they are."""
    if plan.vit_b_images < 1:
        raise ValueError("this plan times no ViT-B images (vit_b_images = 0)")
    json_path, md_path = out / "benchmarks.json", out / "BENCHMARKS.md"
    if not json_path.is_file() or not md_path.is_file():
        raise FileNotFoundError(f"--only vit-b adds its section to an earlier report: {json_path} and {md_path} "
                                "are needed (run `python -m benchmarks.bench` once)")
    res = json.loads(json_path.read_text())
    res["vit_b"] = vit_b_section(plan, argv, mode)
    tgts = targets(res)
    res["targets"] = [{**asdict(t), "status": t.status, "miss_by": t.miss_by, "borderline": t.borderline}
                      for t in tgts]
    json_path.write_text(json.dumps(_jsonable(res), indent=1) + "\n")
    md = md_path.read_text()
    md = replace_section(md, "## Targets", _md_targets(tgts, written_whys(md_path)))
    md_path.write_text(replace_section(md, VIT_B_HEADING, _md_vit_b(res)))
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: few repetitions (numbers not comparable)")
    p.add_argument("--skip-app", action="store_true", help="skip the app parts (cold start, browser, app memory)")
    p.add_argument("--only", choices=["vit-b"], help="run one section alone and write it into the existing "
                   "report in --out (vit-b: section 6, the ViT-B/16-sized model; the targets table is rewritten, "
                   "the other sections are kept)")
    p.add_argument("--out", type=Path, default=REPO, help="folder for BENCHMARKS.md and benchmarks.json "
                   "(default: the repository root)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--checkpoints", type=Path, default=REPO / "checkpoints",
                   help="folder of trained checkpoints (default: checkpoints/)")
    p.add_argument("--kernel-ab", choices=["layer", "train"], help="only compare SaPE² / CoPE with and without the "
                   "fused C++ kernel, interleaved (layer vs rpb, or training vs ape), print the ratios; writes nothing")
    p.add_argument("--rounds", type=int, default=30, help="rounds for --kernel-ab (default 30)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads:
        if args.threads < 1:
            p.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    if args.kernel_ab:
        print("\n".join(kernel_ab(args.kernel_ab, args.rounds)))
        return 0
    plan, mode = (QUICK, "quick") if args.quick else (FULL, "full")
    if args.only == "vit-b":
        try:
            res = run_vit_b_only(plan, out=args.out, argv=argv, mode=mode)
        except FileNotFoundError as e:
            p.error(str(e))
        for t in vit_b_targets(res):
            print(f"{t.status:>12}  {_fmt(t.measured, t.unit):>10}  {t.text}")
        print(f"wrote section 6 and the targets into {args.out / 'BENCHMARKS.md'} and benchmarks.json in "
              f"{res['vit_b']['wall_time_s']:.0f} s")
        return 0
    res = run(plan, out=args.out, skip_app=args.skip_app, argv=argv, checkpoints=args.checkpoints, mode=mode)
    for t in res["targets"]:
        print(f"{t['status']:>12}  {_fmt(t['measured'], t['unit']):>10}  {t['text']}")
    print(f"wrote {args.out / 'BENCHMARKS.md'} and benchmarks.json in {res['wall_time_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
