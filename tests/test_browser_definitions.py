"""The definitions open as a page of the app, in a real browser (issue 31, item 4): the compare
page's "Definitions" link pointed at docs/encodings.md, which a served app does not have, and
opened a new tab on the bias explorer. Now a click on it shows docs/encodings.md rendered on the
app's Definitions page (/definitions), in the same tab; the relative links of the pages' "What am
I looking at?" texts open the same page (in a new tab, as Streamlit opens Markdown links). Skips
without chromium / playwright, like tests/test_browser.py."""
from __future__ import annotations

import pytest

from benchmarks import harness as lt

pytestmark = [pytest.mark.browser, pytest.mark.slow]
lt.skip_module_without_browser(pytest)
from playwright.sync_api import expect  # noqa: E402

TIMEOUT_MS = 90_000
DOC_HEADING = "Position encodings in vitpe"          # docs/encodings.md's title


def _on_definitions(page) -> None:
    expect(page.get_by_role("heading", name=DOC_HEADING)).to_be_visible()
    expect(page.get_by_role("heading", name="Position-only kernels and the relative score")).to_be_visible()
    assert page.url.split("?")[0].rstrip("/").endswith("/definitions"), page.url
    assert not page.get_by_role("heading", name="Bias explorer").count()


def test_the_compare_pages_definitions_link_opens_the_document_in_the_app(page, app_url):
    page.goto(lt.share_url(app_url, page="compare"))
    link = page.get_by_role("link", name="Definitions: how each kernel and score is computed")
    expect(link).to_be_visible()
    pages_before = len(page.context.pages)
    link.click()
    _on_definitions(page)
    assert len(page.context.pages) == pages_before                   # the same tab, not a new one
    expect(page.get_by_text("Compare encodings", exact=True).first).to_be_visible()   # the app's menu is there


def test_a_what_am_i_looking_at_link_opens_the_same_page(page, app_url):
    """Streamlit opens a Markdown link in a new tab: a new session, on the Definitions page."""
    page.goto(lt.share_url(app_url, page="similarity"))
    page.get_by_text("What am I looking at?").click()
    link = page.get_by_test_id("stMainBlockContainer").get_by_role("link", name="Definitions", exact=True)
    expect(link).to_be_visible()
    assert link.get_attribute("href") == "definitions"
    with page.context.expect_page() as opened:
        link.click()
    tab = opened.value
    tab.set_default_timeout(TIMEOUT_MS)
    _on_definitions(tab)
