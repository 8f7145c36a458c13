"""`python -m benchmarks.compiled_ab`: compact-model training steps eager against `torch.compile`,
interleaved in one process, for `sape2`, `sape2+ape`, `cope+ape` and `ape` (batch 128). Under
compile SaPE² and CoPE keep the fused C++ kernel as custom ops (vitpe_core/encodings/compiled_ops.py);
this measures what compiling gains or costs around it. Prints one line per encoding (images/s
eager and compiled, the paired median of compiled/eager throughput with its interquartile range)
and writes nothing; BENCHMARKS.md takes its lines by hand.

    python -m benchmarks.compiled_ab                       # 20 rounds, all four encodings
    python -m benchmarks.compiled_ab --rounds 5 --encodings sape2 ape
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.report import replace_section
from benchmarks.training import TRAIN_BATCH, train_step
from vitpe_core.config import preset_config
from vitpe_core.model import build_model

ENCODINGS = ("sape2", "sape2+ape", "cope+ape", "ape")


def compiled_ab(encodings: tuple[str, ...] = ENCODINGS, rounds: int = 20, *, batch: int = TRAIN_BATCH,
                warmup: int = 2, preset: str = "compact", backend: str = "inductor") -> list[str]:
    """For each encoding one eager and one compiled model (same seed), their training steps
    interleaved round by round (wall time); the first `warmup` steps of each (compilation) are
    not timed. `preset`: the model size (`compact`, what BENCHMARKS.md reports; `tiny` for a
    smoke run); `backend`: torch.compile's (inductor, what `--compile` uses; the test's smoke run
    takes `aot_eager`, the same graph capture without inductor's ~30 s of C++ code generation)."""
    from vitpe_core.encodings import _kernels
    steps = {}
    for enc in encodings:
        for mode in ("eager", "compiled"):
            torch.manual_seed(0)
            model = build_model(preset_config(preset, encoding=enc))
            steps[(enc, mode)] = train_step(torch.compile(model, backend=backend) if mode == "compiled" else model,
                                            batch)
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times: dict[tuple[str, str], list[float]] = {k: [] for k in steps}
    keys = list(steps)
    for r in range(rounds):
        for j in range(len(keys)):
            key = keys[(r + j) % len(keys)]
            t0 = time.perf_counter()
            steps[key]()
            times[key].append(time.perf_counter() - t0)
    kernel = "built" if _kernels.available() else "NOT available (compiled SaPE²/CoPE use the bias path)"
    lines = [f"fused kernel: {kernel}; {torch.get_num_threads()} thread(s), batch {batch}, {rounds} rounds"]
    for enc in encodings:
        e, c = np.asarray(times[(enc, "eager")]), np.asarray(times[(enc, "compiled")])
        ratio = e / c                                             # compiled throughput / eager throughput
        q1, q3 = np.percentile(ratio, [25, 75])
        lines.append(f"{enc:10s} eager {batch / np.median(e):7.0f} img/s  compiled {batch / np.median(c):7.0f} img/s  "
                     f"compiled/eager: paired median {np.median(ratio):.3f} (IQR {q1:.3f}-{q3:.3f})")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compiled_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--batch", type=int, default=TRAIN_BATCH)
    ap.add_argument("--encodings", nargs="+", default=list(ENCODINGS))
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--write", metavar="BENCHMARKS.md", help="also write the results as that file's section 11")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lines = compiled_ab(tuple(args.encodings), args.rounds, batch=args.batch)
    if args.write:
        path = Path(args.write)
        path.write_text(replace_section(path.read_text(), SECTION, markdown(lines, args)))
        print(f"{path}: section {SECTION!r} written", flush=True)
    for line in lines:
        print(line, flush=True)
    return 0


SECTION = "## 11. Compiled training"


def markdown(lines: list[str], args: argparse.Namespace) -> list[str]:
    """BENCHMARKS.md's section on `torch.compile` training, from this run's lines."""
    from benchmarks.environment import environment
    from vitpe_core.encodings import _kernels
    env = environment([], torch.get_num_threads())
    words = ["python -m benchmarks.compiled_ab", "--rounds", str(args.rounds), "--write", "BENCHMARKS.md"]
    out = [SECTION + " (`--compile`: inductor, fused kernel as custom ops)", "",
           f"`{' '.join(words)}` on {env['cpu']} ({env['cpu_id']}), {env['usable_cores']} cores, "
           f"torch {env['torch']}, {torch.get_num_threads()} threads, {env['date'][:10]}, fused kernel "
           f"{'built' if _kernels.available() else 'NOT available'}. Compact preset, batch {args.batch}, a whole "
           "training step (train.py's); one eager and one `torch.compile`d model per encoding, their steps "
           f"interleaved round by round ({args.rounds} rounds after 2 untimed warm-up steps, which compile); "
           "ratio = compiled throughput / eager throughput, paired per round. SaPE² and CoPE keep the fused "
           "kernel under inductor (`vitpe_core/encodings/compiled_ops.py`).", "",
           "| encoding | eager img/s | compiled img/s | compiled / eager (paired median, IQR) |", "|---|---|---|---|"]
    for line in lines[1:]:
        w = line.split()
        out.append(f"| `{w[0]}` | {w[2]} | {w[5]} | {w[10]} {w[11]} {w[12]} |")
    out += ["", "A ratio near 1 means `--compile` buys little for this model on this CPU (its time is in the "
                "matrix products and, for SaPE² and CoPE, the fused kernel, which inductor calls as it is); what "
                "it guarantees is that compiled SaPE² and CoPE run the fused kernel instead of the unfused bias "
                "path (tests/test_train.py, tests/test_cope_sape2.py)."]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
