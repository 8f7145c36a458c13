"""Section 9 of the benchmark: the wall time of `vitpe_core.positional.analyze` (what
`python -m vitpe_core analyze` runs, without its cache) on a compact shipped checkpoint."""
from __future__ import annotations

import time
from pathlib import Path

from vitpe_core.checkpoint import load_checkpoint

ANALYSIS_CHECKPOINT = "sape2+ape"
ANALYSIS_LIMIT_S = 30        # the target (`targets.targets`: analysis_budget)


def bench_analysis(checkpoints: Path) -> dict:
    """Wall and CPU seconds of `analyze` on `checkpoints/ANALYSIS_CHECKPOINT`, or the reason
    it was not measured."""
    from vitpe_core.positional import analyze
    path = checkpoints / f"{ANALYSIS_CHECKPOINT}.safetensors"
    if not path.exists():
        return {"checkpoint": ANALYSIS_CHECKPOINT, "reason": f"{path} not found"}
    ckpt = load_checkpoint(path)
    t0, c0 = time.perf_counter(), time.process_time()
    summary, _ = analyze(ckpt)
    return {"checkpoint": ANALYSIS_CHECKPOINT, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
            "images": summary["images"]}
