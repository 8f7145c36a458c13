"""The load test's browser sessions: Debian's chromium through playwright, each a context of its
own that opens a share link and clicks the real image, its view checked after every click
(`_own_state`: the patch text, the widgets, the URL). Three uses: beside the websocket
sessions, so that a real browser's click is seen to land under load (`browser_check`); alone
(`run_load`, `--engine browser`); and the server's memory after each page once (`page_memory`,
`--memory-only`)."""
from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import time
from dataclasses import asdict, dataclass, field

from benchmarks.harness import (Server, background_jobs, click_point, health_ok, launch_chromium, patch_label,
                                picker_area, share_url, url_params, wait_script_run)
from benchmarks.load_plan import Gate, PhaseGate, Spec
from benchmarks.load_probes import MemorySampler, cpu_seconds, latency_stats, machine_busy_seconds, memory_mb

PATCH_TEXT = re.compile(r"^Patch \(\d+, \d+\)$")


@dataclass
class SessionResult:
    """What one browser session saw: its clicks and their latencies, errors and cross-talk."""

    spec: dict
    clicks: int = 0
    latencies: list[float] = field(default_factory=list)        # click -> patch text, s
    settled: list[float] = field(default_factory=list)          # click -> script run finished, s
    load_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    crosstalk: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)        # uncaught JavaScript errors
    reloads: int = 0                                            # image never appeared: reloaded once


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


async def _session(browser, base: str, spec: Spec, gate: Gate, click_timeout: float,
                   load_timeout: float) -> SessionResult:
    """One chromium session: open the share link (reloaded once if the clickable image does not
    appear), wait at `gate`, then click random patches until its deadline, checking each answer."""
    from vitpe_core.gallery import gallery_caption

    res = SessionResult(spec=asdict(spec))
    caption = gallery_caption(spec.image)
    ctx = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await ctx.new_page()
    page.on("pageerror", lambda e: res.page_errors.append(str(e)[:200]))
    rng = random.Random(spec.seed)
    img = picker_area(page, "bias_click")
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
            try:   # the clickable image must appear; if it does not within 30 s, reload once
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
        "latency_s": latency_stats(lat), "settled_s": latency_stats(settled),
        "page_load_s": latency_stats([r.load_s for r in results if r.load_s]),
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
                         "p50_s": latency_stats(r.latencies)["p50"], "errors": len(r.errors), "reloads": r.reloads}
                        for r in results],
    }


def page_memory(server: Server, pages: tuple[str, ...] = ("compare", "similarity", "bias", "checkpoints"),
                timeout: float = 300.0) -> dict:
    """The server's memory after one browser session opened each page in turn (`compare`
    first: it loads the checkpoints it shows by default, every one of the main folder, and
    traces the image through each)."""
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


async def browser_check(base: str, specs: list[Spec], gate: PhaseGate, click_timeout: float,
                        load_timeout: float) -> list[SessionResult]:
    """One chromium session per spec beside the websocket sessions (`--browsers`): they share
    the websocket sessions' gate, and leave it before the click-only phase."""
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await launch_chromium(p)
        try:
            async def one(spec):
                try:
                    return await _session(browser, base, spec, gate, click_timeout, load_timeout)
                finally:
                    gate.leave_early()
            return list(await asyncio.gather(*(one(s) for s in specs)))
        finally:
            await browser.close()
