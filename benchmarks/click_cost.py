"""Server CPU per click on the bias page: what one visitor's click costs the server, apart from
what the browser costs.

    python -m benchmarks.click_cost                 # the shipped checkpoints/, 30 clicks
    python -m benchmarks.click_cost --tiny          # tiny random-weight checkpoints (the tests' set)

Starts `streamlit run app.py` on a free loopback port (`benchmarks.harness.streamlit_server`),
opens one headless chromium page on the bias page, clicks `clicks` different patches on the
clickable image one after the other (each waits for the new `Patch (r, c)` text and the end of
the script run), and reads the server process's user + system CPU time from /proc/<pid>/stat
before and after: (after - before) / clicks. Two warm-up clicks first (caches, first figures).
The browser runs in its own processes, so its cost is not counted; other load on the machine
(a training run) slows the wall clock but not the server's CPU time, except through cache
effects.

Also the helpers a driver needs to click the patch picker (`click_patch`, `PICKER_JS`), used by
tests/test_browser*.py: the picker is a Plotly chart (widget key `<page>_click`) whose axes are
the image's pixels (y downwards); its second trace has one marker per patch centre with
`customdata = [r, c]`.
"""
from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness

# Page coordinates inside patch (r, c) of the picker chart `el` (`.st-key-KEY .js-plotly-plot`):
# its marker for (r, c) (customdata) plus `where` - 0.5 of a cell (cell = the axis range / grid);
# null until Plotly has drawn it.
PICKER_JS = """([el, r, c, fy, fx, H, W]) => {
  const fl = el && el._fullLayout, tr = el && el.data && el.data[1];
  if (!fl || !fl.xaxis || !fl.xaxis.l2p || !tr || !tr.customdata) return null;
  const i = tr.customdata.findIndex(d => d[0] === r && d[1] === c);
  if (i < 0) return null;
  const cw = Math.abs(fl.xaxis.range[1] - fl.xaxis.range[0]) / W;
  const ch = Math.abs(fl.yaxis.range[1] - fl.yaxis.range[0]) / H;
  const b = el.getBoundingClientRect();
  return {x: b.left + fl.xaxis._offset + fl.xaxis.l2p(tr.x[i] + (fx - 0.5) * cw),
          y: b.top + fl.yaxis._offset + fl.yaxis.l2p(tr.y[i] + (fy - 0.5) * ch)};
}"""
OLD_FRAME = "iframe[title*='streamlit_image_coordinates']"   # the component used before (0.4.1)


def picker_selector(key: str) -> str:
    return f".st-key-{key} .js-plotly-plot"


def picker_point(page, key: str, patch: tuple[int, int], grid: tuple[int, int],
                 where: tuple[float, float] = (0.5, 0.5), timeout_s: float = 90.0) -> dict[str, float]:
    """Page coordinates inside `patch`'s cell of the picker with key `key` (`where`: (down,
    across) as fractions of the cell, (0.5, 0.5) = its centre); waits until the chart is drawn."""
    handle = page.wait_for_function(
        "([sel, ...a]) => (" + PICKER_JS + ")([document.querySelector(sel), ...a])",
        arg=[picker_selector(key), patch[0], patch[1], where[0], where[1], grid[0], grid[1]], timeout=timeout_s * 1e3)
    return handle.json_value()


def click_patch(page, key: str, patch: tuple[int, int], grid: tuple[int, int],
                where: tuple[float, float] = (0.5, 0.5), timeout_s: float = 90.0) -> None:
    """Click `patch` on the picker `key` (the Plotly chart; or the old iframe component, for
    measurements of the code before it was replaced)."""
    if page.locator(OLD_FRAME).count():
        image = page.frame_locator(OLD_FRAME).locator("#image")
        box = image.bounding_box()
        image.click(position={"x": box["width"] * (patch[1] + where[1]) / grid[1],
                              "y": box["height"] * (patch[0] + where[0]) / grid[0]})
        return
    pt = picker_point(page, key, patch, grid, where, timeout_s)
    page.mouse.click(pt["x"], pt["y"])


