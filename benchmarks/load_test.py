"""Load test of the Streamlit app: N concurrent browser sessions click patches on the bias
explorer for a while; the figures go into RELIABILITY.md ("Load").

    python -m benchmarks.load_test --sessions 20 --seconds 60        # writes artifacts/load_test.json
    python -m benchmarks.load_test --checkpoints /path/to/folder --port 8765
    python -m benchmarks.load_test --memory-only    # the server's memory with every checkpoint loaded

It starts the real server (`python -m streamlit run app.py` on 127.0.0.1, its own process
group, always stopped afterwards) and drives it with Debian's chromium through playwright: one
browser, one browser context (= one Streamlit session, own cookies and websocket) per
session. Each session opens a different share link (checkpoint, image, patch) and then, until
the time is up, clicks a new patch on the image and waits for the page to say
`Patch (r, c)` and for the script run to finish, then clicks again at once (a closed loop
with no think time: the worst case, each session has one click in flight). Recorded:

* clicks served, and per-click latency: click -> the new `Patch (r, c)` text (what a user
  waits for) and click -> the script run finished (every chart redrawn); p50 / p95 / max;
* errors (a page that does not load, a click not answered in `--click-timeout` s, a
  Streamlit exception box, a lost websocket); uncaught JavaScript errors separately, and
  reloads (a session whose clickable image did not appear within 30 s reloads once);
* CPU: the server's CPU time (per click, and as cores used) against the machine's — on a
  small machine the browsers compete with the server for the same cores;
* cross-talk: after every answer the page must show only this session's patch, checkpoint
  and image (text, widgets and URL) — never another session's;
* the server's resident memory: VmRSS sampled every 0.25 s and the kernel's high-water mark
  VmHWM (/proc/<pid>/status; psutil's RSS where /proc is missing);
* `/_stcore/health` after the run.

`--checkpoints` defaults to `checkpoints/`; if that holds no checkpoint, the tests' tiny
random-weight set (`harness.write_random_checkpoints`) is written to a temporary folder. The
server, browser and page helpers are `benchmarks.harness`'s; tests/test_load.py runs
`make_specs` and `run_load` for a short while.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.harness import (IMAGE_FRAME, REPO, Server, background_jobs, checkpoint_grids, click_point,
                                health_ok, launch_chromium, patch_label, proc_memory, share_url, streamlit_server,
                                url_params, wait_script_run, write_random_checkpoints)

PATCH_TEXT = re.compile(r"^Patch \(\d+, \d+\)$")


def memory_mb(pid: int) -> dict[str, float]:
    """{"rss": current, "hwm": peak} resident memory of `pid` in MiB (the report's names)."""
    mem = proc_memory(pid)
    return {"rss": mem.get("VmRSS", 0.0), "hwm": mem.get("VmHWM", 0.0)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` so far (/proc/<pid>/stat; 0 where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """Busy (non-idle) CPU seconds of the whole machine so far, all cores (/proc/stat)."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except OSError:
        return 0.0
    return (sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)) / os.sysconf("SC_CLK_TCK")


class MemorySampler(threading.Thread):
    """Samples `memory_mb(pid)` every `every` s; `.peak_rss` is the highest VmRSS seen."""

    def __init__(self, pid: int, every: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.every, self.peak_rss, self._stop_event = pid, every, 0.0, threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                self.peak_rss = max(self.peak_rss, memory_mb(self.pid)["rss"])
            self._stop_event.wait(self.every)

    def stop(self) -> float:
        self._stop_event.set()
        self.join(5)
        return self.peak_rss


# ----------------------------------------------------------------------------- load
@dataclass
class Spec:
    ckpt: str
    image: str
    patch: tuple[int, int]
    grid: tuple[int, int]
    seed: int


@dataclass
class SessionResult:
    spec: dict
    clicks: int = 0
    latencies: list[float] = field(default_factory=list)        # click -> patch text, s
    settled: list[float] = field(default_factory=list)          # click -> script run finished, s
    load_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    crosstalk: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)        # uncaught JavaScript errors
    reloads: int = 0                                            # image never appeared: reloaded once


def make_specs(n: int, grids: dict[str, tuple[int, int]], images: list[str]) -> list[Spec]:
    """`n` different share links: checkpoints and images in turn, distinct starting patches."""
    names = sorted(grids)
    specs = []
    for i in range(n):
        name = names[i % len(names)]
        H, W = grids[name]
        specs.append(Spec(ckpt=name, image=images[(3 * i) % len(images)], patch=((i * 3) % H, (i * 5 + 1) % W),
                          grid=(H, W), seed=i))
    return specs


async def _own_state(page, spec: Spec, patch: tuple[int, int], caption: str) -> list[str]:
    """What on the page is not this session's view (empty = no cross-talk)."""
    wrong = []
    shown = await page.get_by_text(PATCH_TEXT).all_inner_texts()
    if shown != [patch_label(patch)]:
        wrong.append(f"patch texts {shown} != [{patch_label(patch)!r}]")
    ckpt = await page.locator(".st-key-bias_ckpt input").input_value()
    image = await page.locator(".st-key-bias_image input").input_value()
    if (ckpt, image) != (spec.ckpt, caption):
        wrong.append(f"widgets show ckpt={ckpt!r} image={image!r}, expected {spec.ckpt!r} {caption!r}")
    q = url_params(page.url)
    want = {"ckpt": spec.ckpt, "image": spec.image, "patch": f"{patch[0]},{patch[1]}"}
    if {k: q.get(k) for k in want} != want:
        wrong.append(f"URL {page.url} is not {want}")
    return wrong


class Gate:
    """Clicking starts for all sessions at once, when every one has loaded (or failed to)."""

    def __init__(self, n: int, seconds: float, server_pid: int):
        self.n, self.seconds, self.pid, self.arrived, self.deadline = n, seconds, server_pid, 0, float("inf")
        self.open = asyncio.Event()
        self.opened_at, self.server_cpu_at_open = 0.0, 0.0

    async def arrive(self) -> None:
        self.arrived += 1
        if self.arrived == self.n:
            self.opened_at, self.server_cpu_at_open = time.monotonic(), cpu_seconds(self.pid)
            self.deadline = self.opened_at + self.seconds
            self.open.set()
        await self.open.wait()


async def _session(browser, base: str, spec: Spec, gate: Gate, click_timeout: float,
                   load_timeout: float) -> SessionResult:
    from vitpe_core.gallery import gallery_caption

    res = SessionResult(spec=asdict(spec))
    caption = gallery_caption(spec.image)
    ctx = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await ctx.new_page()
    page.on("pageerror", lambda e: res.page_errors.append(str(e)[:200]))
    rng = random.Random(spec.seed)
    img = page.frame_locator(IMAGE_FRAME).locator("#image")
    try:
        t0 = time.monotonic()
        for attempt in range(2):
            if attempt == 0:
                await page.goto(share_url(base, ckpt=spec.ckpt, image=spec.image, patch=spec.patch),
                                timeout=load_timeout * 1000)
            else:
                res.reloads += 1
                await page.reload(timeout=load_timeout * 1000)
            await page.get_by_text(patch_label(spec.patch), exact=True).wait_for(timeout=load_timeout * 1000)
            await wait_script_run(page, load_timeout)
            try:   # the component can miss its first render under load (see RELIABILITY.md): reload once
                await img.wait_for(timeout=(30 if not attempt else load_timeout) * 1000)
                break
            except Exception:  # noqa: BLE001
                if attempt:
                    raise
        res.load_s = time.monotonic() - t0
        res.crosstalk += await _own_state(page, spec, spec.patch, caption)
    except Exception as e:  # noqa: BLE001 — every failure is a recorded error, the run goes on
        res.errors.append(f"load: {type(e).__name__}: {str(e).splitlines()[0]}")
        await ctx.close()
        await gate.arrive()
        return res
    await gate.arrive()
    current, H, W = spec.patch, *spec.grid
    while time.monotonic() < gate.deadline:
        target = current
        while target == current:
            target = (rng.randrange(H), rng.randrange(W))
        try:
            box = await img.bounding_box()
            t0 = time.monotonic()
            await img.click(position=click_point(box, target, spec.grid), timeout=click_timeout * 1000)
            await page.get_by_text(patch_label(target), exact=True).wait_for(timeout=click_timeout * 1000)
            res.latencies.append(time.monotonic() - t0)
            await wait_script_run(page, click_timeout)
            res.settled.append(time.monotonic() - t0)
            res.clicks += 1
            current = target
            res.crosstalk += await _own_state(page, spec, current, caption)
            if await page.locator("[data-testid='stException']").count():
                res.errors.append("an exception box is shown")
            state = await page.get_attribute("[data-testid=stApp]", "data-test-connection-state")
            if state != "CONNECTED":
                res.errors.append(f"connection state {state}")
        except Exception as e:  # noqa: BLE001
            res.errors.append(f"click {target}: {type(e).__name__}: {str(e).splitlines()[0]}")
            with contextlib.suppress(Exception):                                # resynchronise
                shown = await page.get_by_text(PATCH_TEXT).all_inner_texts()
                m = re.match(r"Patch \((\d+), (\d+)\)", shown[0]) if shown else None
                current = (int(m[1]), int(m[2])) if m else current
    await ctx.close()
    return res


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


async def _run(base: str, specs: list[Spec], seconds: float, click_timeout: float,
               load_timeout: float, server_pid: int) -> tuple[list[SessionResult], dict[str, float]]:
    """The sessions' results and the clicking phase's wall time and server CPU time."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await launch_chromium(p)
        try:
            gate = Gate(len(specs), seconds, server_pid)
            tasks = [asyncio.create_task(_session(browser, base, s, gate, click_timeout, load_timeout)) for s in specs]
            results = list(await asyncio.gather(*tasks))
            phase = {"wall_s": time.monotonic() - gate.opened_at,
                     "server_cpu_s": cpu_seconds(server_pid) - gate.server_cpu_at_open}
            return results, phase
        finally:
            await browser.close()


def _stats(xs: list[float]) -> dict[str, float | None]:
    r = lambda v: None if v is None else round(v, 3)
    return {"n": len(xs), "p50": r(percentile(xs, 50)), "p95": r(percentile(xs, 95)), "max": r(max(xs, default=None)),
            "mean": r(statistics.fmean(xs) if xs else None)}


def run_load(server: Server, specs: list[Spec], seconds: float, *, click_timeout: float = 30.0,
             load_timeout: float = 120.0) -> dict:
    """Drive `server` with one browser session per spec for `seconds` after all have loaded;
    returns the report (see the module docstring)."""
    loadavg = os.getloadavg()
    start_mem = memory_mb(server.pid)
    cpu0, busy0 = cpu_seconds(server.pid), machine_busy_seconds()
    sampler = MemorySampler(server.pid)
    sampler.start()
    t0 = time.monotonic()
    try:
        results, phase = asyncio.run(_run(server.url, specs, seconds, click_timeout, load_timeout, server.pid))
    finally:
        peak_rss = sampler.stop()
    wall = time.monotonic() - t0
    end_mem = memory_mb(server.pid)
    server_cpu, busy = cpu_seconds(server.pid) - cpu0, machine_busy_seconds() - busy0
    lat = [x for r in results for x in r.latencies]
    settled = [x for r in results for x in r.settled]
    clicks = sum(r.clicks for r in results)
    return {
        "sessions": len(specs), "seconds": seconds, "wall_s": round(wall, 1),
        "cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in loadavg],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()], "background_jobs": background_jobs(),
        "cpu": {"server_s": round(server_cpu, 1), "server_cores": round(server_cpu / wall, 2),
                "machine_busy_cores": round(busy / wall, 2),
                "server_ms_per_click": round(1000 * phase["server_cpu_s"] / clicks) if clicks else None,
                "note": "server_cores: the Streamlit server's CPU time / wall time (whole run); the rest of "
                        "machine_busy_cores is chromium, this script and any background job; "
                        "server_ms_per_click: server CPU time in the clicking phase / clicks"},
        "clicks": clicks, "clicks_per_s": round(clicks / seconds, 2),
        "latency_s": _stats(lat), "settled_s": _stats(settled),
        "page_load_s": _stats([r.load_s for r in results if r.load_s]),
        "errors": [f"session {i}: {e}" for i, r in enumerate(results) for e in r.errors],
        "crosstalk": [f"session {i}: {c}" for i, r in enumerate(results) for c in r.crosstalk],
        "page_errors": [f"session {i}: {e}" for i, r in enumerate(results) for e in r.page_errors],
        "reloads": sum(r.reloads for r in results),
        "sessions_without_answers": [i for i, r in enumerate(results) if r.clicks == 0],
        "memory_mb": {"rss_before": round(start_mem["rss"], 1),
                      "peak_rss_sampled": round(max(peak_rss, end_mem["rss"]), 1),
                      "hwm": round(end_mem["hwm"], 1), "rss_after": round(end_mem["rss"], 1)},
        "healthy_after": health_ok(server.url),
        "per_session": [{"ckpt": r.spec["ckpt"], "image": r.spec["image"], "clicks": r.clicks,
                         "p50_s": _stats(r.latencies)["p50"], "errors": len(r.errors), "reloads": r.reloads}
                        for r in results],
    }


def page_memory(server: Server, pages: tuple[str, ...] = ("compare", "similarity", "bias", "checkpoints"),
                timeout: float = 300.0) -> dict:
    """The server's memory after one browser session opened each page in turn (`compare`
    first: it loads every checkpoint of the folder and traces the image through each)."""
    from playwright.sync_api import sync_playwright

    out = {"before": memory_mb(server.pid)}
    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            for name in pages:
                page.goto(share_url(server.url, page=name), timeout=timeout * 1000)
                page.wait_for_selector("h1", timeout=timeout * 1000)
                wait_script_run(page, timeout)
                page.wait_for_timeout(1000)
                out[f"after_{name}"] = memory_mb(server.pid)
        finally:
            browser.close()
    return {k: {m: round(v, 1) for m, v in d.items()} for k, d in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.load_test", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--port", type=int, default=None, help="server port (default: a free one)")
    ap.add_argument("--checkpoints", default=str(REPO / "checkpoints"),
                    help="checkpoint folder (tiny random-weight models if it holds none)")
    ap.add_argument("--click-timeout", type=float, default=30.0, help="seconds before a click counts as an error")
    ap.add_argument("--out", default=None, help="report file (default artifacts/load_test.json, "
                                                "or artifacts/memory.json with --memory-only)")
    ap.add_argument("--memory-only", action="store_true",
                    help="no load: open each page once (compare loads every checkpoint) and report the "
                         "server's VmRSS / VmHWM")
    args = ap.parse_args(argv)
    out = Path(args.out or REPO / "artifacts" / ("memory.json" if args.memory_only else "load_test.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which("chromium") is None:
        ap.error("Debian's chromium is needed (apt-get install chromium)")
    from vitpe_core.checkpoint import list_checkpoints
    from vitpe_core.gallery import gallery_ids

    with tempfile.TemporaryDirectory(prefix="vitpe-load-") as tmp:
        folder = Path(args.checkpoints)
        tiny = not (folder.is_dir() and list_checkpoints(folder))
        if tiny:
            print(f"no checkpoints in {folder}: using tiny random-weight ones", file=sys.stderr)
            folder = write_random_checkpoints(Path(tmp) / "checkpoints")
        if args.memory_only:
            with streamlit_server(folder, port=args.port) as server:
                report = {"checkpoints": str(folder), "names": list_checkpoints(folder),
                          "memory_mb": page_memory(server)}
            out.write_text(json.dumps(report, indent=2))
            print(json.dumps(report, indent=2))
            return 0
        specs = make_specs(args.sessions, checkpoint_grids(folder), gallery_ids())
        with streamlit_server(folder, port=args.port) as server:
            report = run_load(server, specs, args.seconds, click_timeout=args.click_timeout)
            report["server_log_tail"] = server.log_tail(1500)
    report["checkpoints"] = "tiny random-weight (harness.write_random_checkpoints)" if tiny else str(folder)
    report["command"] = " ".join(["python -m benchmarks.load_test", *(argv if argv is not None else sys.argv[1:])])
    out.write_text(json.dumps(report, indent=2))
    summary = {k: v for k, v in report.items() if k not in ("per_session", "server_log_tail")}
    summary["errors"], summary["crosstalk"] = report["errors"][:10], report["crosstalk"][:10]
    print(json.dumps(summary, indent=2))
    print(f"written to {out}")
    ok = (not report["errors"] and not report["crosstalk"] and report["healthy_after"]
          and not report["sessions_without_answers"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
