"""What tracing one image costs in memory (issue 47): a ViT-B/16-shaped model (random weights) traces a
224-px image, the app's way (`analysis.trace_image(compact=True)`) or the old one (the whole float32 trace,
then `compact_trace`), in a fresh process each; the rise of VmHWM over the trace (`/proc/self/clear_refs`
resets it first) beside `analysis.trace_room`, the room the app makes for it.

    python -m benchmarks.trace_memory                   # ape and sape2+ape, both ways
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.harness import proc_memory

ENCODINGS = ("ape", "sape2+ape")


def one(encoding: str, compact: bool) -> dict:
    """In this process: the model, a warm forward pass, then one trace with VmHWM reset before it."""
    import torch

    from vitpe_core import analysis, membudget
    from vitpe_core.config import preset_config
    from vitpe_core.model import build_model
    membudget.tune_allocator()
    cfg = preset_config("compact", encoding=encoding, img_size=(224, 224), patch_size=16, depth=12, heads=12,
                        dim=768, mlp_dim=3072)
    model, x = build_model(cfg).eval(), torch.randn(3, 224, 224)
    with torch.no_grad():
        model(x[None])
    membudget.release_freed_memory()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                                   # VmHWM := VmRSS
    before = proc_memory(os.getpid())["VmRSS"]
    tr = analysis.trace_image(model, x, compact=True) if compact else \
        analysis.compact_trace(analysis.trace_image(model, x))
    rise_mib = proc_memory(os.getpid())["VmHWM"] - before
    return {"encoding": encoding, "compact_as_gathered": compact, "rise_mb": round(rise_mib * 2**20 / 1e6, 1),
            "kept_mb": round(analysis.trace_bytes(tr) / 1e6, 1),
            "trace_room_mb": round(analysis.trace_room(model, (224, 224)) / 1e6, 1)}


def main() -> int:
    if len(sys.argv) == 3:                             # a child: one measurement, as JSON
        print(json.dumps(one(sys.argv[1], sys.argv[2] == "1")))
        return 0
    for enc in ENCODINGS:
        for compact in (False, True):
            out = subprocess.run([sys.executable, "-m", "benchmarks.trace_memory", enc, str(int(compact))],
                                 capture_output=True, text=True, check=True).stdout
            print(out.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