BIAS_TAB_CHARTS = {"On the image": "bias_bias_overlay", "Heatmap": "bias_bias_map", "All layers": "bias_bias_layers",
                   "All heads": "bias_bias_heads"}


def open_bias_tab(page, label: str, timeout_s: float = 90.0) -> None:
    """Open the bias explorer's tab `label` (of the bias map's tabs, key `bias_bias_tab`; the
    attention row has its own) and wait until its chart is drawn: only the open tab runs (a switch
    reruns the page), so the other tabs' charts are not on the page."""
    page.locator(".st-key-bias_bias_tab").get_by_role("tab", name=label, exact=True).click()
    page.wait_for_function("(sel) => { const e = document.querySelector(sel); return !!(e && e.data); }",
                           arg=picker_selector(BIAS_TAB_CHARTS[label]), timeout=timeout_s * 1e3)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/<pid>/stat)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def server_ms_per_click(checkpoints: str | Path, *, ckpt: str = "sape2+ape", clicks: int = 30,
                        grid: tuple[int, int] = (8, 8), image: str = "cifar10-test-0008",
                        timeout_s: float = 120.0) -> dict:
    """Server CPU milliseconds per click on the bias page (see the module docstring), with the
    wall-clock seconds per click seen by the browser."""
    from playwright.sync_api import sync_playwright

    H, W = grid
    patches = [((3 * i + 1) % H, (5 * i + 2) % W) for i in range(clicks + 2)]
    patches = [p if p != (H // 2, W // 2) else ((p[0] + 1) % H, p[1]) for p in patches]
    with harness.streamlit_server(checkpoints, timeout=timeout_s) as server, sync_playwright() as p:
        browser = harness.launch_chromium(p)
        try:
            pg = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            pg.set_default_timeout(timeout_s * 1e3)
            pg.goto(harness.share_url(server.url, ckpt=ckpt, image=image, patch=(H // 2, W // 2), layer=0))
            harness.wait_script_run(pg, timeout_s, harness.patch_label((H // 2, W // 2)))
            prev = (H // 2, W // 2)
            done, cpu0, t0 = 0, 0.0, 0.0
            for i, patch in enumerate(patches):
                if i == 2:
                    cpu0, t0 = cpu_seconds(server.pid), time.perf_counter()
                if patch == prev:
                    patch = (patch[0], (patch[1] + 1) % W)
                click_patch(pg, "bias_click", patch, grid)
                harness.wait_script_run(pg, timeout_s, harness.patch_label(patch))
                prev = patch
                done += i >= 2
            cpu1, t1 = cpu_seconds(server.pid), time.perf_counter()
        finally:
            browser.close()
    return {"server_cpu_ms_per_click": 1000 * (cpu1 - cpu0) / done, "wall_s_per_click": (t1 - t0) / done,
            "clicks": done, "checkpoint": ckpt, "cpu": cpu_model()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clicks", type=int, default=30)
    ap.add_argument("--tiny", action="store_true", help="tiny random-weight checkpoints instead of checkpoints/")
    ap.add_argument("--ckpt", default="sape2+ape")
    args = ap.parse_args(argv)
    if args.tiny:
        folder = harness.write_random_checkpoints(tempfile.mkdtemp(prefix="vitpe-click-cost-"))
        grid = (8, 8)
    else:
        folder = harness.REPO / "checkpoints"
        grid = harness.checkpoint_grids(folder)[args.ckpt]
    res = server_ms_per_click(folder, ckpt=args.ckpt, clicks=args.clicks, grid=tuple(grid))
    print(f"server CPU per click: {res['server_cpu_ms_per_click']:.0f} ms ({res['clicks']} clicks on the bias page, "
          f"{args.ckpt}{' tiny' if args.tiny else ''}; browser wall {res['wall_s_per_click']:.2f} s per click) "
          f"on {res['cpu']} ({__import__('os').cpu_count()} CPUs)")


if __name__ == "__main__":
    sys.exit(main())
