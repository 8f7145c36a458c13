"""Upload -> click -> share -> open elsewhere, in a real browser (issue 16, part 1): a photo
uploaded on the bias page, a patch clicked on the picker (layer 1, head 1 from the opening link); the sidebar's
share link opened in a NEW browser context (another visitor, another Streamlit session) shows
the same image (the same upload id and the same picture in the picker), patch, layer and head;
and the compare page's pick of checkpoints, changed in its multiselect, travels the same way.
The server runs from the repository root with its own `.streamlit/config.toml` and a temporary
`VITPE_UPLOAD_DIR`. Skips without chromium / playwright, like tests/test_browser.py."""
from __future__ import annotations

import io
import re
import shutil

import pytest
from PIL import Image

from benchmarks import harness as lt
from benchmarks.click_cost import click_patch, picker_selector

pytestmark = [pytest.mark.browser, pytest.mark.slow]
lt.skip_module_without_browser(pytest)
from playwright.sync_api import expect  # noqa: E402

TIMEOUT_MS = 90_000
PICKER_IMAGE_JS = "e => e.data[0].source"      # the picker's image (a PNG data URI)


COMMA_NAME = "rpb,2"       # a file name with a comma: `show` must still link it


@pytest.fixture(scope="module")
def server(app_checkpoint_dir, tmp_path_factory):
    uploads = tmp_path_factory.mktemp("uploads")
    ckpts = tmp_path_factory.mktemp("share_checkpoints")
    for f in app_checkpoint_dir.iterdir():
        if f.is_file():
            shutil.copy(f, ckpts / f.name)
    shutil.copy(app_checkpoint_dir / "rpb.safetensors", ckpts / f"{COMMA_NAME}.safetensors")
    mp = pytest.MonkeyPatch()
    mp.setenv("VITPE_UPLOAD_DIR", str(uploads))
    try:
        with lt.streamlit_server(ckpts, log=uploads.parent / "server.log", timeout=90) as srv:
            yield srv, uploads
    finally:
        mp.undo()


def _photo() -> bytes:
    img = Image.new("RGB", (96, 80))
    img.putdata([((x * 5) % 256, (y * 7) % 256, ((x + y) * 3) % 256) for y in range(80) for x in range(96)])
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def _open(tabs, visitor: str, url: str, ready: str):
    """`visitor`'s tab (a browser context of its own: conftest's `Tabs`) on `url`, once the text
    `ready` shows and the app is idle."""
    page = tabs.tab(visitor)
    page.goto(url)
    expect(page.get_by_text(ready, exact=True)).to_be_visible()
    lt.wait_script_run(page, TIMEOUT_MS / 1e3)
    return page


def test_an_uploaded_photo_is_shared_by_link(tabs, server):
    srv, uploads = server
    page = _open(tabs, "visitor", lt.share_url(srv.url, ckpt="sape2+ape", image="cifar10-test-0008", patch=(4, 4),
                                            layer=1, head="1"), "Patch (4, 4)")
    page.locator(".st-key-bias_upload input[type=file]").set_input_files(
        files=[{"name": "photo.png", "mimeType": "image/png", "buffer": _photo()}])
    page.wait_for_function("() => /image=upload(:|%3A)[0-9a-f]{64}/.test(location.search)", timeout=TIMEOUT_MS)
    lt.wait_script_run(page, TIMEOUT_MS / 1e3)
    click_patch(page, "bias_click", (2, 5), (8, 8), where=(0.8, 0.2))
    expect(page.get_by_text("Patch (2, 5)", exact=True)).to_be_visible()
    lt.wait_script_run(page, TIMEOUT_MS / 1e3)
    link = lt.share_link(page)
    digest = re.search(r"image=upload(?::|%3A)([0-9a-f]{64})", link).group(1)
    assert (uploads / f"{digest}.png").is_file()
    assert "patch=2,5" in link and "layer=1" in link and "head=1" in link
    picture = page.locator(picker_selector("bias_click")).evaluate(PICKER_IMAGE_JS)
    page.goto("about:blank")                                               # the first visitor leaves

    page2 = _open(tabs, "another visitor", link, "Patch (2, 5)")
    expect(page2.locator("[data-testid='stAlertContentWarning']")).to_have_count(0)
    expect(page2.locator(".st-key-bias_layer input[type=range]")).to_have_value("1")
    expect(page2.locator(".st-key-bias_head input")).to_have_value("head 1")
    expect(page2.locator(".st-key-bias_row input")).to_have_value("2")
    expect(page2.locator(".st-key-bias_col input")).to_have_value("5")
    expect(page2.get_by_text(digest[:12]).first).to_be_visible()
    assert page2.locator(picker_selector("bias_click")).evaluate(PICKER_IMAGE_JS) == picture   # same pixels
    assert lt.url_params(page2.url)["image"] == f"upload:{digest}"


