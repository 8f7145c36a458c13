"""Load test of the Streamlit app: many concurrent sessions on loopback; the figures go into
RELIABILITY.md ("Load").

    python -m benchmarks.load_test --sessions 50 --seconds 60 --browsers 3   # -> artifacts/load_test.json
    python -m benchmarks.load_test --sessions 8 --seconds 15                 # what tests/test_load.py runs
    python -m benchmarks.load_test --engine browser --sessions 20 --seconds 60   # chromium pages only
    python -m benchmarks.load_test --memory-only    # the server's memory with every checkpoint loaded

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

`--checkpoints` defaults to `checkpoints/`; if that holds no checkpoint, the tests' tiny
random-weight set (`harness.write_random_checkpoints`) is written to a temporary folder.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
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

from benchmarks.harness import (REPO, Server, background_jobs, checkpoint_grids, click_point,
                                health_ok, launch_chromium, patch_label, picker_area, proc_memory, share_url,
                                streamlit_server,
                                url_params, wait_script_run, write_random_checkpoints)

PATCH_TEXT = re.compile(r"^Patch \(\d+, \d+\)$")
SERVER_ARGS = ("--server.fileWatcherType", "none")   # as deployed: no watching of the source tree


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for the report."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


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


# ----------------------------------------------------------------------------- websocket sessions
PAGES = ("bias", "similarity", "compare", "checkpoints")
ACTIONS = ("click", "page", "upload", "share")
WEIGHTS = (0.6, 0.15, 0.1, 0.15)            # the mix of actions a session draws from
PATCH_MD = re.compile(r"\*\*Patch \((\d+), (\d+)\)\*\*")
UPLOAD_NAME = re.compile(r"load-s(\d+)-u\d+\.png")
MODEL_NAME = "loadmodel"                     # the one imported model: `loadmodel.npz` -> `loadmodel-upload`
MODEL_GRID = (8, 8)                          # its patch grid (32 px, patch 4)


def tiny_model_npz(seed: int = 0) -> bytes:
    """A small timm-layout ViT (.npz of its state dict, as `np.savez` writes timm's weights):
    what a visitor would upload on the Checkpoints page ("Import your own ViT")."""
    import io

    import numpy as np
    import torch

    from vitpe_core import ViTConfig, build_model

    torch.manual_seed(seed)
    model = build_model(ViTConfig(img_size=(32, 32), patch_size=4, dim=64, depth=2, heads=1, mlp_dim=64,
                                  num_classes=10))
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    sd["pos_embed"] = sd.pop("pos_enc.pos_embed")
    buf = io.BytesIO()
    np.savez(buf, **sd)
    return buf.getvalue()


def upload_png(session: int, n: int, side: int = 96) -> bytes:
    """A distinct photo-sized PNG for each (session, upload)."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1000 * session + n)
    a = rng.integers(0, 256, (side // 8, side // 8, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


@dataclass
class WsResult:
    spec: dict
    index: int
    latency: dict[str, list[float]] = field(default_factory=lambda: {a: [] for a in (*ACTIONS, "model", "open")})
    clicks: int = 0
    clicks_sent: int = 0
    errors: list[str] = field(default_factory=list)
    crosstalk: list[str] = field(default_factory=list)
    bytes: int = 0
    uploads: list[str] = field(default_factory=list)
    phase_clicks: int = 0                     # clicks in the click-only phase
    reloads: int = 0                          # a broken page (no patch picker) opened again


def _link(page_text_code: list[str]) -> str | None:
    for t in page_text_code:
        if t.startswith("http://") or t.startswith("https://"):
            return t.strip()
    return None


def share_link_of(session) -> str | None:
    """The page's "Link to this view" (the sidebar's code block)."""
    return _link([el.code_text for kind, el in session.page.elements.values() if kind == "code"])


def check_page(session, res: WsResult, *, page: str, ckpt: str | None = None, patch: tuple[int, int] | None = None,
               upload: str | None = None, owners: dict[str, int] | None = None) -> list[str]:
    """What on the page is wrong: an exception, another page than asked for, a missing own
    upload; and cross-talk (to `res.crosstalk`): another session's patch, checkpoint, upload
    (by name on the page, or its `upload:<sha256>` in the view; `owners`: id -> session) or
    imported model."""
    p = session.page
    wrong = [f"exception on {page}: {e}" for e in p.exceptions(trace=True)]
    texts = p.texts()
    if session.pages.get(page) and p.page_script_hash != session.pages[page]:
        wrong.append(f"{page}: the server ran another page ({session.notices[-1:]})")
    text = "\n".join(texts)
    seen = {m for m in UPLOAD_NAME.findall(text)}
    if seen - {str(res.index)}:
        res.crosstalk.append(f"{page}: another session's upload on the page: sessions {sorted(seen)}")
    if upload and upload not in text:
        wrong.append(f"{page}: own upload {upload!r} not shown")
    for key, w in p.widgets().items():
        if key.endswith("_ckpt") and w.kind == "selectbox":
            models = [o for o in w.proto.options if o.endswith("-upload")]
            if models and (res.index != 0 or models != [f"{MODEL_NAME}-upload"]):
                res.crosstalk.append(f"{page}: imported models {models} in session {res.index}'s list")
    link = share_link_of(session)
    q = url_params(link) if link else {}
    image = q.get("image") or ""
    if image.startswith("upload:") and owners is not None and owners.get(image, res.index) != res.index:
        res.crosstalk.append(f"{page}: session {owners[image]}'s upload {image[:15]}... in session {res.index}'s view")
    # Not this session's patch or checkpoint: a wrong view (an error). Only what identifies
    # another session (its upload, its model) counts as cross-talk: starting views repeat.
    if patch is not None:
        shown = PATCH_MD.findall(text)
        if shown != [(str(patch[0]), str(patch[1]))]:
            wrong.append(f"{page}: patch texts {shown}, expected {patch}")
        if q.get("patch") != f"{patch[0]},{patch[1]}":
            wrong.append(f"{page}: link {link} does not carry patch {patch}")
    if ckpt is not None and q.get("ckpt") != ckpt:
        wrong.append(f"{page}: link {link} does not carry ckpt {ckpt}")
    return wrong


def click_state(session, page: str, target: tuple[int, int], grid: tuple[int, int]) -> tuple[str, dict]:
    """How the tab sends a click on patch `target`, as the page offers it: the clickable image
    component (`<page>_click`, its {x, y, width, height} value), a Plotly chart with point
    selection (the selection of the patch's point), else the row/column number inputs."""
    widgets = session.page.widgets()
    w = widgets.get(f"{page}_click")
    (r, c), (H, W) = target, grid
    if w is not None and w.kind == "component_instance":
        width, height = 20.0 * W, 20.0 * H
        session.set_json_value(w.id, {"x": (c + 0.5) * width / W, "y": (r + 0.5) * height / H, "width": width,
                                      "height": height, "unix_time": int(time.time() * 1000)})
        return "component", {}
    if w is not None and w.kind == "plotly_chart":
        # what Streamlit's frontend sends for a click on one marker of the picker's scatter trace
        # (trace 1, over the image trace 0): the point's index, position and customdata [r, c]
        n = r * W + c
        point = {"curve_number": 1, "point_number": n, "point_index": n, "x": (c + 0.5) * 20, "y": (r + 0.5) * 20,
                 "customdata": [r, c]}
        session.set_selection(w.id, {"selection": {"points": [point], "point_indices": [n], "box": [],
                                                   "lasso": []}})
        return "plotly", {}
    session.set_number(f"{page}_row", r)
    session.set_number(f"{page}_col", c)
    return "inputs", {}


async def _reload(s, base: str, spec: Spec, ckpt: str, grid: tuple[int, int], patch: tuple[int, int],
                  timeout: float):
    """Close the tab and open its last link (bias page) again: (session, page, ckpt, grid, patch)
    as the reloaded page shows them."""
    from benchmarks.st_client import open_session

    link = share_link_of(s) if s.page.elements else None
    q = url_params(link) if link else {}
    q = {"ckpt": q.get("ckpt", ckpt), "image": q.get("image", spec.image), "patch": q.get("patch")}
    await s.close()
    url = share_url(base, ckpt=q["ckpt"], image=q["image"],
                    patch=tuple(int(x) for x in q["patch"].split(",")) if q["patch"] else patch)
    s, _ = await open_session(base, "/?" + url.split("?", 1)[1], timeout)
    shown = url_params(share_link_of(s) or "")
    ckpt = shown.get("ckpt", q["ckpt"])
    grid = MODEL_GRID if ckpt == f"{MODEL_NAME}-upload" else spec.grid
    patch = tuple(int(x) for x in shown["patch"].split(",")) if shown.get("patch") else patch
    return s, "bias", ckpt, grid, patch


async def ws_user(base: str, spec: Spec, index: int, gate: "PhaseGate", *, think: tuple[float, float],
                  click_timeout: float, load_timeout: float, model_npz: bytes | None,
                  click_phase: float, grids: dict[str, tuple[int, int]] | None = None) -> WsResult:
    """One visitor: opens a share link, then until the deadline draws actions (clicks, page
    views, image uploads, opening its share link in a new tab); session 0 also imports a model."""
    from benchmarks.st_client import open_session

    res = WsResult(spec=asdict(spec), index=index)
    rng = random.Random(spec.seed)
    grids = grids or {spec.ckpt: spec.grid}
    page, patch, upload, n_up, ckpt, grid = "bias", spec.patch, None, 0, spec.ckpt, spec.grid
    s = None
    try:
        t0 = time.monotonic()
        s, _ = await open_session(base, "/?" + share_url(base, ckpt=spec.ckpt, image=spec.image,
                                                           patch=spec.patch).split("?", 1)[1], load_timeout)
        res.latency["open"].append(time.monotonic() - t0)
        res.errors += check_page(s, res, owners=gate.owners, page="bias", ckpt=ckpt, patch=patch)
    except Exception as e:  # noqa: BLE001 — every failure is recorded, the run goes on
        res.errors.append(f"open: {type(e).__name__}: {e}")
        gate.leave_early()
        await gate.arrive()
        if s is not None:
            await s.close()
        return res
    await gate.arrive()
    model_at = gate.opened_at if (model_npz is not None and index == 0) else None   # its first action
    queued: list[str] = []      # after the import: a click (on the bias page) and its share link, always
    while time.monotonic() < gate.deadline:
        if model_at is not None and time.monotonic() >= model_at:
            action, model_at, queued = "model", None, ["click", "share"]
        elif queued:
            action = queued.pop(0)
        else:
            action = rng.choices(ACTIONS, WEIGHTS)[0]
            if action in ("upload", "share") and page != "bias":
                action = "page"
        try:
            t0 = time.monotonic()
            if action == "click":
                if page != "bias":
                    await s.run(page="bias", timeout=click_timeout)
                    page = "bias"
                if not any(k in s.page.widgets() for k in ("bias_click", "bias_row")):
                    # the page broke (an exception box, no picker): reload it, as a visitor would
                    s, page, ckpt, grid, patch = await _reload(s, base, spec, ckpt, grid, patch, load_timeout)
                    res.reloads += 1
                    res.errors += check_page(s, res, owners=gate.owners, page="bias", ckpt=ckpt, patch=patch)
                H, W = grid
                target = patch
                while target == patch:
                    target = (rng.randrange(H), rng.randrange(W))
                click_state(s, "bias", target, grid)
                res.clicks_sent += 1
                st = await s.run(timeout=click_timeout)
                patch = target
                res.clicks += 1
                res.bytes += st.bytes
                res.errors += check_page(s, res, owners=gate.owners, page="bias", ckpt=ckpt, patch=patch, upload=upload)
            elif action == "page":
                page = rng.choice([p for p in PAGES if p != page])
                st = await s.run(page=page, timeout=click_timeout)
                res.bytes += st.bytes
                # a page may show another checkpoint than the session's (the similarity page needs
                # a position table): the session's view is what its link now says
                q = url_params(share_link_of(s) or "")
                if q.get("ckpt") and q["ckpt"] != ckpt:
                    ckpt = q["ckpt"]
                    grid = grids.get(ckpt, MODEL_GRID if ckpt == f"{MODEL_NAME}-upload" else grid)
                if q.get("patch"):
                    patch = tuple(int(x) for x in q["patch"].split(","))
                res.errors += check_page(s, res, owners=gate.owners, page=page,
                                         upload=upload if page == "bias" else None)
            elif action == "upload":
                n_up += 1
                name = f"load-s{index}-u{n_up}.png"
                await s.upload(f"{page}_upload" if f"{page}_upload" in s.page.widgets() else
                               next(k for k in s.page.widgets() if k.startswith(f"{page}_upload")),
                               name, upload_png(index, n_up), "image/png")
                st = await s.run(timeout=click_timeout)
                res.bytes += st.bytes
                upload = name
                res.uploads.append(name)
                image = url_params(share_link_of(s) or "").get("image", "")
                if image.startswith("upload:"):                  # a shareable upload: its id is this session's
                    gate.owners.setdefault(image, index)
                text = s.page.text()
                m = PATCH_MD.findall(text)
                patch = (int(m[0][0]), int(m[0][1])) if m else patch
                res.errors += check_page(s, res, owners=gate.owners, page=page, upload=upload)
            elif action == "share":
                link = share_link_of(s)
                other, _ = await open_session(base, "/?" + link.split("?", 1)[1], load_timeout)
                try:
                    res.errors += check_page(other, res, owners=gate.owners, page="bias", ckpt=ckpt, patch=patch)
                    theirs, mine = url_params(share_link_of(other) or "").get("image"), url_params(link).get("image")
                    if theirs != mine:                           # an upload's link opens the same upload
                        res.errors.append(f"share: the link's image {mine} opened as {theirs}")
                finally:
                    await other.close()
            elif action == "model":
                st = await s.run(page="checkpoints", timeout=click_timeout)
                page = "checkpoints"
                await s.upload("checkpoints_model_upload", f"{MODEL_NAME}.npz", model_npz)
                await s.run(timeout=click_timeout)
                await s.run(timeout=load_timeout, trigger=s.trigger("checkpoints_model_import"))
                text = s.page.text()
                if f"Imported as `{MODEL_NAME}-upload`" not in text:
                    res.errors.append(f"model import not confirmed: {[t for t in s.page.texts() if 'mport' in t]}")
                res.errors += check_page(s, res, owners=gate.owners, page="checkpoints")
                ck = s.page.widgets().get("checkpoints_ckpt")
                if ck is None or f"{MODEL_NAME}-upload" not in ck.proto.options:
                    res.errors.append("the imported model is not in its own session's checkpoint list")
                q = url_params(share_link_of(s) or "")
                ckpt = q.get("ckpt", ckpt)            # the page switches the session to the imported model
                grid = MODEL_GRID if ckpt == f"{MODEL_NAME}-upload" else grid
                patch = tuple(int(x) for x in q["patch"].split(",")) if q.get("patch") else patch
            res.latency[action].append(time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001
            res.errors.append(f"{action}: {type(e).__name__}: {str(e)[:200]}")
            # The tab no longer knows what the server is doing (a late answer would be taken for
            # the next one's): reload it from its last link, as a visitor would, and carry on.
            try:
                s, page, ckpt, grid, patch = await _reload(s, base, spec, ckpt, grid, patch, load_timeout)
                res.reloads += 1
            except Exception as e2:  # noqa: BLE001
                res.errors.append(f"reload: {type(e2).__name__}: {str(e2)[:200]}")
                break
        await asyncio.sleep(rng.uniform(*think))
    # the click-only phase: server CPU per click without page views, uploads or new sessions
    if click_phase > 0 and s.closed_reason:
        gate.leave_early()
    elif click_phase > 0:
        await gate.arrive_phase()
        try:
            if page != "bias":
                await s.run(page="bias", timeout=click_timeout)
            while time.monotonic() < gate.phase_deadline or not res.phase_clicks:   # at least one each
                H, W = grid
                target = patch
                while target == patch:
                    target = (rng.randrange(H), rng.randrange(W))
                click_state(s, "bias", target, grid)
                t0 = time.monotonic()
                res.clicks_sent += 1
                await s.run(timeout=click_timeout)
                patch = target
                res.latency["click"].append(time.monotonic() - t0)
                res.clicks += 1
                res.phase_clicks += 1
                res.errors += check_page(s, res, owners=gate.owners, page="bias", ckpt=ckpt, patch=patch, upload=upload)
                await asyncio.sleep(rng.uniform(*think))
        except Exception as e:  # noqa: BLE001
            res.errors.append(f"click phase: {type(e).__name__}: {str(e)[:200]}")
        await gate.leave_phase()
    await s.close()
    return res


class PhaseGate(Gate):
    """`Gate` plus the click-only phase: it opens when every session still running arrived
    (or after `wait` s) and lasts `phase` s; the server's CPU time is read at both ends."""

    def __init__(self, n: int, seconds: float, server_pid: int, phase: float, wait: float = 120.0):
        super().__init__(n, seconds, server_pid)
        self.phase, self.wait, self.active = phase, wait, n
        self.phase_arrived, self.phase_left = 0, 0
        self.phase_open = asyncio.Event()
        self.phase_deadline = float("inf")
        self.phase_cpu = [0.0, 0.0]
        self.phase_time = [0.0, 0.0]
        self.owners: dict[str, int] = {}        # upload:<sha256> -> the session that uploaded it

    def _open_phase(self) -> None:
        if not self.phase_open.is_set():
            self.phase_time[0], self.phase_cpu[0] = time.monotonic(), cpu_seconds(self.pid)
            self.phase_deadline = self.phase_time[0] + self.phase
            self.phase_open.set()

    def leave_early(self) -> None:
        """A session that will not reach the phase (it failed, or is a browser session)."""
        self.active -= 1
        if self.phase_arrived and self.phase_arrived >= self.active:
            self._open_phase()

    async def arrive_phase(self) -> None:
        self.phase_arrived += 1
        if self.phase_arrived >= self.active:
            self._open_phase()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.phase_open.wait(), self.wait)
        self._open_phase()

    async def leave_phase(self) -> None:
        self.phase_left += 1
        self.phase_time[1], self.phase_cpu[1] = time.monotonic(), cpu_seconds(self.pid)


async def _browser_check(base: str, specs: list[Spec], gate: PhaseGate, click_timeout: float,
                         load_timeout: float) -> list[SessionResult]:
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


async def _run_ws(base: str, specs: list[Spec], browser_specs: list[Spec], seconds: float, *, pid: int,
                  think: tuple[float, float], click_timeout: float, load_timeout: float, model_npz: bytes | None,
                  click_phase: float) -> tuple[list[WsResult], list[SessionResult], PhaseGate]:
    gate = PhaseGate(len(specs) + len(browser_specs), seconds, pid, click_phase)
    grids = {s.ckpt: s.grid for s in specs}

    def user(i, spec):
        return ws_user(base, spec, i, gate, think=think, click_timeout=click_timeout, load_timeout=load_timeout,
                       model_npz=model_npz, click_phase=click_phase, grids=grids)

    tasks = [asyncio.create_task(user(i, s)) for i, s in enumerate(specs)]
    btask = (asyncio.create_task(_browser_check(base, browser_specs, gate, click_timeout, load_timeout))
             if browser_specs else None)
    results = list(await asyncio.gather(*tasks))
    browsers = await btask if btask else []
    return results, browsers, gate


def run_ws_load(server: Server, specs: list[Spec], seconds: float, *, browsers: int = 0,
                think: tuple[float, float] = (1.0, 3.0), click_timeout: float = 60.0, load_timeout: float = 180.0,
                model_upload: bool = True, click_phase: float = 15.0, warm: bool = False) -> dict:
    """Drive `server` with one websocket session per spec (and `browsers` chromium pages) for
    `seconds` after all have loaded, then the click-only phase; returns the report."""
    from vitpe_core.gallery import gallery_ids

    if warm:   # one visitor before the crowd: the server's first script run (its imports) is over
        from benchmarks.st_client import open_session

        async def first_visit():
            s, _ = await open_session(server.url, "/?page=bias", load_timeout)
            await s.close()
        asyncio.run(first_visit())
    grids = {s.ckpt: s.grid for s in specs}
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
                                                  click_phase=click_phase))
    finally:
        peak_rss = sampler.stop()
    wall = time.monotonic() - t0
    end_mem = memory_mb(server.pid)
    server_cpu, busy, own = cpu_seconds(server.pid) - cpu0, machine_busy_seconds() - busy0, time.process_time() - own0
    lat = {a: [x for r in results for x in r.latency[a]] for a in results[0].latency} if results else {}
    clicks = sum(r.clicks for r in results)
    phase_clicks = sum(r.phase_clicks for r in results)
    phase_cpu = gate.phase_cpu[1] - gate.phase_cpu[0]
    phase_wall = gate.phase_time[1] - gate.phase_time[0]
    click_bytes = [r.bytes / r.clicks for r in results if r.clicks]
    report = {
        "engine": "websocket (benchmarks.st_client)", "sessions": len(specs), "browsers": browsers, "warm": warm,
        "seconds": seconds, "click_phase_s": click_phase, "think_s": list(think), "wall_s": round(wall, 1),
        "cpu_model": cpu_model(), "cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in loadavg],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()], "background_jobs": background_jobs(),
        "actions": {a: len(v) for a, v in lat.items()},
        "latency_s": {a: _stats(v) for a, v in lat.items()},
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
        "sessions_without_clicks": [r.index for r in results if r.clicks == 0],
        "memory_mb": {"rss_before": round(start_mem["rss"], 1),
                      "peak_rss_sampled": round(max(peak_rss, end_mem["rss"]), 1),
                      "hwm": round(end_mem["hwm"], 1), "rss_after": round(end_mem["rss"], 1)},
        "healthy_after": health_ok(server.url),
    }
    if browsers:
        report["browser_check"] = {
            "sessions": browsers, "clicks": sum(r.clicks for r in bres),
            "latency_s": _stats([x for r in bres for x in r.latencies]),
            "errors": [f"browser {i}: {e}" for i, r in enumerate(bres) for e in r.errors],
            "crosstalk": [f"browser {i}: {c}" for i, r in enumerate(bres) for c in r.crosstalk],
            "page_errors": [f"browser {i}: {e}" for i, r in enumerate(bres) for e in r.page_errors],
            "reloads": sum(r.reloads for r in bres),
            "sessions_without_answers": [i for i, r in enumerate(bres) if r.clicks == 0]}
    return report


def passed(report: dict) -> bool:
    """No error, unanswered click, cross-talk or session without clicks; healthy afterwards."""
    b = report.get("browser_check") or {}
    return (not report["errors"] and not report["crosstalk"] and not report["unanswered_clicks"]
            and not report["sessions_without_clicks"] and report["healthy_after"]
            and not b.get("errors") and not b.get("crosstalk") and not b.get("sessions_without_answers"))


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
    args = ap.parse_args(argv)
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
        specs = make_specs(args.sessions, checkpoint_grids(folder), gallery_ids())
        with streamlit_server(folder, port=args.port, args=SERVER_ARGS, env=env) as server:
            if args.engine == "browser":
                report = run_load(server, specs, args.seconds, click_timeout=args.click_timeout)
                ok = (not report["errors"] and not report["crosstalk"] and report["healthy_after"]
                      and not report["sessions_without_answers"])
            else:
                lo, hi = (float(x) for x in args.think.split(","))
                report = run_ws_load(server, specs, args.seconds, browsers=args.browsers, think=(lo, hi),
                                     click_timeout=args.click_timeout, model_upload=not args.no_model,
                                     click_phase=args.click_phase, warm=args.warm)
                ok = passed(report)
            report["server_log_tail"] = server.log_tail(1500)
    report["checkpoints"] = "tiny random-weight (harness.write_random_checkpoints)" if tiny else str(folder)
    report["command"] = " ".join(["python -m benchmarks.load_test", *(argv if argv is not None else sys.argv[1:])])
    out.write_text(json.dumps(report, indent=2))
    summary = {k: v for k, v in report.items() if k not in ("per_session", "server_log_tail")}
    summary["errors"], summary["crosstalk"] = report["errors"][:10], report["crosstalk"][:10]
    print(json.dumps(summary, indent=2))
    print(f"written to {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
