"""The HTML report in a real browser, as a colleague opens a file they were sent: written by the
CLI (`python -m vitpe_core report`), opened from disk (file://, no server running) in headless
Debian chromium with every http(s) request aborted. Every section is drawn; a click on a patch
of the offline bias explorer's map changes the map to that patch's row, read from Plotly's
`gd.data` and compared with `views.bias_view` / `views.attention_view` for the same patch.

Skips with a reason where chromium or playwright is missing (`.ci/run` installs chromium)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import harness as lt
from vitpe_core import analysis, views
from vitpe_core.checkpoint import load_checkpoint
from vitpe_core.html_report.build import default_images
from vitpe_core.inputs import checkpoint_input

pytestmark = [pytest.mark.browser, pytest.mark.slow]

lt.skip_module_without_browser(pytest)

REPO = Path(__file__).resolve().parents[1]
NAME = "sape2+ape"
TIMEOUT_MS = 60_000
MAP = '[data-fig="explorer.figures.{key}"]'
Z_JS = "(el) => JSON.stringify(el.data.find((t) => t.type === 'heatmap').z)"


@pytest.fixture(scope="module")
def report_file(tmp_path_factory) -> Path:
    from vitpe_core.__main__ import main
    if not (REPO / "checkpoints" / f"{NAME}.safetensors").is_file():
        pytest.skip("the shipped checkpoints are not in this checkout")
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", NAME, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def model():
    return load_checkpoint(REPO / "checkpoints" / f"{NAME}.safetensors")


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1300, "height": 1000})
    requests: list[str] = []
    ctx.route("http://**/*", lambda route: (requests.append(route.request.url), route.abort()))
    ctx.route("https://**/*", lambda route: (requests.append(route.request.url), route.abort()))
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.requests, pg.errors = requests, errors
    yield pg
    ctx.close()


def heatmap_z(page, key: str) -> np.ndarray:
    return np.array(json.loads(page.locator(MAP.format(key=key)).evaluate(Z_JS)), dtype=float)


def click_patch(page, key: str, patch: tuple[int, int], grid: tuple[int, int]) -> None:
    """A mouse click at the centre of `patch` on the map's plot area (Plotly's drag layer spans
    the image exactly)."""
    area = page.locator(MAP.format(key=key) + " .nsewdrag").first
    area.scroll_into_view_if_needed()
    box = area.bounding_box()
    x = box["x"] + (patch[1] + 0.5) / grid[1] * box["width"]
    y = box["y"] + (patch[0] + 0.5) / grid[0] * box["height"]
    page.mouse.move(x, y)
    page.mouse.click(x, y)


def expected(ckpt, patch, layer, head, part="sum"):
    image = default_images()[0]
    tr = analysis.trace_image(ckpt.model, checkpoint_input(image.image, ckpt))
    maps = analysis.patch_maps(tr, patch)
    return (views.bias_view(tr, maps, ckpt.config.encoding, layer, head, part).shown,
            views.attention_view(maps, layer, head))


def test_the_report_opens_offline_and_a_click_changes_the_map(page, report_file, model):
    page.goto(report_file.as_uri())
    page.wait_for_function("document.body.dataset.ready === '1'", timeout=TIMEOUT_MS)
    assert not page.errors, page.errors
    for section in ("card", "similarity", "position", "explorer", "footer"):
        assert page.locator(f"#{section}").is_visible(), section
    charts = page.locator("[data-fig]")
    assert charts.count() >= 7
    for i in range(charts.count()):                  # every chart drawn by Plotly
        assert charts.nth(i).locator(".main-svg").count() > 0, charts.nth(i).get_attribute("data-fig")
    assert "74.40 %" in page.locator("#card").inner_text()
    assert "2D-structure score" in page.locator("#similarity").inner_text()

    grid = model.config.grid
    start = (grid[0] // 2, grid[1] // 2)
    assert page.locator("#patch-text").inner_text() == f"Patch ({start[0]}, {start[1]})"
    bias0, attn0 = expected(model, start, 0, None)
    z0 = heatmap_z(page, "bias")
    np.testing.assert_allclose(z0, bias0, atol=5e-3)

    target = (1, 6)
    click_patch(page, "bias", target, grid)
    page.wait_for_function("document.body.dataset.patch === '1,6'", timeout=TIMEOUT_MS)
    z1, a1 = heatmap_z(page, "bias"), heatmap_z(page, "attn")
    bias1, attn1 = expected(model, target, 0, None)
    assert not np.allclose(z1, z0, atol=5e-3)
    np.testing.assert_allclose(z1, bias1, atol=5e-3)
    np.testing.assert_allclose(a1, attn1, atol=2e-3)
    assert page.locator("#patch-text").inner_text() == "Patch (1, 6)"

    page.select_option("#sel-layer", "3")            # one head of another layer, the x part
    page.select_option("#sel-head", "2")
    page.select_option("#sel-part", "x")
    page.wait_for_function("(t) => document.querySelector('[data-fig=\"explorer.figures.bias\"]').layout.title.text"
                           " === t", arg="layer 3, head 2", timeout=TIMEOUT_MS)
    bias2, attn2 = expected(model, target, 3, 2, "x")
    np.testing.assert_allclose(heatmap_z(page, "bias"), bias2, atol=5e-3)
    np.testing.assert_allclose(heatmap_z(page, "attn"), attn2, atol=2e-3)

    click_patch(page, "attn", (6, 2), grid)          # the attention map picks patches too
    page.wait_for_function("document.body.dataset.patch === '6,2'", timeout=TIMEOUT_MS)
    np.testing.assert_allclose(heatmap_z(page, "bias"), expected(model, (6, 2), 3, 2, "x")[0], atol=5e-3)
    assert not page.errors and page.requests == [], (page.errors, page.requests)
    lt.full_page_screenshot(page, report_file.with_suffix(".png"))
