"""How the benchmark times (`python -m benchmarks.bench`): the repetitions of a run (`Plan`,
`FULL`, `QUICK`) and the numbers method shared by every section.

The variants of one comparison run round-robin, the starting variant rotating every round, so
load changes hit all of them alike (`interleaved`); a variant's time is the median over rounds
and a ratio is the median of the per-round ratios (`paired_ratio`, the verdict of a target).
Beside it, the ratio of the variants' fastest samples (`best_ratio`) is a cross-check: load
only adds time, and where the two differ by more than `NOISY` the report flags the row. A timed
sample repeats a call as often as fits `min_sample_s` in a calibration pass (batch-1 layers
take a fraction of a millisecond).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

NOISY = 0.2          # paired-median and best-of-N ratios further apart than this: flagged


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


FULL = Plan(attn_rounds=7, attn_min_sample_s=0.1, train_rounds=8, warmup=1, clicks=50, app_runs=5, e2e_clicks=6,
            memory_steps=3, vit_b_images=20, vit_b_clicks=50, vit_b_sape2_images=5, functional_rounds=7,
            profile_steps=5, analysis=True, train_steps_per_sample=3)
QUICK = Plan(attn_rounds=2, attn_min_sample_s=0.0, train_rounds=1, warmup=0, clicks=8, app_runs=1, e2e_clicks=2,
             memory_steps=1, memory_encodings=("sape2+ape",), vit_b_images=2, vit_b_clicks=4, vit_b_sape2_images=1,
             functional_rounds=2, profile_steps=1, analysis=True)


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
    """p50 / p95 / max of millisecond samples, keys prefixed with `prefix` (e.g. `cpu_`)."""
    a = np.asarray(ms)
    return {f"{prefix}p50_ms": float(np.percentile(a, 50)), f"{prefix}p95_ms": float(np.percentile(a, 95)),
            f"{prefix}max_ms": float(a.max())}


def timed_kinds(kinds: dict[str, Callable[..., object]], calls: list[tuple]) -> tuple[dict, dict]:
    """Wall and CPU ms (this process, all threads) of each kind for each argument tuple of
    `calls`, the kinds interleaved call by call: (wall, cpu), each kind -> list of ms."""
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for args in calls:
        for kind, fn in kinds.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn(*args)
            wall[kind].append(1e3 * (time.perf_counter() - w0))
            cpu[kind].append(1e3 * (time.process_time() - c0))
    return wall, cpu
