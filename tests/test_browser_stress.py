"""The bias explorer's stress test in a real browser: `streamlit run app.py` on the shipped
checkpoints (the repository's `checkpoints/`, its `.streamlit/config.toml`), the bias page on
the trained `sape2`, the shift control moved with the keyboard as a user would; the followed
patch, the maps and the live bias shift error update with no exception. A screenshot of the
rollout and stress-test sections goes to pytest's temporary folder, and to the path in
`$VITPE_STRESS_SCREENSHOT` when it is set (how docs/screenshot_stress.png is made:
`VITPE_STRESS_SCREENSHOT=docs/screenshot_stress.png python -m pytest tests/test_browser_stress.py`).

Skips with a reason where chromium or playwright is missing, or the shipped checkpoint is.
"""
from __future__ import annotations

import contextlib

import os
import shutil
from pathlib import Path

import pytest

from benchmarks import harness as lt

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_MS = 180_000            # the first run loads the checkpoint and traces, on a loaded 2-core machine
KEY = "bias_shift_x_32x32p4"    # the shift-right control of a 32-px, patch-4 model
ERROR = "Bias shift error (all layers and heads)"

pytestmark = [pytest.mark.browser, pytest.mark.slow]

lt.skip_module_without_browser(pytest)
from playwright.sync_api import Error as PlaywrightError, expect  # noqa: E402


@pytest.fixture(scope="module")
def shipped_url(tmp_path_factory):
    if not (REPO / "checkpoints" / "sape2.safetensors").exists():
        pytest.skip("checkpoints/sape2.safetensors is not in this checkout")
    log = tmp_path_factory.mktemp("streamlit_stress") / "server.log"
    with lt.streamlit_server(REPO / "checkpoints", log=log, timeout=120) as server:
        yield server.url


def settle(page) -> None:
    page.wait_for_function(lt.IDLE_JS, timeout=TIMEOUT_MS)


def metric(page, label: str) -> str:
    box = page.locator("[data-testid='stMetric']", has_text=label)
    return box.locator("[data-testid='stMetricValue']").inner_text().strip()


def plot_data(page, key: str) -> str:
    return page.locator(f".st-key-{key} .js-plotly-plot").evaluate("e => JSON.stringify(e.data[1].z)")


def step_slider(page, thumb, key: str, steps: int, tries: int = 40) -> None:
    """Move the slider `thumb` `steps` key steps (`key`: ArrowRight / ArrowLeft) from where it is,
    to that value exactly: one press at a time towards the target, each awaited in the slider's
    own value, the opposite key when it overshot. A press sent while a rerun re-renders the slider
    can miss its focus (the old slider may stand beside the new one for a moment), and a press that
    seemed lost may land late: seen on loaded machines as +4 px where +6 was asked, and +7."""
    expect(thumb).to_have_count(1)
    target = float(thumb.input_value()) + (steps if key == "ArrowRight" else -steps)
    for _ in range(tries):
        expect(thumb).to_have_count(1)         # a rerun may show the old slider beside the new one for a moment
        with contextlib.suppress(PlaywrightError):    # not moved in 10 s, or a second slider appeared meanwhile
            before = thumb.input_value()
            if float(before) == target:
                lt.wait_quiet(page, timeout_s=TIMEOUT_MS / 1000)    # the debounced value sent, its rerun over
                if float(thumb.input_value()) == target:      # and still there once the reruns are over
                    return
                continue
            thumb.focus()
            page.keyboard.press("ArrowRight" if float(before) < target else "ArrowLeft")
            page.wait_for_function("([el, v]) => el.value !== v", arg=[thumb.element_handle(), before],
                                   timeout=10_000)
    raise AssertionError(f"the slider did not reach {target:g} in {tries} presses (at {thumb.input_value()})")


