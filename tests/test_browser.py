"""The app in a real browser: `streamlit run app.py` on loopback driven by Debian's chromium
through playwright (no browser download). What AppTest cannot do: click the image component
and see the patch text and the Plotly heatmap's data change; open share links as a user
does; load every page without an exception box; upload a real pretrained ViT (../shared,
22.9 MB: more than the old 20 MB server limit) through the Checkpoints page and use it on the
other pages of the same session; see what a file over the uploader's limit shows.
Checkpoints: conftest's `app_checkpoint_dir` (tiny random-weight models). The server is
`python -m streamlit run app.py` from the repository root, so `.streamlit/config.toml` (its
200 MB `server.maxUploadSize`) applies as it does for users. Full-page screenshots go to pytest's temporary folder
(`screenshots0/` under its basetemp), never into the repository.

Skips with a reason where chromium or playwright is missing (`.ci/run` installs chromium).
"""
from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks import harness as lt  # the server, browser and page helpers
from benchmarks.click_cost import click_patch, open_bias_tab, picker_selector

REPO = Path(__file__).resolve().parents[1]
SHOTS: Path  # set by the `_screenshot_dir` fixture, under pytest's temporary folder
TIMEOUT_MS = 60_000

pytestmark = [pytest.mark.browser, pytest.mark.slow]

lt.skip_module_without_browser(pytest)
from playwright.sync_api import expect  # noqa: E402


# `app_url`: conftest's session-wide server on `app_checkpoint_dir`.


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


def heatmap(page, key: str, js: str = HEATMAP_Z) -> tuple[str, np.ndarray]:
    """The first trace's z (or what `js` reads from the plot element) of the chart with widget key
    `key`, as sent (JSON) and decoded; Plotly >= 6 sends numpy arrays as base64 typed arrays."""
    raw = page.locator(f".st-key-{key} .js-plotly-plot").evaluate(js)
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
    expect(page.locator(picker_selector("bias_click"))).to_be_visible()
    open_bias_tab(page, "Heatmap")                                      # only the open tab's chart is drawn
    settle(page)
    raw0, z0 = heatmap(page, "bias_bias_map")
    assert z0.shape == (8, 8)
    assert argmin2(z0) == (3, 4)        # SaPE²'s bias row is 0 at the query patch itself ("0 = near")
    # no stray value drawn by Streamlit's "magic" (a conditional expression once printed "None")
    assert page.locator("[data-testid='stMarkdownContainer']").filter(has_text=re.compile(r"^None$")).count() == 0
    shot(page, "bias_1_before_click")

    click_patch(page, "bias_click", (1, 6), (8, 8), where=(0.15, 0.85))   # near a corner: anywhere in the patch
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
    assert "patch=2,5" in lt.share_link(page, contains="patch=2,5")
    no_exception(page)
    shot(page, "share_1_restored")


def test_bad_link_warns_without_exception(page, app_url):
    page.goto(app_url + "/?page=bias&ckpt=../../etc/passwd&patch=99,99")
    expect(page.get_by_text("Patch (4, 4)", exact=True)).to_be_visible()      # the default: the grid's centre
    expect(page.locator(picker_selector("bias_click"))).to_be_visible()
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


# ----------------------------------------------------------------------------- D: bring your own ViT
VIT_TINY = "vit_tiny_patch16_224_tinyimagenet_ft.npz"   # timm ViT-Ti/16, 22.9 MB, 14x14 grid at 224 px
OLD_SERVER_LIMIT_MB = 20                                 # server.maxUploadSize before it became 200
IMPORT_TIMEOUT_MS = 240_000    # read + import 22.9 MB, then a 224 px ViT's first trace, on a loaded 2-core machine


def open_import_form(page, app_url: str):
    """The Checkpoints page with its "Import your own ViT" expander open; the model uploader."""
    page.goto(f"{app_url}/?page=checkpoints")
    expect(page.get_by_role("heading", name="Checkpoints", level=1)).to_be_visible()
    settle(page)
    page.locator("[data-testid='stExpander'] summary", has_text="Import your own ViT").click()
    uploader = page.locator(".st-key-checkpoints_model_upload")
    expect(uploader).to_be_visible()
    return uploader


