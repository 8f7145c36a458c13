"""Imported families in a real browser (issue 27): a Swin-V2 and a BEiT, tiny random models built
by transformers and imported with the CLI, on `streamlit run app.py` through Debian's chromium.
A click on the picker moves the Swin's window map to the clicked patch's window (the values
`swin.windows.window_rows` gives, read out of the drawn Plotly chart) and the BEiT's learned bias
row to the clicked patch's; no page shows an exception. A visitor uploads a Swin's weights with
its config.json through the Checkpoints page's import form and uses it on the bias explorer in
the same session. AppTest covers the values per block and head (tests/test_app_families.py);
this checks what a visitor's clicks and uploads do.
Skips with a reason where chromium, playwright or transformers is missing."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks import harness as lt
from benchmarks.click_cost import click_patch, open_bias_tab
from test_app import TITLES

TIMEOUT_MS = 90_000
IMAGE = "cifar10-test-0001"
SWIN_GRID, BEIT_GRID = (10, 10), (4, 4)     # Swin-V2: 40 px in 4-px patches; BEiT: test_importers_families'

pytestmark = [pytest.mark.browser, pytest.mark.slow]
lt.skip_module_without_browser(pytest)
pytest.importorskip("transformers", reason="transformers is a test dependency (requirements-dev.txt)")
from playwright.sync_api import expect  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from test_app_families import SWINS
    from test_importers_families import build, save
    from test_swin import hf_model
    from vitpe_core.__main__ import main
    root = tmp_path_factory.mktemp("families_browser")
    version, overrides = SWINS["swinv2"]
    hf_model(version, **overrides).save_pretrained(root / "src" / "swinv2")
    assert main(["import", str(root / "src" / "swinv2" / "model.safetensors"),
                 "--out", str(root / "ckpts" / "swinv2.safetensors")]) == 0
    src = save(build("beit_layer_bias_mean"), root / "src" / "beit")
    assert main(["import", str(src), "--out", str(root / "ckpts" / "beit.safetensors")]) == 0
    return root / "ckpts"


@pytest.fixture(scope="module")
def swin_src(folder):
    return folder.parent / "src" / "swinv2"


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    with lt.streamlit_server(folder, log=tmp_path_factory.mktemp("families_log") / "server.log", timeout=120) as srv:
        yield srv


# The z of the chart's heatmap trace (a window map drawn over the image has the image first).
HEAT_Z = "e => JSON.stringify((e.data.find(t => t.type === 'heatmap') || {}).z)"


def heat(page, key: str) -> tuple[str, np.ndarray]:
    from test_browser import heatmap
    return heatmap(page, key, HEAT_Z)


def changed(page, key: str, before: str) -> np.ndarray:
    """The chart `key`'s heatmap once it differs from `before` and the run is over."""
    page.wait_for_function(f"([sel, before]) => {{ const e = document.querySelector(sel); "
                           f"return !!(e && e.data) && ({HEAT_Z})(e) !== before; }}",
                           arg=[f".st-key-{key} .js-plotly-plot", before], timeout=TIMEOUT_MS)
    lt.wait_script_run(page, TIMEOUT_MS / 1000)
    return heat(page, key)[1]


def no_exception(page) -> None:
    boxes = page.locator("[data-testid='stException']")
    assert boxes.count() == 0, boxes.first.inner_text()


def test_a_click_moves_the_swin_window_map_to_the_clicked_patchs_window(page, server, folder):
    from test_app_families import swin_rows
    page.goto(lt.share_url(server.url, ckpt="swinv2", image=IMAGE, patch=(2, 3), layer=1))
    expect(page.get_by_text(lt.patch_label((2, 3)), exact=True)).to_be_visible()
    lt.wait_script_run(page, TIMEOUT_MS / 1000)
    expect(page.get_by_text("attends only inside its window", exact=False).first).to_be_visible()
    raw0, z0 = heat(page, "bias_swin_bias")
    _, rows = swin_rows(folder / "swinv2.safetensors", (2, 3), 1)
    np.testing.assert_allclose(z0, rows.shown("bias"), rtol=1e-4, atol=1e-5)

    click_patch(page, "bias_click", (9, 9), SWIN_GRID)          # the shifted grid's corner window
    expect(page.get_by_text(lt.patch_label((9, 9)), exact=True)).to_be_visible()
    z1 = changed(page, "bias_swin_bias", raw0)
    _, rows = swin_rows(folder / "swinv2.safetensors", (9, 9), 1)
    np.testing.assert_allclose(z1, rows.shown("bias"), rtol=1e-4, atol=1e-5)
    assert (np.isfinite(z1) == rows.members).all()
    assert lt.url_params(page.url)["patch"] == "9,9"
    no_exception(page)