def test_shift_control_moves_the_maps_and_the_number(browser, shipped_url, tmp_path):
    page = browser.new_context(viewport={"width": 1700, "height": 1000}).new_page()   # a main area ~1400 px wide
    page.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    page.goto(lt.share_url(shipped_url, ckpt="sape2", image="cifar10-test-0008", patch=(3, 4), layer=0,
                           head="mean"))
    expect(page.locator(".st-key-bias_stress_open summary")).to_contain_text("Stress test: shift and resize")
    settle(page)
    expect(page.locator(f".st-key-{KEY}")).to_have_count(0)                  # closed on a first visit: not computed
    expect(page.locator(".st-key-bias_rollout .js-plotly-plot")).to_have_count(0)
    lt.open_section(page, "bias_rollout_open")
    expect(page.locator(".st-key-bias_rollout .js-plotly-plot")).to_be_attached()
    lt.open_section(page, "bias_stress_open")
    expect(page.locator("[data-testid='stMetric']")).to_have_count(0)          # the default view: no stress run
    assert lt.url_params(page.url)["open"] == "rollout,stress"                 # the view says which are open

    thumb = page.locator(f".st-key-{KEY} input[type=range]")
    step_slider(page, thumb, "ArrowRight", 4)                                  # 0 -> +4 px: one patch right
    expect(page.get_by_text("patch (3, 4) → (3, 5)", exact=False)).to_be_visible()
    expect(page.locator("[data-testid='stMetric']", has_text=ERROR)).to_be_visible()
    settle(page)
    first = metric(page, ERROR)
    assert 0 < float(first) < 1
    bias_before = plot_data(page, "bias_stress_bias")

    shot = tmp_path / "screenshot_stress.png"                                  # the picture: one patch right
    section_screenshot(page, shot)
    target = os.environ.get("VITPE_STRESS_SCREENSHOT")
    if target:
        shutil.copy(shot, REPO / target)

    link = lt.share_link(page)   # the sidebar's share link
    assert lt.url_params(link)["shift"] == "0,4" and lt.url_params(page.url)["shift"] == "0,4"
    assert lt.url_params(link)["open"] == "rollout,stress"
    other = browser.new_context(viewport={"width": 1700, "height": 1000}).new_page()   # another visitor
    other.set_default_timeout(TIMEOUT_MS)
    other.goto(link)
    expect(other.get_by_text("patch (3, 4) → (3, 5)", exact=False)).to_be_visible()   # the same stress view
    expect(other.locator(".st-key-bias_rollout .js-plotly-plot")).to_be_attached()     # and the rollout, open
    expect(other.locator(f".st-key-{KEY} input[type=range]")).to_have_attribute("aria-valuetext", "+4 px (1 patch)")
    settle(other)
    assert metric(other, ERROR) == first
    expect(other.locator("[data-testid='stAlertContentWarning']")).to_have_count(0)        # no "Ignored ..." note
    other.context.close()

    step_slider(page, thumb, "ArrowRight", 2)                                  # +4 -> +6 px: 1½ patches
    expect(page.locator(f".st-key-{KEY} input[type=range]")).to_have_attribute("aria-valuetext", "+6 px (1½ patches)")
    # the run for +6 writes shift=0,6 to the address bar; the run for +5 on its way there changes the
    # number too, so the number alone does not say the last run is over (seen in CI: URL 0,5)
    page.wait_for_function("() => new URL(location.href).searchParams.get('shift') === '0,6'", timeout=TIMEOUT_MS)
    lt.wait_quiet(page, timeout_s=TIMEOUT_MS / 1000)
    assert lt.url_params(page.url)["shift"] == "0,6"
    assert metric(page, ERROR) != first
    assert plot_data(page, "bias_stress_bias") != bias_before
    expect(page.locator("[data-testid='stException']")).to_have_count(0)
    expect(page.locator("[data-testid='stAlertContentError']")).to_have_count(0)


def section_screenshot(page, path: Path) -> None:
    """From the "Attention rollout" section to the end of the page, the main area only."""
    vp = page.viewport_size
    height = int(page.evaluate(lt.CONTENT_HEIGHT_JS))
    page.set_viewport_size({"width": vp["width"], "height": height})
    page.wait_for_timeout(800)                                                 # charts re-layout
    top = page.locator(".st-key-bias_rollout_open").bounding_box()["y"] - 16
    left = page.locator("[data-testid='stMain']").bounding_box()["x"]        # leave the sidebar out
    page.screenshot(path=str(path), clip={"x": left, "y": top, "width": vp["width"] - left, "height": height - top},
                    full_page=True)
    page.set_viewport_size(vp)
