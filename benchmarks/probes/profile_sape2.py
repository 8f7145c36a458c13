"""Child of section 8 (`benchmarks.layer_profile.profile_layer`): `torch.profiler` (CPU) over
`STEPS` forward + backward steps of the compact SaPE² attention layer (D 128, 4 heads, batch
128, 8x8 grid) with `THREADS` torch threads, after two untimed steps. Prints one JSON line:
per phase (`forward`, `backward`) its wall ms per step and, per op, self CPU ms and calls per
step.

    python -m benchmarks.probes.profile_sape2 STEPS THREADS

Uses only `vitpe_core.encodings` and `vitpe_core.model.Attention`, which older commits have
too: the parent profiles an older `vitpe_core` by putting its folder first on the path.
"""
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from vitpe_core.encodings import EncodingContext, build_encoding
from vitpe_core.model import Attention


def main(steps: int, threads: int) -> dict:
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
    acc: dict[str, dict[str, list]] = {"forward": {}, "backward": {}}
    for e in events:
        if e.name.startswith("phase:"):
            continue
        ph = next((p for a, b, p in phases if a <= e.time_range.start <= b), None)
        if ph is not None:
            row = acc[ph].setdefault(e.name, [0.0, 0])
            row[0] += e.self_cpu_time_total / 1e3 / steps
            row[1] += 1
    wall = {p: sum(b - a for a, b, q in phases if q == p) / 1e3 / steps for p in acc}
    return {p: {"wall_ms": wall[p], "ops": {n: {"self_ms": v[0], "calls": v[1] / steps} for n, v in ops.items()}}
            for p, ops in acc.items()}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