def test_a_click_moves_the_beit_learned_bias_row_and_every_page_opens(page, server):
    page.goto(lt.share_url(server.url, ckpt="beit", image=IMAGE, patch=(1, 2), layer=1, head="mean"))
    expect(page.get_by_text(lt.patch_label((1, 2)), exact=True)).to_be_visible()
    open_bias_tab(page, "Heatmap")
    lt.wait_script_run(page, TIMEOUT_MS / 1000)
    raw0, z0 = heat(page, "bias_bias_map")
    assert z0.shape == BEIT_GRID and np.isfinite(z0).all()
    click_patch(page, "bias_click", (3, 0), BEIT_GRID)
    expect(page.get_by_text(lt.patch_label((3, 0)), exact=True)).to_be_visible()
    z1 = changed(page, "bias_bias_map", raw0)
    assert z1.shape == BEIT_GRID and not np.allclose(z0, z1)
    no_exception(page)
    for name in ("compare", "similarity", "checkpoints"):
        for ckpt in ("beit", "swinv2"):
            page.goto(lt.share_url(server.url, page=name, ckpt=ckpt, image=IMAGE))
            expect(page.get_by_role("heading", name=TITLES[name])).to_be_visible()
            lt.wait_script_run(page, TIMEOUT_MS / 1000)
            no_exception(page)


def test_a_swin_uploaded_with_its_config_through_the_form_draws_its_windows(page, server, swin_src):
    from test_browser import open_import_form, sidebar_link
    uploader = open_import_form(page, server.url)
    config = page.locator(".st-key-checkpoints_model_config")
    for box, file in ((uploader, "model.safetensors"), (config, "config.json")):   # one after the other
        # as a visitor picks the second file: after the first one's rerun is over (one idle moment
        # is not the end of it on a busy machine: a second pick landed in that rerun once in CI,
        # and its file chip never came)
        lt.wait_quiet(page, 1000, TIMEOUT_MS / 1000)
        box.locator("input[type=file]").set_input_files(str(swin_src / file))
        expect(box.locator("[data-testid='stFileChip']")).to_have_count(1)
        expect(box.locator("[data-testid='stFileChipIconError']")).to_have_count(0)
        lt.wait_script_run(page, TIMEOUT_MS / 1000)
    expect(uploader.locator("[data-testid='stFileChip']")).to_have_count(1)
    button = page.locator(".st-key-checkpoints_model_import button")
    expect(button).to_be_visible()
    lt.wait_script_run(page, TIMEOUT_MS / 1000)
    button.click()
    success = page.locator("[data-testid='stAlertContentSuccess']")
    expect(success).to_contain_text("Imported as")
    lt.wait_script_run(page, TIMEOUT_MS / 1000)
    name = success.locator("code").first.inner_text()
    assert name.startswith("swinv2-model-upload")         # issue 44 (5): named by its config, not `model-upload`
    no_exception(page)
    expect(page.locator("[data-testid='stAlertContentError']")).to_have_count(0)

    sidebar_link(page, "Bias explorer")                   # same session: the import is in its lists
    expect(page.get_by_role("heading", name="Bias explorer", level=1)).to_be_visible()
    page.locator(".st-key-bias_ckpt input").click()
    page.get_by_role("option", name=name).click()
    expect(page.get_by_text("attends only inside its window", exact=False).first).to_be_visible()
    lt.wait_script_run(page, TIMEOUT_MS / 1000)
    _, z = heat(page, "bias_swin_bias")
    assert z.shape == SWIN_GRID and np.isfinite(z).sum() >= 1
    no_exception(page)
