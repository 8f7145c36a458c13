"""The README's screenshot of the HTML report open in a browser (re-run after retraining):

    python scripts/screenshot_report.py                       # checkpoints/sape2+ape -> docs/screenshot_report.png
    python scripts/screenshot_report.py --checkpoint ape --out /tmp/report.png

Writes the report as `python -m vitpe_core report` does, opens it from disk (file://) in headless
Debian chromium with every http(s) request aborted (no server, no network), picks the photo in the
offline bias explorer, clicks a patch of its bias map, and shoots the explorer: the controls, the
bias row, the attention row and the rollout, 1500 px wide. Saved as `screenshots.save_small` saves
the app's (a 256-colour palette when that keeps the PNG under 400 KB). Needs chromium and playwright.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))    # the repository root
from benchmarks import harness  # noqa: E402
from scripts.screenshots import save_small  # noqa: E402

REPO = harness.REPO
TIMEOUT_MS = 120_000
PATCH = (2, 5)


def shoot(report: Path, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = harness.launch_chromium(p)
        page = browser.new_page(viewport={"width": 1500, "height": 1300})
        page.route("http://**/*", lambda route: route.abort())
        page.route("https://**/*", lambda route: route.abort())
        page.goto(report.as_uri())
        page.wait_for_function("document.body.dataset.ready === '1'", timeout=TIMEOUT_MS)
        photo = page.locator("#sel-image option").filter(has_text="photo").first.get_attribute("value")
        page.select_option("#sel-image", photo)
        page.select_option("#sel-layer", "2")
        area = page.locator('[data-fig="explorer.figures.bias"] .nsewdrag').first
        area.scroll_into_view_if_needed()
        box = area.bounding_box()
        grid = page.evaluate("window.vitpeExplorer.ex.grid")
        x = box["x"] + (PATCH[1] + 0.5) / grid[1] * box["width"]
        y = box["y"] + (PATCH[0] + 0.5) / grid[0] * box["height"]
        page.mouse.move(x, y)
        page.mouse.click(x, y)
        page.wait_for_function(f"document.body.dataset.patch === '{PATCH[0]},{PATCH[1]}'", timeout=TIMEOUT_MS)
        page.mouse.move(5, 5)                                      # no hover label in the picture
        page.wait_for_timeout(500)
        page.locator("#explorer").screenshot(path=str(out))
        browser.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default="sape2+ape", help="a shipped checkpoint's name or a checkpoint file")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "screenshot_report.png")
    args = p.parse_args()
    from vitpe_core.__main__ import main as cli

    with tempfile.TemporaryDirectory(prefix="vitpe-report-shot-") as folder:
        report = Path(folder) / "report.html"
        if cli(["report", args.checkpoint, "--out", str(report)]) != 0:
            return 1
        shoot(report, args.out)
    print(f"{args.out}: {save_small(args.out)} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
