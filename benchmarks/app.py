"""Sections 4 and 5 of the benchmark, app side: the Streamlit app (`python -m streamlit run
app.py`) cold, in the browser, and its memory.

Cold start: to `/_stcore/health` and to `GET /` (HTTP), and in headless Debian chromium
(playwright) to the first element and to the end of the first script run, median over
`plan.app_runs` starts, the app's modules compiled to bytecode first (`compile_bytecode`). After
each, the floor: `FLOOR_APP`, a two-line Streamlit app, started and timed the same way (what
Streamlit and chromium alone take on this machine). In the last run: patch changes end to end
on the bias and compare pages (informational), and the server's resident memory (VmHWM /
VmRSS) after the first page, the compare page, and the compare page showing every listed
checkpoint. The server and browser helpers are `benchmarks.harness`'s.
"""
from __future__ import annotations

import compileall
import contextlib
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from benchmarks.checkpoints import CheckpointSet, app_default
from benchmarks.harness import (REPO, Server, chromium_or_reason, launch_chromium, patch_label, proc_memory,
                                streamlit_server, wait_charts_drawn, wait_script_run)
from benchmarks.timing import Plan
from vitpe_core.checkpoint import listed_checkpoints, load_checkpoint, resolve_checkpoint
from vitpe_core.viewstate import show_value

log = logging.getLogger(__name__)

# The floor of a cold start: a Streamlit app that imports nothing else and draws a title and a line.
FLOOR_APP = ('import plotly.graph_objects as go\nimport streamlit as st\n\n'
             'st.title("Floor")\nst.plotly_chart(go.Figure(go.Heatmap(z=[[0, 1], [1, 0]])))\n')
# What the app's server imports from the repository (compiled before the cold starts).
APP_SOURCES = ("app.py", "pages", "vitpe_core")


def compile_bytecode() -> float:
    """Compile the app's own modules to bytecode (`__pycache__`, ignored by git), as installing a
    package does (pip compiles what it installs) and a checkout's first start does where Python
    may write bytecode: no timed start compiles them, also where PYTHONDONTWRITEBYTECODE is set
    (this project's machines, the Dockerfile), which keeps Python from writing them but not from
    reading them. Returns the seconds it took."""
    t0 = time.perf_counter()
    for name in APP_SOURCES:
        path = REPO / name
        ok = (compileall.compile_dir(path, quiet=1) if path.is_dir() else compileall.compile_file(path, quiet=1))
        if not ok:
            raise RuntimeError(f"could not compile {path} to bytecode (a syntax error, or a folder this user cannot "
                               f"write; compileall's output above says which): each timed start would compile it")
    return time.perf_counter() - t0