def _chips(page):
    """The compare page's picked checkpoints, as the multiselect shows them (in order)."""
    return page.locator(".st-key-compare_show [data-tag] span[title]")


def test_the_compare_pick_is_shared_by_link(tabs, server):
    srv, _ = server
    page = _open(tabs, "visitor", lt.share_url(srv.url, page="compare", show=["rpb", "sape2+ape", "ape"]),
                      "Per checkpoint")
    expect(_chips(page)).to_have_text(["rpb", "sape2+ape", "ape"])
    _remove_and_share(tabs, page, "sape2+ape", r"show=rpb(,|%2C)ape(&|$)", "show=rpb,ape", ["rpb", "ape"])


def _remove_and_share(tabs, page, chip: str, url_re: str, link_text: str, kept: list[str]) -> None:
    """Remove `chip` from the compare pick (its ✕), wait for the URL to match `url_re`, take the
    sidebar's link (it must contain `link_text`), leave, and open the link as another visitor: no
    warning, the chips `kept`."""
    page.locator(".st-key-compare_show").get_by_role("button", name=f"Remove {chip}").click()
    page.wait_for_function(f"() => /{url_re}/.test(location.search)", timeout=TIMEOUT_MS)
    lt.wait_script_run(page, TIMEOUT_MS / 1e3)
    expect(_chips(page)).to_have_text(kept)
    link = lt.share_link(page, contains=link_text)
    page.goto("about:blank")

    page2 = _open(tabs, "another visitor", link, "Per checkpoint")
    expect(page2.locator("[data-testid='stAlertContentWarning']")).to_have_count(0)
    expect(_chips(page2)).to_have_text(kept)


def test_a_checkpoint_named_with_a_comma_is_shared_by_link(tabs, server):
    srv, _ = server
    page = _open(tabs, "visitor", lt.share_url(srv.url, page="compare", show=[COMMA_NAME, "ape"]), "Per checkpoint")
    expect(page.locator("[data-testid='stAlertContentWarning']")).to_have_count(0)
    expect(_chips(page)).to_have_text([COMMA_NAME, "ape"])
    _remove_and_share(tabs, page, "ape", r"show=rpb%252C2(&|$)", "show=rpb%252C2", [COMMA_NAME])


def test_a_path_link_is_routed_on_a_fresh_server(page, app_checkpoint_dir, tmp_path):
    """After any page switch the address bar shows a path (`/compare?page=compare&...`). Opened as
    the first visit of a fresh server, it must still run app.py's router (Streamlit would run
    pages/compare.py bare, multipage-v1 style: no title, file names in the menu)."""
    with lt.streamlit_server(app_checkpoint_dir, log=tmp_path / "server.log", timeout=90) as srv:
        page.goto(srv.url + "/compare?show=rpb,ape")
        expect(page.locator("h1").first).to_have_text("Compare encodings")
        expect(page.locator("[data-testid='stSidebarNav']")).to_contain_text("Bias explorer")
        expect(_chips(page)).to_have_text(["rpb", "ape"])
        page.goto(srv.url + "/pages/similarity?ckpt=ape")     # deeper than a page name: redirected, not blank
        expect(page.locator("h1").first).to_have_text("Position-embedding similarity")
        assert lt.url_params(page.url)["ckpt"] == "ape" and "/pages/" not in page.url
        page.goto("about:blank")                               # before the server stops
