"""The HTML report's size and build time (vitpe_core/html_report): a shipped compact checkpoint
and a random-weight ViT-B/16 at 224 px (`benchmarks.vit_b.vit_b_checkpoint`, held as the app holds
an imported timm model), each with the report's four default images, written as
`python -m vitpe_core report` writes it (`html_report.write_report`).

Per case: the file's size against its budget (5 MB compact, 25 MB ViT-B/16), the wall time and
this process's CPU time of one build (model loading not included; the position analysis taken
from the checkpoint's cache where it is current, as the CLI does), the time of each step, what
the explorer kept (layers with every head), and the machine (CPU name, cores, threads).

    python -m benchmarks.html_report                       # both cases, one JSON line each
    python -m benchmarks.html_report --cases compact       # the shipped compact checkpoint only
    python -m benchmarks.html_report --checkpoint checkpoints/ape.safetensors --cases compact

Not a timed test: the numbers go into BENCHMARKS.md. The issue's target for the compact case is
10 s on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.environment import cpu_id, own_cpu_s
from vitpe_core.checkpoint import load_checkpoint
from vitpe_core.html_report import write_report

REPO = Path(__file__).resolve().parents[1]
COMPACT = REPO / "checkpoints" / "sape2+ape.safetensors"   # the shipped model with the most embedded rows
BUDGET_BYTES = {"compact": 5_000_000, "vit-b": 25_000_000}


def machine() -> dict:
    """The CPU's name and identity, the cores this process may use, torch's threads."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                "unknown")
    return {"cpu": name, "cpu_id": cpu_id(info), "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__}


def measure(case: str, ckpt, path: Path | None) -> dict:
    """One report of `ckpt` written to a temporary file: size, wall and CPU seconds, steps."""
    steps: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="vitpe-report-bench-") as folder:
        out = Path(folder) / "report.html"
        t0, c0 = time.perf_counter(), own_cpu_s()
        write_report(ckpt, out, path=path, command=f"python -m benchmarks.html_report --cases {case}",
                     progress=lambda step: steps.append((step, time.perf_counter() - t0)))
        wall, cpu, size = time.perf_counter() - t0, own_cpu_s() - c0, out.stat().st_size
        data = out.read_text(encoding="utf-8")
    kept = json.loads(data.split('id="report-data">', 1)[1].split("</script>", 1)[0])["explorer"]["heads_layers"]
    cfg = ckpt.config
    return {"case": case, "model": ckpt.name, "encoding": cfg.encoding, "grid": list(cfg.grid), "depth": cfg.depth,
            "heads": cfg.heads, "bytes": size, "budget_bytes": BUDGET_BYTES[case],
            "within_budget": size <= BUDGET_BYTES[case],
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "heads_layers": kept,
            "steps_s": [[s, round(t, 2)] for s, t in steps], **machine()}


def compact_case(path: Path) -> dict:
    return measure("compact", load_checkpoint(path), path)


def vit_b_case(encoding: str = "ape") -> dict:
    from benchmarks.vit_b import vit_b_checkpoint
    return measure("vit-b", vit_b_checkpoint(encoding), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.html_report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="compact,vit-b", help="comma-separated: compact, vit-b")
    p.add_argument("--checkpoint", type=Path, default=COMPACT, help="the compact case's checkpoint")
    p.add_argument("--vit-b-encoding", default="ape", help="the ViT-B/16's encoding (default ape)")
    p.add_argument("--markdown", action="store_true", help="print BENCHMARKS.md's section 10 instead of JSON lines")
    args = p.parse_args(argv)
    rows = []
    for case in [c.strip() for c in args.cases.split(",") if c.strip()]:
        if case == "compact":
            res = compact_case(args.checkpoint)
        elif case == "vit-b":
            res = vit_b_case(args.vit_b_encoding)
        else:
            raise SystemExit(f"unknown case {case!r}; valid: compact, vit-b")
        rows.append(res)
        if not args.markdown:
            print(json.dumps(res), flush=True)
    if args.markdown:
        print(markdown(rows))
    return 0


def markdown(rows: list[dict]) -> str:
    """BENCHMARKS.md's section on the HTML report, from this run's results."""
    m = rows[0]
    lines = ["## 10. HTML report (size and build time)", "",
             f"`python -m benchmarks.html_report --markdown` on {m['cpu']} ({m['cpu_id']}), {m['usable_cores']} "
             f"cores, torch {m['torch']}, {m['torch_threads']} threads: one build of the report "
             "`python -m vitpe_core report` writes, with its four default images (model loading not included). "
             "Every layer keeps its mean over heads; the layers below also keep each head (float16 rows, "
             "vitpe_core/html_report). Target: compact ≤ 10 s on 2 cores.", "",
             "| case | model | size | budget | wall s | CPU s | layers with every head |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | `{r['model']}` ({r['grid'][0]}×{r['grid'][1]} grid, {r['depth']} layers) | "
                     f"{r['bytes'] / 1e6:.2f} MB | {r['budget_bytes'] / 1e6:.0f} MB | {r['wall_s']:.1f} | "
                     f"{r['cpu_s']:.1f} | {', '.join(map(str, r['heads_layers']))} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