def first_page(browser, server: Server) -> tuple[Any, dict[str, float]]:
    """Open the server's `/` in a new tab of `browser`: (the page, `page_times`)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    return page, page_times(page, server)


def page_times(page, server: Server) -> dict[str, float]:
    """Open the server's `/` in `page`: seconds from the server's process start to the first `h1`
    shown, to the end of the first script run and to its charts drawn."""
    page.goto(server.url + "/")
    page.locator("h1").first.wait_for(state="visible", timeout=180_000)
    times = {"first_element_s": time.perf_counter() - server.started}
    wait_script_run(page)
    times["first_run_s"] = time.perf_counter() - server.started
    times["first_chart_s"] = wait_charts_drawn(page) - server.started   # what a person waits for (the target)
    return times


def e2e_patch_changes(page, n: int, grid: tuple[int, int], start: tuple[int, int], prefix: str = "bias") -> list[float]:
    """Type a new row into the patch's row input and press Enter; time until the page shows
    the new patch and the rerun finished (ms)."""
    ms = []
    row_input = page.locator(f".st-key-{prefix}_row input").first   # the page's row input (ui.patch_controls)
    r, c = start
    for i in range(n):
        r = (r + 1 + i % (grid[0] - 1)) % grid[0]
        t0 = time.perf_counter()
        row_input.fill(str(r))
        row_input.press("Enter")
        wait_script_run(page, 120, patch_label((r, c)))
        ms.append(1e3 * (time.perf_counter() - t0))
    return ms


def bench_app(plan: Plan, cs: CheckpointSet, workdir: Path) -> dict:
    """Cold starts (HTTP always; browser where chromium + playwright work), then in the last
    run: patch changes on the bias page, the compare page with every checkpoint, its memory."""
    exe, reason = chromium_or_reason()
    runs: list[dict] = []
    floor: list[dict] = []
    out: dict[str, Any] = {"checkpoints": cs.names, "listed": listed_checkpoints(cs.root), "fresh": cs.fresh,
                           "default": app_default(cs),
                           "browser": reason is None, "browser_reason": reason, "bytecode_s": compile_bytecode()}
    floor_app = workdir / "floor_app.py"
    floor_app.write_text(FLOOR_APP)
    with contextlib.ExitStack() as stack:
        browser = None
        if exe is not None:
            from playwright.sync_api import sync_playwright

            try:
                browser = launch_chromium(stack.enter_context(sync_playwright()))
                stack.callback(browser.close)
            except Exception as e:  # a browser that will not start is reported, not fatal
                out["browser"], out["browser_reason"] = False, f"chromium did not launch: {e}"
                browser = None
        for i in range(plan.app_runs):
            last = i == plan.app_runs - 1
            log.info("app cold start %d/%d", i + 1, plan.app_runs)
            with streamlit_server(cs.root, log=workdir / f"streamlit-{i}.log", timeout=120) as server:
                run = dict(server.ready)
                if browser is not None:
                    page, times = first_page(browser, server)
                    run.update(times, after_first_page_mib=proc_memory(server.pid))
                    if last:
                        out.update(_browse(page, server, plan, cs, out["listed"]))
                    page.close()
                runs.append(run)
            if browser is not None:          # the floor, right after: the same machine's state
                with streamlit_server(cs.root, log=workdir / f"streamlit-floor-{i}.log", timeout=120,
                                      script=floor_app) as server:
                    page, times = first_page(browser, server)
                    page.close()
                    floor.append({**server.ready, **times})
    out["runs"] = runs
    if floor:
        out["floor_runs"] = floor
        for key in ("first_run_s", "first_chart_s"):
            out[f"floor_{key}"] = float(np.median([r[key] for r in floor]))
            out[f"floor_{key[:-2]}_max_s"] = max(r[key] for r in floor)
    for key in ("health_s", "get_root_s", "first_element_s", "first_run_s", "first_chart_s"):
        values = [r[key] for r in runs if key in r]
        if values:
            out[key] = float(np.median(values))
    for key in ("first_run_s", "first_chart_s"):  # the target: the first page's charts in every cold start
        if any(key in r for r in runs):
            out[f"{key[:-2]}_max_s"] = max(r[key] for r in runs if key in r)
    return out


def _browse(page, server: Server, plan: Plan, cs: CheckpointSet, listed: list[str]) -> dict:
    """The last run's browsing: patch changes on the bias page, the compare page (its default
    view, then every listed checkpoint shown) with the server's memory after each."""
    cfg = load_checkpoint(resolve_checkpoint(app_default(cs), cs.root)).config
    start = (cfg.grid[0] // 2, cfg.grid[1] // 2)            # the default view's patch
    out: dict[str, Any] = {"e2e_bias": e2e_patch_changes(page, plan.e2e_clicks, cfg.grid, start)}
    t0 = time.perf_counter()
    page.goto(server.url + "/compare")
    wait_script_run(page)
    out["compare_first_run_s"] = time.perf_counter() - t0
    out["after_compare"] = proc_memory(server.pid)
    out["e2e_compare"] = e2e_patch_changes(page, plan.e2e_clicks, cfg.grid, start, prefix="compare")
    # the most the page can hold: every listed one shown
    page.goto(server.url + "/compare?show=" + quote(show_value(listed), safe=",/"))
    wait_script_run(page)
    out["after_compare_all"] = proc_memory(server.pid)
    return out
