"""Section 8 of the benchmark: `torch.profiler` op table of the compact SaPE² attention layer,
at `PROFILE_BEFORE` (main before the fused SaPE² / CoPE attention) and as it is now.

Each profile runs in a child process (`python -m benchmarks.probes.profile_sape2`) that
imports `vitpe_core` from the folder given: the repository, or the commit's `vitpe_core`
unpacked with `git archive` into a temporary folder.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import REPO
from benchmarks.timing import Plan

log = logging.getLogger(__name__)

PROFILE_BEFORE = "5405daa"   # main before the fused SaPE² / CoPE attention (issue 14): the "before" profile
PROFILE_TOP = 12             # ops per phase in the report


def profile_layer(root: Path, steps: int, threads: int) -> dict:
    """`torch.profiler` op table of the compact SaPE² layer (batch 128) by phase, in a child
    process importing `vitpe_core` from `root` (and `benchmarks` from this repository)."""
    path = os.pathsep.join(dict.fromkeys((str(root), str(REPO))))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.probes.profile_sape2", str(steps), str(threads)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
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