def sidebar_link(page, title: str) -> None:
    """Switch page through the app's own sidebar menu (the browser session, and with it the
    imported model, is kept; a new URL would open a new session)."""
    page.locator("[data-testid='stSidebarNav'] a", has_text=title).click()


@pytest.mark.shared
def test_import_real_vit_tiny_then_similarity_and_bias_pages(page, app_url, shared_dir):
    """The 22.9 MB ViT-Ti/16 (over the old 20 MB server limit) through the Checkpoints page's
    uploader in chromium, imported; in the same session the similarity page scores its table
    0.573 and the bias explorer runs it on its 14x14 grid."""
    src = shared_dir / "data" / VIT_TINY
    assert src.stat().st_size > OLD_SERVER_LIMIT_MB * 2**20
    uploader = open_import_form(page, app_url)
    uploader.locator("input[type=file]").set_input_files(str(src))
    chip = uploader.locator("[data-testid='stFileChip']")
    expect(chip).to_have_attribute("aria-label", re.compile(re.escape(VIT_TINY)))   # the shown name is shortened
    button = page.locator(".st-key-checkpoints_model_import button")   # drawn once the upload reached the script
    expect(button).to_be_visible(timeout=IMPORT_TIMEOUT_MS)
    expect(uploader.locator("[data-testid='stFileChipIconError']")).to_have_count(0)   # no HTTP 413
    settle(page)
    button.click()
    success = page.locator("[data-testid='stAlertContentSuccess']")
    expect(success).to_contain_text("Imported as", timeout=IMPORT_TIMEOUT_MS)
    page.wait_for_function(lt.IDLE_JS, timeout=IMPORT_TIMEOUT_MS)
    name = success.locator("code").first.inner_text()
    assert name.startswith("vit_tiny_patch16_224_tinyimagenet_ft")
    expect(success).to_contain_text("it is now in every page's checkpoint list")
    expect(page.get_by_role("heading", name=name, level=2)).to_be_visible()          # its details below the table
    no_exception(page)
    expect(page.locator("[data-testid='stAlertContentError']")).to_have_count(0)
    shot(page, "import_1_checkpoints")

    sidebar_link(page, "Embedding similarity")
    expect(page.get_by_role("heading", name="Position-embedding similarity", level=1)).to_be_visible()
    page.wait_for_function(lt.IDLE_JS, timeout=IMPORT_TIMEOUT_MS)
    expect(page.locator(".st-key-similarity_ckpt input")).to_have_value(name)
    metric = page.locator("[data-testid='stMetric']").filter(has_text="2D structure (Spearman)")
    expect(metric.locator("[data-testid='stMetricValue']")).to_have_text("0.573")
    _, z = heatmap(page, "similarity_patch_map")
    assert z.shape == (14, 14)
    no_exception(page)
    shot(page, "import_2_similarity")

    sidebar_link(page, "Bias explorer")
    expect(page.get_by_role("heading", name="Bias explorer", level=1)).to_be_visible()
    expect(page.locator(".st-key-bias_ckpt input")).to_have_value(name, timeout=IMPORT_TIMEOUT_MS)
    expect(page.get_by_text("of 14×14")).to_be_visible(timeout=IMPORT_TIMEOUT_MS)         # the patch text
    page.wait_for_function(lt.IDLE_JS, timeout=IMPORT_TIMEOUT_MS)
    expect(page.get_by_text("adds no attention bias")).to_be_visible()          # ape: no bias, attention only
    _, z = heatmap(page, "bias_attn_overlay", "e => JSON.stringify(e.data[1].z)")   # the default tab: on the image
    assert z.shape == (14, 14)
    no_exception(page)
    assert lt.url_params(page.url).get("ckpt") == name
    shot(page, "import_3_bias")


