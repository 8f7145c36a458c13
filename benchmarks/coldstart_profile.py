"""Where a cold start's seconds go, browser side: `python -m benchmarks.coldstart_profile [--runs 3]`.

For each of `--runs` rounds, three cold starts in Debian chromium, timed as section 4 of
BENCHMARKS.md times them (`benchmarks.app.first_page`): the app; the app with `VITPE_WARMUP=0`
(no work at server start: what the warm-up's imports cost the page's first element); and the
floor (`benchmarks.app.FLOOR_APP`, a Streamlit app drawing one Plotly chart). Each with
chromium's sampling profiler on the page's main thread (CDP `Profiler`, 0.5 ms), from navigation
to the charts drawn: the busy milliseconds per script file (Plotly's chunk, the code block's
highlighter, React, ...), so that the app's extra browser work can be named, not guessed.
Prints one line per start and the medians; `--json FILE` keeps them. Informational, no target.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.app import FLOOR_APP, compile_bytecode, page_times
from benchmarks.harness import REPO, chromium_or_reason, launch_chromium, streamlit_server

IDLE = ("(idle)", "(program)", "(garbage collector)")
VARIANTS = {"app": ("app.py", {}), "app, VITPE_WARMUP=0": ("app.py", {"VITPE_WARMUP": "0"}), "floor": (None, {})}


def _busy_by_script(profile: dict) -> dict[str, float]:
    """ms of samples per script file name ('(program)' and '(garbage collector)' kept, idle left out)."""
    nodes = {n["id"]: n["callFrame"] for n in profile["nodes"]}
    out: collections.Counter = collections.Counter()
    for sample, dt in zip(profile["samples"], profile["timeDeltas"]):
        frame = nodes[sample]
        name = frame["functionName"]
        name = name if name in IDLE else (frame["url"].rsplit("/", 1)[-1] or "(native)")
        out[name.split(".")[0] if name.endswith(".js") else name] += dt / 1e3
    out.pop("(idle)", None)
    return dict(out)


def cold_start(browser, script: str, env: dict[str, str], log: Path) -> dict:
    """One cold start of `script`: seconds from process start to the first `h1`, the first run
    over and the charts drawn, and the main thread's busy ms per script until then."""
    with streamlit_server(REPO / "checkpoints", log=log, timeout=120, script=script, env=env) as server:
        ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            page = ctx.new_page()
            cdp = ctx.new_cdp_session(page)
            cdp.send("Profiler.enable")
            cdp.send("Profiler.setSamplingInterval", {"interval": 500})
            cdp.send("Profiler.start")
            out: dict = page_times(page, server)
            out["busy_ms"] = _busy_by_script(cdp.send("Profiler.stop")["profile"])
        finally:
            ctx.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.coldstart_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="rounds of the three cold starts (default 3)")
    p.add_argument("--json", type=Path, help="also write every start's figures to this file")
    args = p.parse_args(argv)
    exe, reason = chromium_or_reason()
    if exe is None:
        print(f"no browser: {reason}", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    compile_bytecode()
    work = Path(tempfile.mkdtemp(prefix="vitpe-coldstart-"))
    (work / "floor_app.py").write_text(FLOOR_APP)
    starts: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with sync_playwright() as pw:
        browser = launch_chromium(pw)
        try:
            for i in range(args.runs):
                for name, (script, env) in VARIANTS.items():
                    r = cold_start(browser, script or str(work / "floor_app.py"), env, work / f"server-{i}.log")
                    starts[name].append(r)
                    top = sorted(r["busy_ms"].items(), key=lambda kv: -kv[1])[:6]
                    print(f"{name:>20}: h1 {r['first_element_s']:.2f} s, run over {r['first_run_s']:.2f} s, charts "
                          f"{r['first_chart_s']:.2f} s; main thread {sum(r['busy_ms'].values()):.0f} ms busy: "
                          + ", ".join(f"{k} {v:.0f}" for k, v in top), flush=True)
        finally:
            browser.close()
    print("\nmedians")
    for name, rs in starts.items():
        busy = collections.Counter()
        for r in rs:
            busy.update(r["busy_ms"])
        top = sorted(((k, v / len(rs)) for k, v in busy.items()), key=lambda kv: -kv[1])[:8]
        med = {k: statistics.median(r[k] for r in rs) for k in ("first_element_s", "first_run_s", "first_chart_s")}
        print(f"{name:>20}: h1 {med['first_element_s']:.2f} s, run over {med['first_run_s']:.2f} s, charts "
              f"{med['first_chart_s']:.2f} s; main thread busy (mean ms): "
              + ", ".join(f"{k} {v:.0f}" for k, v in top))
    if args.json:
        args.json.write_text(json.dumps(starts, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
