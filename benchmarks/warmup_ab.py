"""Cold start with and without the server's warm-up (pages/common/warmup.py), interleaved.

    python -m benchmarks.warmup_ab                  # 5 pairs on the shipped checkpoints/
    python -m benchmarks.warmup_ab --pairs 3 --tiny # tiny random-weight checkpoints

Each cold start is `streamlit run app.py` (`benchmarks.harness.streamlit_server`) with
`VITPE_WARMUP=0` (off) or `1` (on), in the order off/on, on/off, off/on, ... so a drift in the
machine's load falls on both alike. For each start, one headless chromium page opens the
default page and the script records, from process start, when the first element (`h1`)
shows and when the first script run is complete. These are the same two measures as
`python -m benchmarks.bench`'s cold-start rows. It prints the medians and the CPU; stop other
heavy jobs first (a training run doubles these times).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness
from benchmarks.click_cost import cpu_model


def cold_start(browser, root: Path, warmup: str) -> tuple[float, float]:
    """(first element s, first run s) of one cold start."""
    with harness.streamlit_server(root, timeout=120, env={"VITPE_WARMUP": warmup}) as server:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(server.url + "/")
            page.locator("h1").first.wait_for(state="visible", timeout=180_000)
            first_element = time.perf_counter() - server.started
            harness.wait_script_run(page)
            return first_element, time.perf_counter() - server.started
        finally:
            page.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=5, help="cold starts with and without the warm-up (default 5)")
    ap.add_argument("--tiny", action="store_true", help="tiny random-weight checkpoints instead of checkpoints/")
    args = ap.parse_args(argv)
    exe, reason = harness.chromium_or_reason()
    if exe is None:
        print(f"cannot measure: {reason}", file=sys.stderr)
        return 2
    root = (harness.write_random_checkpoints(Path(tempfile.mkdtemp(prefix="vitpe-ab-")), ("sape2+ape", "ape"))
            if args.tiny else harness.REPO / "checkpoints")
    from playwright.sync_api import sync_playwright

    runs: dict[str, list[tuple[float, float]]] = {"0": [], "1": []}
    with sync_playwright() as p:
        browser = harness.launch_chromium(p)
        try:
            for i in range(args.pairs):
                for setting in ("01" if i % 2 == 0 else "10"):
                    runs[setting].append(cold_start(browser, root, setting))
                    fe, fr = runs[setting][-1]
                    print(f"warm-up {'on ' if setting == '1' else 'off'}: first element {fe:.2f} s, "
                          f"first run {fr:.2f} s", flush=True)
        finally:
            browser.close()
    print(f"\nCPU: {cpu_model()}; {args.pairs} pairs; medians:")
    for setting, label in (("0", "off"), ("1", "on")):
        fe = statistics.median(r[0] for r in runs[setting])
        fr = statistics.median(r[1] for r in runs[setting])
        print(f"  warm-up {label:3}: first element {fe:.2f} s, first run complete {fr:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
