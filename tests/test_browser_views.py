"""The newer views in a real browser (`streamlit run app.py`, Debian's chromium through
playwright): the camera button of a chart saves an SVG once SVG is chosen in the sidebar, the
Figure-7 film plays, and the compare page draws models of two grids side by side with square
maps and titles that fit. Checkpoints: tiny random-weight models with a three-epoch history
(8 x 8) and a model on a 14 x 14 grid with an import's long name. Screenshots go to pytest's
temporary folder."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import harness as lt

TIMEOUT_MS = 120_000

pytestmark = [pytest.mark.browser, pytest.mark.slow]

lt.skip_module_without_browser(pytest)
from playwright.sync_api import expect  # noqa: E402


IMPORTED = "vit_tiny_patch16_224_tinyimagenet_ft-upload"    # an import's name (issue 44 item 7), 14 x 14 patches


def write_other_grid(folder: Path, name: str = IMPORTED, img_size: tuple[int, int] = (56, 56)) -> None:
    """A tiny random `rpb` model on another grid than the 8 x 8 ones (`img_size` / 4 patches)."""
    import torch

    from vitpe_core import ViTConfig, build_model
    from vitpe_core.checkpoint import save_checkpoint

    torch.manual_seed(7)
    model = build_model(ViTConfig(**{**lt.TINY, "img_size": img_size}, encoding="rpb")).eval()
    save_checkpoint(folder / f"{name}.safetensors", model, metrics={"recipe": {"encoding": "rpb"}})


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    folder = lt.write_random_checkpoints(tmp_path_factory.mktemp("ckpts"), ("ape", "rpb"), epochs=3)
    write_other_grid(folder)
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


# Every Plotly chart of the page as drawn: its box, its column's, each subplot's plot area (the
# drag layer) and heatmap image, and its titles' boxes (the chart's title and subplot titles).
CHARTS_JS = """() => {
  const box = e => { const r = e.getBoundingClientRect(); return {x: r.left, y: r.top, w: r.width, h: r.height}; };
  return [...document.querySelectorAll('[data-testid=stPlotlyChart]')].map(ch => {
    const plot = ch.querySelector('.js-plotly-plot .main-svg');
    const key = [...(ch.closest('[class*=st-key-]')?.classList || [])].find(c => c.startsWith('st-key-')) || '';
    if (!plot) return {key, plot: null};
    const root = ch.querySelector('.js-plotly-plot');
    const panels = [...root.querySelectorAll('.cartesianlayer .subplot')].map(sp => {
      const id = [...sp.classList].find(c => c !== 'subplot');
      const img = sp.querySelector('.heatmaplayer image');
      return {id, area: box(root.querySelector(`.nsewdrag[data-subplot="${id}"]`)), map: img && box(img)};
    });
    const titles = [...root.querySelectorAll('.infolayer .annotation-text, .infolayer .gtitle')]
      .map(t => ({text: t.textContent, box: box(t)}));
    const column = ch.closest('[data-testid=stColumn]') || ch.closest('[data-testid=stMain]');
    return {key, plot: box(plot), column: box(column), panels, titles};
  });
}"""


# Every chart of the compare page drawn (the picker, three pairs, the kernels, the per-query maps,
# the distances, two curves), the per-query chart's three heatmaps among them.
CHARTS_DRAWN_JS = """() => {
  const charts = [...document.querySelectorAll('[data-testid=stPlotlyChart]')];
  return charts.length >= 9 && charts.every(c => c.querySelector('.js-plotly-plot .main-svg'))
    && document.querySelectorAll('.st-key-compare_query_kernels .heatmaplayer image').length === 3;
}"""


def _overlap(a: dict, b: dict) -> float:
    """The area two boxes share, in px²."""
    w = min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"])
    h = min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"])
    return max(w, 0) * max(h, 0)


def _inside(inner: dict, outer: dict, tol: float = 1.0) -> bool:
    return (inner["x"] >= outer["x"] - tol and inner["y"] >= outer["y"] - tol
            and inner["x"] + inner["w"] <= outer["x"] + outer["w"] + tol
            and inner["y"] + inner["h"] <= outer["y"] + outer["h"] + tol)


def test_the_compare_page_keeps_every_map_square_beside_a_model_on_another_grid(page, app_url, tmp_path: Path):
    """Issue 44 item 7: with a 14 x 14 import beside 8 x 8 checkpoints, the kernel small multiples
    anchored every panel's y axis to the first panel's x axis, so the 8 x 8 models' kernels and
    per-query maps were drawn 170 x 92 px (the import's first: squeezed or stretched the other way),
    and the import's subplot title ran 300 px wide over its neighbour's and past the chart's edge
    ("…ft-uploa"). Every heatmap drawn on the page (all grids here are square) is now square, its
    plot area no larger, and no title overlaps another or leaves its chart; the full name is in
    the hover and in a caption."""
    page.goto(lt.share_url(app_url, page="compare"))
    lt.wait_quiet(page, still_ms=1500)
    page.wait_for_function(CHARTS_DRAWN_JS, timeout=TIMEOUT_MS)
    charts = page.evaluate(CHARTS_JS)
    lt.full_page_screenshot(page, tmp_path / "compare.png")
    by_key = {c["key"]: c for c in charts}
    kernels = by_key["st-key-compare_kernels"]
    assert len(kernels["panels"]) == 3 and len(by_key["st-key-compare_query_kernels"]["panels"]) == 3
    assert f"st-key-compare_fig_{IMPORTED}" in by_key, sorted(by_key)
    maps = 0
    for chart in charts:
        assert chart["plot"] is not None, chart["key"]
        for panel in chart["panels"]:
            if panel["map"] is None:
                continue
            maps += 1
            m, area = panel["map"], panel["area"]
            assert abs(m["w"] - m["h"]) <= 2 and m["w"] >= 60, (chart["key"], panel)    # square cells, not tiny
            assert abs(area["w"] - m["w"]) <= 2 and abs(area["h"] - m["h"]) <= 2, (chart["key"], panel)
        for t in chart["titles"]:
            assert _inside(t["box"], chart["plot"]), (chart["key"], t, chart["plot"])    # not cut at the edge
        for a, b in ((a, b) for i, a in enumerate(chart["titles"]) for b in chart["titles"][i + 1:]):
            assert _overlap(a["box"], b["box"]) == 0, (chart["key"], a, b)
        assert chart["plot"]["x"] + chart["plot"]["w"] <= chart["column"]["x"] + chart["column"]["w"] + 1, chart
    assert maps >= 2 * 3 + 3 + 3                                    # three pairs, the kernels, the per-query maps
    short = [t["text"] for t in kernels["titles"] if t["text"] != IMPORTED and "…" in t["text"]]
    assert short, kernels["titles"]                                  # the import's name shortened in its title
    expect(page.get_by_text(f"= {IMPORTED}", exact=False).first).to_be_attached()   # and given in full below
    chart = page.locator(".st-key-compare_kernels .js-plotly-plot")
    chart.scroll_into_view_if_needed()
    area = page.locator(".st-key-compare_kernels .nsewdrag[data-subplot='x3y3']")   # the import's panel
    for step in range(1, 6):                       # each move a new hover event: one lost under load is retried
        box = area.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.1 * step, box["y"] + box["height"] * 0.1 * step)
        try:
            expect(chart.locator(".hoverlayer")).to_contain_text(IMPORTED, timeout=10_000)   # the full name
            break
        except AssertionError:
            if step == 5:
                raise


def test_the_resolution_explorer_sweeps_a_model_and_draws_what_each_size_keeps(page, app_url):
    """Compare page → "At other input sizes": pick a model, press the button, a progress bar, then the
    chart (one trace per figure, the native size marked) and the distance by depth, drawn."""
    page.goto(f"{app_url}/?page=compare")
    settle(page)
    section = page.get_by_text("At other input sizes", exact=False).first
    section.scroll_into_view_if_needed()
    page.get_by_role("button", name="Sweep these sizes").click()
    chart = page.locator(".st-key-compare_res_chart .js-plotly-plot")
    expect(chart).to_be_attached(timeout=TIMEOUT_MS)
    page.wait_for_function("() => { const p = document.querySelector('.st-key-compare_res_chart .js-plotly-plot');"
                           " return p && p._fullData && p._fullData.length >= 4; }", timeout=TIMEOUT_MS)
    expect(chart.locator(".gtitle")).to_contain_text("at other input sizes")
    expect(chart.locator(".annotation-text")).to_contain_text("native 32×32")
    distance = page.locator(".st-key-compare_res_distance .js-plotly-plot")
    expect(distance.locator(".legendtext")).to_have_count(8)       # the 8 default sizes of a 32-px model
    settle(page)
    expect(page.get_by_text(re.compile(r"^(Its top-1|On every size swept)"))).to_be_visible()   # the verdict