class ScriptRuns:
    """The script runs the server finishes for a page, read from the Streamlit messages it sends
    over the page's websocket (`ForwardMsg`, decoded with Streamlit's own protobuf classes): for each
    finished run, the text of every alert (`st.error`, `st.success`, ...) it drew. Made before the
    page opens the app (`page.goto`), it sees every connection of the page.

    Why not the app root's `data-test-script-state`: a run is seen there only if the browser draws
    a frame while it is under way. A busy browser (the suite's load, a page still laying out the
    last run) takes the run's first and last messages in one go, React draws them in one render,
    and the attribute goes from "notRunning" to "notRunning": a wait for "running" after a click
    then waits in vain (issue 44, 12: 60 s after the second press of a failed import, though the
    import had run and its error was drawn again)."""

    FINISHED = (0, 3)     # ForwardMsg.ScriptFinishedStatus: FINISHED_SUCCESSFULLY, FINISHED_FRAGMENT_RUN_SUCCESSFULLY

    def __init__(self, page):
        self.page, self.finished, self._alerts = page, [], []     # finished: one list of alert texts a run
        page.on("websocket", self._socket)

    def _socket(self, ws) -> None:
        ws.on("framereceived", self._frame)

    def close(self) -> None:
        """Stop listening (the module's tests share the tab: `page`)."""
        self.page.remove_listener("websocket", self._socket)

    def _frame(self, payload) -> None:
        from google.protobuf.message import DecodeError
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
        if not isinstance(payload, (bytes, bytearray)):
            return
        try:
            msg = ForwardMsg.FromString(bytes(payload))
        except DecodeError:                                           # not a message of Streamlit's
            return
        kind = msg.WhichOneof("type")
        if kind == "new_session":                                     # a run starts
            self._alerts = []
        elif kind == "delta" and msg.delta.WhichOneof("type") == "new_element" and \
                msg.delta.new_element.WhichOneof("type") == "alert":
            self._alerts.append(msg.delta.new_element.alert.body)
        elif kind == "script_finished" and msg.script_finished in self.FINISHED:
            self.finished.append(self._alerts)

    def after(self, action, timeout_s: float = TIMEOUT_MS / 1000) -> list[str]:
        """Do `action()` (a click, a choice, a file picked) once the page is quiet (no run under
        way or about to start: a press during a rerun would be one more thing to wait for); wait
        until a run started after it has finished and the page has drawn it and is quiet again;
        the alert texts of that run."""
        lt.wait_quiet(self.page, timeout_s=timeout_s)
        seen = len(self.finished)
        action()
        deadline = time.monotonic() + timeout_s
        while len(self.finished) == seen:
            assert time.monotonic() < deadline, f"no script run finished within {timeout_s:g} s of the action"
            self.page.wait_for_timeout(50)                            # playwright delivers the frames meanwhile
        lt.wait_quiet(self.page, timeout_s=timeout_s)
        return self.finished[seen]


@pytest.fixture
def runs(page):
    """`ScriptRuns` of `page`, made before the test opens the app."""
    script_runs = ScriptRuns(page)
    yield script_runs
    script_runs.close()


def test_a_failed_import_can_be_pressed_again_at_once(page, runs, app_url, tmp_path):
    """An import that fails lets go of the upload's bytes in this session (issue 30), and the form
    then drew no Import button until the visitor's next change, though the browser still showed the
    file. Now the button is there at once, and pressing it imports the kept file again (the run of
    each press draws the error again: the import ran)."""
    from test_app import _small_vit, _timm_npz

    src = tmp_path / "small_vit.npz"
    src.write_bytes(_timm_npz(_small_vit()))
    uploader = open_import_form(page, app_url)
    runs.after(lambda: uploader.locator("input[type=file]").set_input_files(str(src)))
    button = page.locator(".st-key-checkpoints_model_import button")
    expect(button).to_be_visible()
    family = page.locator(".st-key-checkpoints_model_family")
    family.locator("input").click()                                    # the list opens (no run)
    runs.after(page.get_by_role("option", name="beit", exact=True).click)   # a timm ViT is not a BEiT file
    form = page.locator("[data-testid='stExpander']", has_text="Import your own ViT").locator("details")
    expect(form).to_have_attribute("open", "")                         # the choice's rerun keeps the form open
    error = page.locator("[data-testid='stAlertContentError']")
    for press in range(2):                                              # the first press, then once more
        alerts = runs.after(button.click)
        assert any(a.startswith("small_vit.npz was not imported") for a in alerts), (press, alerts)   # it ran
        expect(error).to_contain_text("small_vit.npz was not imported")
        expect(button).to_be_visible()
        expect(page.get_by_text("small_vit.npz is still selected", exact=False)).to_be_visible()
    no_exception(page)


