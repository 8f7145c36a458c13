"""The shapes of a checkpoint's metrics that readers rely on, and the cleaning that enforces them.

`vitpe_core.train` writes metrics as JSON (test and structure results, resolution and
translation tables, curves one value per epoch, recipe, strings such as notes); `importers`
adds an imported model's eval transform (`preprocess`). `sanitize_metrics` returns metrics of
exactly those shapes, and names what it had to drop, for readers (the app) that must survive
metrics edited by hand or written by other tools. A pure function of the dict: nothing is
written back to the checkpoint.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np


def _number(v: Any) -> float | int | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
    return v if ok else None


def _numbers(d: Mapping) -> dict[str, Any]:
    """A flat result dict: numbers stay, integer lists (grid, shift_px) stay, anything else is None."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            out[str(k)] = v
        else:
            out[str(k)] = _number(v)
    return out


def _valid_preprocess(pre: Any) -> bool:
    """An imported model's eval transform as `importers` writes it."""
    if not isinstance(pre, dict):
        return False
    mean, std, crop = pre.get("mean"), pre.get("std"), _number(pre.get("crop_pct"))
    three = lambda v: isinstance(v, list) and len(v) == 3 and all(_number(x) is not None for x in v)
    return three(mean) and three(std) and min(std) > 0 and crop is not None and 0 < crop <= 1


def sanitize_metrics(metrics: Any) -> tuple[dict[str, Any], list[str]]:
    """Metrics with the shapes `vitpe_core.train` writes, and the keys that had to be dropped or
    emptied. For readers (the app) that must survive metrics edited by hand or written by other
    tools; the checkpoint file itself is left as it is."""
    if not isinstance(metrics, dict):
        return {}, [f"metrics is a {type(metrics).__name__}, not an object"]
    out, problems = dict(metrics), []

    def drop(key: str, why: str) -> None:
        out.pop(key, None)
        problems.append(f"{key}: {why}")

    for key in ("test", "structure"):
        if key in out:
            if isinstance(out[key], dict):
                out[key] = _numbers(out[key])
            else:
                drop(key, "not an object")
    for key in ("resolution", "translation"):
        if key in out:
            if isinstance(out[key], dict):
                rows = {str(k): _numbers(v) for k, v in out[key].items() if isinstance(v, dict)}
                if len(rows) < len(out[key]):
                    problems.append(f"{key}: {len(out[key]) - len(rows)} entries are not objects")
                out[key] = rows
            else:
                drop(key, "not an object")
    if "recipe" in out and not isinstance(out["recipe"], dict):
        drop("recipe", "not an object")
    for key in ("epochs", "steps", "wall_time_s", "images_per_s", "parameters"):
        if key in out and _number(out[key]) is None:
            drop(key, "not a number")
    if "preprocess" in out and not _valid_preprocess(out["preprocess"]):
        drop("preprocess", "not {mean: [3 numbers], std: [3 positive numbers], crop_pct: (0, 1]}")
    for key in ("notes", "git_commit", "device", "torch"):
        if key in out and not isinstance(out[key], str):
            drop(key, "not a string")
    if "curves" in out:
        curves = out["curves"]
        if not isinstance(curves, dict):
            drop("curves", "not an object")
        else:
            series = {str(k): [_number(x) for x in v] for k, v in curves.items() if isinstance(v, list)}
            n = len(series.get("epoch", []))
            bad = [k for k, v in series.items() if (n and len(v) != n) or (v and all(x is None for x in v))]
            series = {k: v for k, v in series.items() if k not in bad}
            if bad or len(series) + len(bad) < len(curves):
                problems.append("curves: series dropped (not numbers, or not one value per epoch): "
                                + ", ".join(sorted(set(curves) - set(series))))
            out["curves"] = series
    return out, problems
