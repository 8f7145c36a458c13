"""Benchmarks: `python -m benchmarks.bench [--quick] [--skip-app] [--only vit-b] [--out DIR] [--threads N]
[--checkpoints DIR]`.

One run measures, as ratios between variants timed in the same run (absolute times only
beside their ratio; these machines are noisy), and writes `BENCHMARKS.md` and
`benchmarks.json` into `--out` (default: the repository root). The sections, each a module:

1. attention layer forward+backward per encoding vs `none` and `rpb` (`benchmarks.attention`);
2. whole-model training throughput vs `none`, `ape` and a plain `torch.nn` ViT
   (`benchmarks.training`);
3. the compute a click triggers in the app, without Streamlit (`benchmarks.clicks`, on the
   checkpoint set of `benchmarks.checkpoints`);
4. the app's cold start, over HTTP and in headless chromium, and a patch change end to end
   (`benchmarks.app`);
5. peak memory of a training subprocess (`benchmarks.memory`) and of the app server with every
   checkpoint loaded (`benchmarks.app`);
6. a ViT-B/16-sized model at real size (`benchmarks.vit_b`); `--only vit-b` runs this section
   alone and writes it (and the targets table) into an existing report, leaving the other
   sections as they are;
7. SaPE² and CoPE as functions vs SDPA with a mask (`benchmarks.attention`);
8. a profile of the SaPE² layer, before and now (`benchmarks.layer_profile`);
9. the analysis budget (`benchmarks.analysis_budget`).

How it times is `benchmarks.timing`; the targets and their verdicts are `benchmarks.targets`;
the report is rendered by `benchmarks.report` from templates/*.md; the machine's record is
`benchmarks.environment`. Missed targets get a **Why** line for the maintainers; its text
survives a rerun. The server, browser, memory and process helpers are `benchmarks.harness`'s
(shared with the load test and the browser tests); the subprocesses that measure memory and
the profile are `benchmarks.probes`. `--kernel-ab layer|train` only compares the fused C++
kernel with the eager code (`benchmarks.kernel_ab`).

Deliberate limits:
* the click sections use `vitpe_core.inputs.checkpoint_input` and `vitpe_core.views`, the exact
  preprocessing and view functions the pages use; no Streamlit runtime is started in this
  process;
* click compute excludes Streamlit's own costs (the cache's copy of cached results,
  widgets, figures, protobuf): the browser end-to-end number includes them;
* the process does not pause other jobs; whether a background `vitpe_core train` was
  stopped during the run is detected (process state `T`) and written into the report.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from benchmarks.analysis_budget import bench_analysis
from benchmarks.app import bench_app
from benchmarks.attention import bench_attention, bench_functional
from benchmarks.checkpoints import checkpoint_set
from benchmarks.clicks import bench_clicks
from benchmarks.environment import environment
from benchmarks.harness import REPO, background_jobs
from benchmarks.kernel_ab import kernel_ab
from benchmarks.layer_profile import bench_profile
from benchmarks.memory import bench_train_memory
from benchmarks.report import (kept_sections, md_app, md_memory, md_targets, render_markdown, replace_section,
                               written_whys)
from benchmarks.report_vit_b import VIT_B_HEADING, md_vit_b
from benchmarks.targets import fmt, target_records, targets, vit_b_targets
from benchmarks.timing import FULL, QUICK, Plan
from benchmarks.training import bench_training
from benchmarks.vit_b import vit_b_section
from vitpe_core.encodings import available_encodings


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


def run(plan: Plan, *, out: Path, skip_app: bool, argv: list[str], checkpoints: Path, mode: str) -> dict:
    """Every section in turn (timed, with `gc` between them), then benchmarks.json and
    BENCHMARKS.md into `out`; returns the results."""
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
    res["targets"] = target_records(tgts)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks.json").write_text(json.dumps(_jsonable(res), indent=1) + "\n")
    whys = written_whys(out / "BENCHMARKS.md")
    old = (out / "BENCHMARKS.md").read_text() if (out / "BENCHMARKS.md").is_file() else ""
    (out / "BENCHMARKS.md").write_text(kept_sections(old, render_markdown(res, tgts, whys)))
    return res


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
    res["targets"] = target_records(tgts)
    json_path.write_text(json.dumps(_jsonable(res), indent=1) + "\n")
    md = md_path.read_text()
    md = replace_section(md, "## Targets", md_targets(tgts, written_whys(md_path)))
    md_path.write_text(replace_section(md, VIT_B_HEADING, md_vit_b(res)))
    return res


def run_app_only(plan: Plan, *, out: Path, checkpoints: Path) -> dict:
    """`--only app`: section 4 (cold starts and the browser, their floor) and the app's memory of
    section 5 alone, merged into the report in `out` as `--only vit-b` does: in BENCHMARKS.md only
    the Targets table and sections 4 and 5 are rewritten (section 5's training memory is kept)."""
    json_path, md_path = out / "benchmarks.json", out / "BENCHMARKS.md"
    if not json_path.is_file() or not md_path.is_file():
        raise FileNotFoundError(f"--only app adds its section to an earlier report: {json_path} and {md_path} "
                                "are needed (run `python -m benchmarks.bench` once)")
    res = json.loads(json_path.read_text())
    env = environment(["--only", "app"], torch.get_num_threads())
    with checkpoint_set(checkpoints) as cs, tempfile.TemporaryDirectory(prefix="vitpe-bench-") as work:
        res["app"] = bench_app(plan, cs, Path(work))
    res["app_only_run"] = {**env, "loadavg_end": list(os.getloadavg())}
    tgts = targets(res)
    res["targets"] = target_records(tgts)
    json_path.write_text(json.dumps(_jsonable(res), indent=1) + "\n")
    md = replace_section(md_path.read_text(), "## Targets", md_targets(tgts, written_whys(md_path)))
    app_md = md_app(res)
    app_md[1:1] = ["", f"Measured alone (`python -m benchmarks.bench --only app`) on {env['date']}, commit "
                   f"{env['git_commit']}, {env['cpu']} ({env['usable_cores']} cores), load average at its start "
                   f"{env['loadavg_start'][0]:.2f}, at its end {res['app_only_run']['loadavg_end'][0]:.2f}; the "
                   "other sections are from the full run named at the top."]
    md = replace_section(md, "## 4. App cold start", app_md)
    md_path.write_text(replace_section(md, "## 5. Peak memory", md_memory(res)))
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: few repetitions (numbers not comparable)")
    p.add_argument("--skip-app", action="store_true", help="skip the app parts (cold start, browser, app memory)")
    p.add_argument("--only", choices=["vit-b", "app"], help="run one section alone and write it into the existing "
                   "report in --out (vit-b: section 6, the ViT-B/16-sized model; app: section 4, the cold starts "
                   "and the browser, with the app's memory of section 5; the targets table is rewritten, the other "
                   "sections are kept)")
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
            print(f"{t.status:>12}  {fmt(t.measured, t.unit):>10}  {t.text}")
        print(f"wrote section 6 and the targets into {args.out / 'BENCHMARKS.md'} and benchmarks.json in "
              f"{res['vit_b']['wall_time_s']:.0f} s")
        return 0
    if args.only == "app":
        try:
            res = run_app_only(plan, out=args.out, checkpoints=args.checkpoints)
        except FileNotFoundError as e:
            p.error(str(e))
        for t in res["targets"]:
            if t["key"].startswith(("cold_start", "app_memory")):
                print(f"{t['status']:>12}  {fmt(t['measured'], t['unit']):>10}  {t['text']}")
        print(f"wrote sections 4 and 5 and the targets into {args.out / 'BENCHMARKS.md'} and benchmarks.json")
        return 0
    res = run(plan, out=args.out, skip_app=args.skip_app, argv=argv, checkpoints=args.checkpoints, mode=mode)
    for t in res["targets"]:
        print(f"{t['status']:>12}  {fmt(t['measured'], t['unit']):>10}  {t['text']}")
    print(f"wrote {args.out / 'BENCHMARKS.md'} and benchmarks.json in {res['wall_time_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
