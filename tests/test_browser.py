"""The app in a real browser: `streamlit run app.py` on loopback driven by Debian's chromium
through playwright (no browser download). What AppTest cannot do: click the image component
and see the patch text and the Plotly heatmap's data change; open share links as a user
does; load every page without an exception box. Checkpoints: conftest's `app_checkpoint_dir`
(tiny random-weight models). Full-page screenshots go to pytest's temporary folder
(`screenshots0/` under its basetemp), never into the repository.

Skips with a reason where chromium or playwright is missing (`.ci/run` installs chromium).
"""
from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks import harness as lt  # the server, browser and page helpers

REPO = Path(__file__).resolve().parents[1]
SHOTS: Path  # set by the `_screenshot_dir` fixture, under pytest's temporary folder
TIMEOUT_MS = 60_000

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if shutil.which("chromium") is None:
    pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does it)",
                allow_module_level=True)
try:
    from playwright.sync_api import expect, sync_playwright
except ImportError as e:
    pytest.skip(f"playwright is not importable ({e}); pip install -r requirements-dev.txt",
                allow_module_level=True)


@pytest.fixture(scope="session")
def app_url(app_checkpoint_dir, tmp_path_factory):
    """`python -m streamlit run app.py` on a free loopback port with VITPE_CHECKPOINTS set;
    healthy within 60 s; its process group is always terminated."""
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with lt.streamlit_server(app_checkpoint_dir, log=log, timeout=60) as server:
        yield server.url


@pytest.fixture(scope="module")
def browser():
    # module scope: closed before tests/test_load.py starts its own (async) playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=lt.CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    yield pg
    ctx.close()


@pytest.fixture(scope="module", autouse=True)
def _screenshot_dir(tmp_path_factory) -> Path:
    global SHOTS
    SHOTS = tmp_path_factory.mktemp("screenshots")
    return SHOTS


def shot(page, name: str) -> None:
    lt.full_page_screenshot(page, SHOTS / f"{name}.png")


def settle(page) -> None:
    """Wait until the script run is over (Streamlit's own marker on the app root)."""
    page.wait_for_function(lt.IDLE_JS, timeout=TIMEOUT_MS)


def no_exception(page) -> None:
    assert page.locator("[data-testid='stException']").count() == 0, page.locator(
        "[data-testid='stException']").first.inner_text()


HEATMAP_Z = "e => JSON.stringify(e.data[0].z)"


def heatmap(page, key: str) -> tuple[str, np.ndarray]:
    """The first trace's z of the chart with widget key `key`, as sent (JSON) and decoded;
    Plotly >= 6 sends numpy arrays as base64 typed arrays."""
    raw = page.locator(f".st-key-{key} .js-plotly-plot").evaluate(HEATMAP_Z)
    z = json.loads(raw)
    if isinstance(z, dict):
        shape = [int(s) for s in str(z.get("shape", "-1")).split(",")]
        return raw, np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"])).reshape(shape)
    return raw, np.array(z, dtype=float)


def argmin2(z: np.ndarray) -> tuple[int, int]:
    return tuple(int(i) for i in np.unravel_index(np.argmin(z), z.shape))


