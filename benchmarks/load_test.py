"""Load test of the Streamlit app: many concurrent sessions on loopback; the figures go into
RELIABILITY.md ("Load").

    python -m benchmarks.load_test --sessions 50 --seconds 60 --browsers 3   # -> artifacts/load_test.json
    python -m benchmarks.load_test --sessions 8 --seconds 15                 # what tests/test_load.py runs
    python -m benchmarks.load_test --engine browser --sessions 20 --seconds 60   # chromium pages only
    python -m benchmarks.load_test --memory-only    # the server's memory with every checkpoint loaded
    python -m benchmarks.load_test --sessions 50 --seconds 60 --big-imports 5 --big-shape b16   # issue 30
    python -m benchmarks.load_test --sessions 4 --seconds 10 --click-phase 4 --think 0.2,1 \
        --big-imports 1 --big-shape s16                                    # its short version (tests/test_load.py)

It starts the real server (`python -m streamlit run app.py` on 127.0.0.1, its own process
group, always stopped afterwards) and drives it two ways at once:

* **websocket sessions** (`--sessions`, the load): `benchmarks.st_client` speaks Streamlit's
  own protocol (`/_stcore/stream`, protobuf BackMsg/ForwardMsg, uploads through
  `/_stcore/upload_file`) like a browser tab, without rendering anything, so 50 of them cost
  the machine a fraction of what the server spends on them (measured: `client.cores`).
  Each opens a different share link (checkpoint, image, patch), and once all have loaded,
  draws actions until the time is up, with a think time between them (`--think`, seconds):
  a click on a patch (60 %: the clickable image's value as the browser sends it, or the
  row/column inputs where the page offers no clickable image), a page view (15 %), an image
  upload (10 %: a PNG with a name and pixels of its own), opening its share link in a new
  session (15 %). Session 0 also imports a model on the Checkpoints page (a small
  timm-layout ViT, `.npz`). Then a **click-only phase** (`--click-phase` s): every session
  only clicks, and the server's CPU time in it / its clicks is the CPU per click.
* **browser sessions** (`--browsers`, a check, default 0): Debian's chromium through
  playwright, each a context of its own clicking the real image, so that a real browser's
  click is seen to land under the same load.

Every answer is checked: a finished script run (no answer within `--click-timeout` s is an
error), no exception element, the page's title, the patch text `Patch (r, c)` and the share
link naming this session's patch and checkpoint, this session's upload shown; and
**cross-talk**: no page ever shows another session's upload (their names carry the session)
or lists another session's imported model. Recorded: latency per action (p50/p95/max), errors,
cross-talk, the server's memory (VmRSS sampled every 0.25 s, the kernel's VmHWM), the
server's CPU (/proc/<pid>/stat) apart from the client's own (this process) and the machine's,
the bytes sent per click, and `/_stcore/health` afterwards.

**Big imports** (`--big-imports N`, `benchmarks.load_big`; default 0: none): the last N
websocket sessions each import a ViT-B/16-shaped model (`--big-shape b16`; `s16` for a short
run) with random weights in timm layout, a float16 `.npz` (173 MB) built by the benchmark before
the server starts: one file per session, seeded with its index, so the server sees N different
models (`--big-same-file`: one file for all, which the server imports once). The imports take
turns: a session imports once the previous one has had `--big-turn` (3) answers with its own
model, or lost it to the memory budget, or failed (at least `--big-stagger` s apart); the server's
budget holds one ViT-B/16, so imports at once would evict each other's models before anyone
clicked them. Until every big session had its turn the window stays open for all sessions (at
most `--big-extra-s` beyond `--seconds`; `window_s` in the report). After its import a session
clicks patches (3 in 4) and switches sample images (1 in 4) on the bias page with its model
selected, and every answer must show its own model (the link's `ckpt`, the checkpoint list);
another session's model anywhere on its pages (a checkpoint list, the view's `ckpt` or
`model=<sha256>`) is cross-talk. A model the budget evicted is counted, not an error: the session
clicks on the checkpoint the page falls back to. The other sessions do what they do without the
option. The report's `big_imports` says: each session's turn (when its import started, how long
it took, its clicks with its model, evictions it saw), clicks sent / answered by the big sessions,
the latency of clicks answered with an imported model (`model_click`) apart from all other clicks
(`other_click`) and of image switches, the evictions the server logged per pool of its budget and
the pools as its "Server status" says them; `memory_mb.peak_mb` (VmHWM or the highest sampled
VmRSS) against `--peak-mb` (1024). The run fails on any error, unanswered click, cross-talk, a
peak over the limit or an unconfirmed import (`failures`, printed as the last line).

`--checkpoints` defaults to `checkpoints/`; if that holds no checkpoint, the tests' tiny
random-weight set (`harness.write_random_checkpoints`) is written to a temporary folder.

This module runs a load test and writes its report (`run_ws_load`, `passed`, `main`); its parts
are `benchmarks.load_ws` (the websocket visitor), `benchmarks.load_big` (the big-import
sessions), `benchmarks.load_browser` (the chromium sessions, `--engine browser` and
`--memory-only`), `benchmarks.load_plan` (the sessions' share links and the gates that start
them together) and `benchmarks.load_probes` (the server's memory and CPU time, the latency
statistics).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import (REPO, Server, background_jobs, checkpoint_grids, health_ok, streamlit_server,
                                write_random_checkpoints)
from benchmarks.load_big import BigPlan, Relay, big_summary, big_user, build_plan, hold_window, server_pools
from benchmarks.load_browser import SessionResult, browser_check, page_memory, run_load
from benchmarks.load_plan import PhaseGate, Spec, make_specs
from benchmarks.load_probes import (MemorySampler, cpu_model, cpu_seconds, latency_stats, machine_busy_seconds,
                                    memory_mb)
from benchmarks.load_ws import WsResult, tiny_model_npz, ws_user

SERVER_ARGS = ("--server.fileWatcherType", "none")   # as deployed: no watching of the source tree


async def _run_ws(base: str, specs: list[Spec], browser_specs: list[Spec], seconds: float, *, pid: int,
                  think: tuple[float, float], click_timeout: float, load_timeout: float, model_npz: bytes | None,
                  click_phase: float, big: BigPlan | None = None, images: list[str] = (),
                  grids: dict[str, tuple[int, int]]) -> tuple[list[WsResult], list[SessionResult], PhaseGate]:
    gate = PhaseGate(len(specs) + len(browser_specs), seconds, pid, click_phase)
    relay = Relay(sorted(big.files)) if big is not None else None
    holder = asyncio.create_task(hold_window(gate, relay, big.extra_s)) if relay is not None else None

    def user(i, spec):
        if big is not None and i in big.files:        # a big-import session (benchmarks.load_big)
            return big_user(base, spec, i, gate, big, relay, think=think, click_timeout=click_timeout,
                            load_timeout=load_timeout, click_phase=click_phase, grids=grids, images=list(images))
        return ws_user(base, spec, i, gate, think=think, click_timeout=click_timeout, load_timeout=load_timeout,
                       model_npz=model_npz, click_phase=click_phase, grids=grids)

    tasks = [asyncio.create_task(user(i, s)) for i, s in enumerate(specs)]
    btask = (asyncio.create_task(browser_check(base, browser_specs, gate, click_timeout, load_timeout))
             if browser_specs else None)
    results = list(await asyncio.gather(*tasks))
    browsers = await btask if btask else []
    if holder is not None:
        holder.cancel()
    return results, browsers, gate


def run_ws_load(server: Server, specs: list[Spec], seconds: float, *, browsers: int = 0,
                think: tuple[float, float] = (1.0, 3.0), click_timeout: float = 60.0, load_timeout: float = 180.0,
                model_upload: bool = True, click_phase: float = 15.0, warm: bool = False,
                big: BigPlan | None = None, peak_limit_mb: float | None = None,
                grids: dict[str, tuple[int, int]] | None = None) -> dict:
    """Drive `server` with one websocket session per spec (and `browsers` chromium pages) for
    `seconds` after all have loaded, then the click-only phase; returns the report. `big`: the
    sessions that import a big model (`load_big`); `peak_limit_mb`: the server's peak resident
    memory that passes (`memory_mb.within_limit`; None: not judged); `grids`: every checkpoint's
    patch grid (a session may be moved to one no spec starts on; default: the specs')."""
    from vitpe_core.gallery import gallery_ids

    if warm:   # one visitor before the crowd: the server's first script run (its imports) is over
        from benchmarks.st_client import open_session

        async def first_visit():
            s, _ = await open_session(server.url, "/?page=bias", load_timeout)
            await s.close()
        asyncio.run(first_visit())
    grids = grids or {s.ckpt: s.grid for s in specs}
    browser_specs = make_specs(len(specs) + browsers, grids, gallery_ids())[len(specs):] if browsers else []
    loadavg = os.getloadavg()
    start_mem = memory_mb(server.pid)
    cpu0, busy0, own0 = cpu_seconds(server.pid), machine_busy_seconds(), time.process_time()
    sampler = MemorySampler(server.pid)
    sampler.start()
    t0 = time.monotonic()
    try:
        results, bres, gate = asyncio.run(_run_ws(server.url, specs, browser_specs, seconds, pid=server.pid,
                                                  think=think, click_timeout=click_timeout,
                                                  load_timeout=load_timeout,
                                                  model_npz=tiny_model_npz() if model_upload else None,
                                                  click_phase=click_phase, big=big, images=gallery_ids(),
                                                  grids=grids))
    finally:
        peak_rss = sampler.stop()
    wall = time.monotonic() - t0
    end_mem = memory_mb(server.pid)
    server_cpu, busy, own = cpu_seconds(server.pid) - cpu0, machine_busy_seconds() - busy0, time.process_time() - own0
    kinds = dict.fromkeys(a for r in results for a in r.latency)          # big sessions have more kinds
    lat = {a: [x for r in results for x in r.latency.get(a, [])] for a in kinds}
    clicks = sum(r.clicks for r in results)
    phase_clicks = sum(r.phase_clicks for r in results)
    phase_cpu = gate.phase_cpu[1] - gate.phase_cpu[0]
    phase_wall = gate.phase_time[1] - gate.phase_time[0]
    click_bytes = [r.bytes / r.clicks for r in results if r.clicks]
    report = {
        "engine": "websocket (benchmarks.st_client)", "sessions": len(specs), "browsers": browsers, "warm": warm,
        "seconds": seconds, "window_s": round(gate.deadline - gate.opened_at, 1), "click_phase_s": click_phase,
        "think_s": list(think), "wall_s": round(wall, 1),
        "cpu_model": cpu_model(), "cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in loadavg],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()], "background_jobs": background_jobs(),
        "actions": {a: len(v) for a, v in lat.items()},
        "latency_s": {a: latency_stats(v) for a, v in lat.items()},
        "clicks": clicks, "clicks_sent": sum(r.clicks_sent for r in results),
        "unanswered_clicks": sum(r.clicks_sent - r.clicks for r in results),
        "uploads": sum(len(r.uploads) for r in results),
        "reloads": sum(r.reloads for r in results),
        "cpu": {"server_s": round(server_cpu, 1), "server_cores": round(server_cpu / wall, 2),
                "client_cores": round(own / wall, 2), "machine_busy_cores": round(busy / wall, 2),
                "click_phase": {"clicks": phase_clicks, "wall_s": round(phase_wall, 1),
                                "server_cpu_s": round(phase_cpu, 2),
                                "server_ms_per_click": round(1000 * phase_cpu / phase_clicks) if phase_clicks
                                else None},
                "note": "server: the Streamlit process's CPU time (/proc/<pid>/stat); client: this process "
                        "(all websocket sessions, and the playwright driver but not chromium); machine: "
                        "all cores busy (/proc/stat), including any background job; server_ms_per_click: "
                        "server CPU in the click-only phase / its clicks"},
        "kb_per_click": round(statistics.fmean(click_bytes) / 1024, 1) if click_bytes else None,
        "errors": [f"session {r.index}: {e}" for r in results for e in r.errors],
        "crosstalk": [f"session {r.index}: {c}" for r in results for c in r.crosstalk],
        "own_models_evicted": {r.index: sorted(r.evicted_models) for r in results if r.evicted_models},
        "sessions_without_clicks": [r.index for r in results if r.clicks == 0],
        "memory_mb": {"rss_before": round(start_mem["rss"], 1),
                      "peak_rss_sampled": round(max(peak_rss, end_mem["rss"]), 1),
                      "hwm": round(end_mem["hwm"], 1), "rss_after": round(end_mem["rss"], 1),
                      "rss_timeline": _timeline(sampler, gate)},
        "healthy_after": health_ok(server.url),
    }
    _judge_memory(report["memory_mb"], peak_limit_mb)
    if big is not None:
        pools = asyncio.run(server_pools(server.url, load_timeout))
        report["big_imports"] = big_summary(results, big, server.log_tail(10**9), pools)
    if browsers:
        report["browser_check"] = {
            "sessions": browsers, "clicks": sum(r.clicks for r in bres),
            "latency_s": latency_stats([x for r in bres for x in r.latencies]),
            "errors": [f"browser {i}: {e}" for i, r in enumerate(bres) for e in r.errors],
            "crosstalk": [f"browser {i}: {c}" for i, r in enumerate(bres) for c in r.crosstalk],
            "page_errors": [f"browser {i}: {e}" for i, r in enumerate(bres) for e in r.page_errors],
            "reloads": sum(r.reloads for r in bres),
            "sessions_without_answers": [i for i, r in enumerate(bres) if r.clicks == 0]}
    return report


def _timeline(sampler: MemorySampler, gate) -> dict:
    """The server's VmRSS over the run (each bucket's highest), with the epoch times of its start
    and of the sessions' window opening (a big session's `import_started_s` counts from there)."""
    opened_epoch = time.time() - (time.monotonic() - gate.opened_at)
    return {"started_epoch": round(sampler.started_epoch, 1), "window_opened_epoch": round(opened_epoch, 1),
            "bucket_s": sampler.bucket_s, "s_mib": sampler.timeline}


def _judge_memory(mem: dict, limit_mb: float | None) -> None:
    """The server's peak (the kernel's VmHWM or the highest sampled VmRSS) against `limit_mb`."""
    mem["peak_mb"] = max(mem["hwm"], mem["peak_rss_sampled"])
    if limit_mb is not None:
        mem["limit_mb"], mem["within_limit"] = limit_mb, mem["peak_mb"] <= limit_mb


def failures(report: dict) -> list[str]:
    """Why the run fails: an error, an unanswered click, cross-talk, a session without clicks,
    no health afterwards, a peak over the limit, a big import not confirmed; the browser pages'
    errors, cross-talk and pages without answers."""
    b, big, mem = report.get("browser_check") or {}, report.get("big_imports"), report["memory_mb"]
    checks = [
        (report["errors"], f"{len(report['errors'])} errors"),
        (report["crosstalk"], f"{len(report['crosstalk'])} cross-talk"),
        (report["unanswered_clicks"], f"{report['unanswered_clicks']} unanswered clicks"),
        (report["sessions_without_clicks"], f"sessions without clicks: {report['sessions_without_clicks']}"),
        (not report["healthy_after"], "not healthy afterwards"),
        (mem.get("within_limit") is False, f"peak {mem['peak_mb']:.0f} MiB over {mem.get('limit_mb')} MiB"),
        (big and big["imports_confirmed"] < len(big["sessions"]),
         f"{(big or {}).get('imports_confirmed')} of {len((big or {}).get('sessions', []))} big imports confirmed"),
        (b.get("errors"), f"browsers: {len(b.get('errors', []))} errors"),
        (b.get("crosstalk"), f"browsers: {len(b.get('crosstalk', []))} cross-talk"),
        (b.get("sessions_without_answers"), f"browsers without answers: {b.get('sessions_without_answers')}")]
    return [why for bad, why in checks if bad]


def passed(report: dict) -> bool:
    """No error, unanswered click, cross-talk or session without clicks; healthy afterwards; the
    peak within the limit where one was set; every big import confirmed (`failures`)."""
    return not failures(report)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.load_test", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=["ws", "browser"], default="ws",
                    help="ws: websocket sessions (+ --browsers chromium pages); browser: chromium pages only")
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--browsers", type=int, default=0, help="chromium pages clicking beside the websocket sessions")
    ap.add_argument("--think", default="1,3", help="think time between a session's actions: MIN,MAX seconds")
    ap.add_argument("--click-phase", type=float, default=15.0, help="seconds of clicks only, for CPU per click")
    ap.add_argument("--no-model", action="store_true", help="no model import by session 0")
    ap.add_argument("--warm", action="store_true",
                    help="one visitor opens the bias page before the sessions start (a server that has served "
                         "before; default: all sessions arrive at a cold server at once)")
    ap.add_argument("--port", type=int, default=None, help="server port (default: a free one)")
    ap.add_argument("--checkpoints", default=str(REPO / "checkpoints"),
                    help="checkpoint folder (tiny random-weight models if it holds none)")
    ap.add_argument("--click-timeout", type=float, default=120.0,
                    help="seconds before an action counts as an error")
    ap.add_argument("--out", default=None, help="report file (default artifacts/load_test.json, "
                                                "or artifacts/memory.json with --memory-only)")
    ap.add_argument("--memory-only", action="store_true",
                    help="no load: open each page once (compare loads the main folder's checkpoints) and report the "
                         "server's VmRSS / VmHWM")
    _big_options(ap)
    args = ap.parse_args(argv)
    if args.big_imports and (args.engine != "ws" or args.memory_only):
        ap.error("--big-imports needs the websocket sessions (--engine ws, no --memory-only)")
    if not 0 <= args.big_imports <= args.sessions:
        ap.error(f"--big-imports {args.big_imports}: between 0 and --sessions ({args.sessions})")
    out = Path(args.out or REPO / "artifacts" / ("memory.json" if args.memory_only else "load_test.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    if (args.engine == "browser" or args.browsers or args.memory_only) and shutil.which("chromium") is None:
        ap.error("Debian's chromium is needed (apt-get install chromium)")
    from vitpe_core.checkpoint import list_checkpoints
    from vitpe_core.gallery import gallery_ids

    with tempfile.TemporaryDirectory(prefix="vitpe-load-") as tmp:
        folder = Path(args.checkpoints)
        tiny = not (folder.is_dir() and list_checkpoints(folder))
        if tiny:
            print(f"no checkpoints in {folder}: using tiny random-weight ones", file=sys.stderr)
            folder = write_random_checkpoints(Path(tmp) / "checkpoints")
        env = {"VITPE_UPLOAD_DIR": str(Path(tmp) / "uploads")}      # a store of its own, removed afterwards
        if args.memory_only:
            with streamlit_server(folder, port=args.port, args=SERVER_ARGS, env=env) as server:
                report = {"checkpoints": str(folder), "names": list_checkpoints(folder),
                          "memory_mb": page_memory(server)}
            out.write_text(json.dumps(report, indent=2))
            print(json.dumps(report, indent=2))
            return 0
        grids = checkpoint_grids(folder)
        specs = make_specs(args.sessions, grids, gallery_ids())
        big = _big_plan(args, Path(tmp) / "big-models") if args.big_imports else None    # before the server starts
        with streamlit_server(folder, port=args.port, args=SERVER_ARGS, env=env) as server:
            if args.engine == "browser":
                report = run_load(server, specs, args.seconds, click_timeout=args.click_timeout)
                ok = (not report["errors"] and not report["crosstalk"] and report["healthy_after"]
                      and not report["sessions_without_answers"])
            else:
                lo, hi = (float(x) for x in args.think.split(","))
                report = run_ws_load(server, specs, args.seconds, browsers=args.browsers, think=(lo, hi),
                                     click_timeout=args.click_timeout, model_upload=not args.no_model,
                                     click_phase=args.click_phase, warm=args.warm, big=big,
                                     peak_limit_mb=args.peak_mb if big else None, grids=grids)
                ok = passed(report)
            report["server_log_tail"] = server.log_tail(1500)
    report["checkpoints"] = "tiny random-weight (harness.write_random_checkpoints)" if tiny else str(folder)
    report["command"] = " ".join(["python -m benchmarks.load_test", *(argv if argv is not None else sys.argv[1:])])
    out.write_text(json.dumps(report, indent=2))
    summary = {k: v for k, v in report.items() if k not in ("per_session", "server_log_tail")}
    summary["errors"], summary["crosstalk"] = report["errors"][:10], report["crosstalk"][:10]
    print(json.dumps(summary, indent=2))
    print(f"written to {out}")
    print("PASSED" if ok else "FAILED: " + "; ".join(failures(report) if args.engine == "ws" else ["see the report"]))
    return 0 if ok else 1


def _big_options(ap: argparse.ArgumentParser) -> None:
    """The big-import mode's options (`benchmarks.load_big`)."""
    ap.add_argument("--big-imports", type=int, default=0,
                    help="the last N sessions each import a ViT-B/16-shaped model (random weights) and click "
                         "patches / switch images on the bias page with it (default 0: none)")
    ap.add_argument("--big-shape", choices=("b16", "s16"), default="b16", help="the big models' shape")
    ap.add_argument("--big-same-file", action="store_true",
                    help="all big sessions import one file (default: one file per session, seed = its index)")
    ap.add_argument("--big-stagger", type=float, default=0.0,
                    help="at least this many seconds between the big imports' starts (they also take turns)")
    ap.add_argument("--big-turn", type=int, default=3,
                    help="answers with its own model a big session gets before the next one imports")
    ap.add_argument("--big-extra-s", type=float, default=240.0,
                    help="the longest the window stays open beyond --seconds until every big session had its turn")
    ap.add_argument("--peak-mb", type=float, default=1024.0,
                    help="with --big-imports: the server's peak resident memory (VmHWM) that passes")


def _big_plan(args: argparse.Namespace, folder: Path) -> BigPlan:
    """The big-import sessions and their model files, built now (`load_big.build_plan`)."""
    return build_plan(args.sessions, args.big_imports, args.big_shape, folder, stagger=args.big_stagger,
                      shared=args.big_same_file, turn=args.big_turn, extra_s=args.big_extra_s)


if __name__ == "__main__":
    sys.exit(main())
