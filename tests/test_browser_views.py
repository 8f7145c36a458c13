"""The newer views in a real browser (`streamlit run app.py`, Debian's chromium through
playwright): the camera button of a chart saves an SVG once SVG is chosen in the sidebar, and
the Figure-7 film plays. Checkpoints: tiny random-weight models with a three-epoch history.
Screenshots go to pytest's temporary folder."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import harness as lt

TIMEOUT_MS = 120_000

pytestmark = [pytest.mark.browser, pytest.mark.slow]

lt.skip_module_without_browser(pytest)
from playwright.sync_api import expect  # noqa: E402


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    folder = lt.write_random_checkpoints(tmp_path_factory.mktemp("ckpts"), ("ape", "rpb"), epochs=3)
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with lt.streamlit_server(folder, log=log, timeout=120) as server:
        yield server.url


@pytest.fixture
def page(tabs):
    return tabs.tab("downloads", accept_downloads=True)


def settle(page) -> None:
    page.wait_for_function(lt.IDLE_JS, timeout=TIMEOUT_MS)


def test_the_camera_button_downloads_an_svg_once_svg_is_chosen(page, app_url, tmp_path: Path):
    page.goto(f"{app_url}/?page=similarity&ckpt=ape")
    settle(page)
    sidebar = page.locator("[data-testid='stSidebar']")
    sidebar.get_by_text("SVG", exact=True).click()
    settle(page)
    expect(sidebar.locator("input[type=radio]:checked")).to_have_value("1")   # the second option, SVG
    # Plotly titles the camera "Download plot as a png" for PNG and "Download plot" for other formats
    button = page.locator(".js-plotly-plot .modebar-btn[data-title='Download plot']").first
    expect(button).to_be_attached()
    page.locator(".js-plotly-plot").filter(has=page.locator(".modebar-btn[data-title='Download plot']")).first.hover()
    with page.expect_download(timeout=TIMEOUT_MS) as info:
        button.click(force=True)
    download = info.value
    assert download.suggested_filename.endswith(".svg"), download.suggested_filename
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    head = path.read_text(errors="replace")[:400]
    assert "<svg" in head, head
    lt.full_page_screenshot(page, tmp_path / "similarity.png")


def test_the_film_plays_through_the_recorded_epochs(page, app_url, tmp_path: Path):
    page.goto(f"{app_url}/?page=similarity&ckpt=ape")
    settle(page)
    page.get_by_role("tab", name="During training").click()
    film = page.locator(".js-plotly-plot").filter(has=page.locator(".slider-container")).first
    expect(film).to_be_visible()
    film.scroll_into_view_if_needed()
    label = film.locator(".slider-group > text.slider-label")                # the slider's current value
    expect(label).to_have_text("epoch 0")
    film.get_by_text("▶ play").click()
    expect(label).to_have_text("epoch 3")                                     # the last recorded epoch
    lt.full_page_screenshot(page, tmp_path / "film.png")