# ----------------------------------------------------------------------------- A: click a patch
def test_click_changes_patch_and_heatmap(page, app_url):
    page.goto(lt.share_url(app_url, ckpt="sape2+ape", image="cifar10-test-0008", patch=(3, 4), layer=1, head="mean"))
    expect(page.get_by_text("Patch (3, 4)", exact=True)).to_be_visible()
    image = page.frame_locator(lt.IMAGE_FRAME).locator("#image")
    expect(image).to_be_visible()
    settle(page)
    raw0, z0 = heatmap(page, "bias_bias_map")
    assert z0.shape == (8, 8)
    assert argmin2(z0) == (3, 4)        # SaPE²'s bias row is 0 at the query patch itself ("0 = near")
    shot(page, "bias_1_before_click")

    image.click(position=lt.click_point(image.bounding_box(), (1, 6), (8, 8)))
    expect(page.get_by_text("Patch (1, 6)", exact=True)).to_be_visible()
    page.wait_for_function(f"([sel, before]) => {{ const e = document.querySelector(sel); "
                           f"return !!(e && e.data) && ({HEATMAP_Z})(e) !== before; }}",
                           arg=[".st-key-bias_bias_map .js-plotly-plot", raw0], timeout=TIMEOUT_MS)
    settle(page)
    _, z1 = heatmap(page, "bias_bias_map")
    assert z1.shape == (8, 8) and not np.allclose(z0, z1)
    assert argmin2(z1) == (1, 6)
    expect(page.get_by_text("Patch (3, 4)", exact=True)).to_have_count(0)
    expect(page.locator(".st-key-bias_row input")).to_have_value("1")
    expect(page.locator(".st-key-bias_col input")).to_have_value("6")
    assert lt.url_params(page.url)["patch"] == "1,6"
    no_exception(page)
    shot(page, "bias_2_after_click")


# ----------------------------------------------------------------------------- B: share links
def test_share_link_restores_the_view(page, app_url):
    url = lt.share_url(app_url, ckpt="sape2+ape", image="cifar10-test-0008", patch=(2, 5), layer=1, head="0")
    page.goto(url)
    expect(page.get_by_text("Patch (2, 5)", exact=True)).to_be_visible()
    settle(page)
    expect(page.locator(".st-key-bias_layer input[type=range]")).to_have_value("1")
    expect(page.locator(".st-key-bias_head input")).to_have_value("head 0")
    expect(page.locator(".st-key-bias_ckpt input")).to_have_value("sape2+ape")
    expect(page.locator(".st-key-bias_row input")).to_have_value("2")
    expect(page.locator(".st-key-bias_col input")).to_have_value("5")
    expect(page.locator("[data-testid='stAlertContentWarning']")).to_have_count(0)
    assert lt.url_params(page.url) == {"page": "bias", "ckpt": "sape2+ape", "image": "cifar10-test-0008",
                                       "patch": "2,5", "layer": "1", "head": "0"}
    expect(page.locator("[data-testid='stCode']").first).to_contain_text("patch=2,5")
    no_exception(page)
    shot(page, "share_1_restored")


def test_bad_link_warns_without_exception(page, app_url):
    page.goto(app_url + "/?page=bias&ckpt=../../etc/passwd&patch=99,99")
    expect(page.get_by_text("Patch (4, 4)", exact=True)).to_be_visible()      # the default: the grid's centre
    expect(page.frame_locator(lt.IMAGE_FRAME).locator("#image")).to_be_visible()
    settle(page)
    warnings = page.locator("[data-testid='stAlertContentWarning']")
    expect(warnings.filter(has_text="Ignored ckpt=")).to_be_visible()
    expect(warnings.filter(has_text="Ignored patch=")).to_be_visible()
    no_exception(page)
    assert lt.url_params(page.url)["ckpt"] == "sape2+ape"                    # the URL is rewritten to a valid view
    shot(page, "share_2_bad_params")


# ----------------------------------------------------------------------------- C: every page
TITLES = {"similarity": "Position-embedding similarity", "compare": "Compare encodings", "checkpoints": "Checkpoints"}


@pytest.mark.parametrize("name", list(TITLES))
def test_page_loads_without_exception(page, app_url, name):
    page.goto(f"{app_url}/?page={name}")
    expect(page.get_by_role("heading", name=TITLES[name], level=1)).to_be_visible()
    settle(page)
    no_exception(page)
    expect(page.locator("[data-testid='stAlertContentError']")).to_have_count(0)
    if name != "checkpoints":
        expect(page.locator(".js-plotly-plot").first).to_be_attached()
    assert lt.url_params(page.url).get("page") == name
    shot(page, f"page_{name}")