def test_the_import_form_stays_open_for_a_second_file_after_an_import(page, runs, app_url, tmp_path):
    """Issue 44, item 6: after one import, picking a second weights file collapsed the "Import your
    own ViT" form (the expander was drawn open on the import's run only, and the browser followed
    the server's "closed" on the next run), hiding the Import button until the visitor reopened it.
    The form keeps the open state the visitor gave it, through both imports."""
    from test_app import _small_vit, _timm_npz

    first, second = tmp_path / "first_vit.npz", tmp_path / "second_vit.npz"
    first.write_bytes(_timm_npz(_small_vit()))
    second.write_bytes(_timm_npz(_small_vit(4)))
    uploader = open_import_form(page, app_url)
    form = page.locator("[data-testid='stExpander']", has_text="Import your own ViT").locator("details")
    button = page.locator(".st-key-checkpoints_model_import button")
    success = page.locator("[data-testid='stAlertContentSuccess']")
    for src in (first, second):
        runs.after(lambda: uploader.locator("input[type=file]").set_input_files(str(src)))
        expect(form).to_have_attribute("open", "")                     # the second file: it was collapsed here
        expect(button).to_be_visible()
        alerts = runs.after(button.click)
        assert any(a.startswith(f"Imported as `{src.stem}-upload`") for a in alerts), alerts
        expect(success).to_contain_text(f"Imported as {src.stem}-upload")
        expect(form).to_have_attribute("open", "")
    no_exception(page)
    expect(page.locator("[data-testid='stAlertContentError']")).to_have_count(0)


def test_model_file_over_the_uploaders_limit_is_refused_in_the_browser(page, app_url, tmp_path):
    """A weights file over the model uploader's own 200 MB limit (sparse: no disk used).
    What Streamlit 1.67 shows, pinned so that a change is noticed: it refuses the file in the
    browser before any byte is sent, with a red chip (name, size, error icon) and no message
    in the page: the text "File must be 200.0MB or smaller." is only a tooltip of the chip's
    error icon and a visually hidden alert for screen readers. The script never sees the
    file, so the app cannot add a message of its own (no Import button, no st.error); the
    limit is stated beforehand in the expander's caption."""
    from pages.common.imported import MAX_MODEL_UPLOAD_MB

    big = tmp_path / "too_big.safetensors"
    with open(big, "wb") as f:
        f.truncate((MAX_MODEL_UPLOAD_MB + 1) * 2**20)
    uploader = open_import_form(page, app_url)
    expect(page.get_by_text(f"up to {MAX_MODEL_UPLOAD_MB} MB", exact=False)).to_be_visible()   # the limit, stated
    uploader.locator("input[type=file]").set_input_files(str(big))
    chip = uploader.locator("[data-testid='stFileChip']")
    expect(chip).to_have_attribute("aria-label", re.compile(re.escape(big.name)))
    expect(chip).to_have_attribute("aria-invalid", "true")
    icon = chip.locator("[data-testid='stFileChipIconError']")
    expect(icon).to_be_visible()
    message = f"File must be {MAX_MODEL_UPLOAD_MB:.1f}MB or smaller."
    alert = chip.locator("[role=alert]")
    expect(alert).to_have_text(f"Error: {message}")
    box = alert.bounding_box()
    assert box is not None and box["width"] <= 1 and box["height"] <= 1      # for screen readers only
    settle(page)
    expect(page.locator(".st-key-checkpoints_model_import")).to_have_count(0)   # nothing reached the script
    expect(page.locator("[data-testid='stAlertContentError']")).to_have_count(0)
    expect(page.get_by_text(message, exact=True)).to_have_count(0)             # not on the page ...
    icon.hover()
    expect(page.get_by_text(message, exact=True)).to_be_visible()              # ... until the icon is hovered
    no_exception(page)
    shot(page, "import_too_big")
