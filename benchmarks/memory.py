"""Section 5 of the benchmark, training side: the peak memory (VmHWM) of a subprocess that
trains a compact model (`python -m benchmarks.probes.train_memory`); and `probe_process`, how
the benchmark runs its memory probes (`benchmarks.probes`). The app server's memory is measured
in `benchmarks.app`."""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from typing import Iterator

import torch

from benchmarks.harness import REPO, proc_memory
from benchmarks.timing import Plan
from benchmarks.training import TRAIN_BATCH

log = logging.getLogger(__name__)


@contextlib.contextmanager
def probe_process(module: str, args: list[str], threads: int, *, wait_s: float) -> Iterator[subprocess.Popen]:
    """`python -m module *args` from the repository with `threads` OpenMP threads and piped
    stdin/stdout/stderr (the memory probes answer on stdout and wait on stdin); on leaving,
    stdin is closed and the child given `wait_s` to exit before it is killed."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env, stdin=subprocess.PIPE,
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
    args = [encoding, str(steps), str(TRAIN_BATCH)]
    with probe_process("benchmarks.probes.train_memory", args, threads, wait_s=30) as proc:
        line = proc.stdout.readline()
        if line.strip() != "done":
            raise RuntimeError(f"training subprocess failed: {proc.stderr.read()[-2000:]}")
        mem = proc_memory(proc.pid)
    return {"encoding": encoding, "steps": steps, "batch": TRAIN_BATCH, "vmhwm_mib": mem["VmHWM"],
            "vmrss_mib": mem["VmRSS"]}


def bench_train_memory(plan: Plan) -> list[dict]:
    """The import + build baseline (0 steps), then `plan.memory_steps` steps per encoding."""
    threads = torch.get_num_threads()
    log.info("training memory: %s, %d steps", ", ".join(plan.memory_encodings), plan.memory_steps)
    rows = [{**train_memory("ape", 0, threads), "what": "import + build only (0 steps)"}]
    for enc in plan.memory_encodings:
        steps = f"{plan.memory_steps} step" + ("s" if plan.memory_steps != 1 else "")
        rows.append({**train_memory(enc, plan.memory_steps, threads), "what": steps})
    return rows
