"""The "Definitions" page: docs/encodings.md (notation, hooks, each encoding's equations, the
position-only kernels and their scores) rendered inside the app. A served app has no
repository files at a URL, so the pages link here (`link`, or a relative Markdown link to
`URL_PATH`), never to `docs/encodings.md`.

Not a view of `vitpe_core.viewstate.PAGES` (no checkpoint, image or patch: nothing for a share
link to keep); app.py adds it to the navigation, not to the menu, as a callable page (`page`).
The document is read at each draw (an edit shows on the next rerun) and adapted (`document`):
its headings one level down under the page's title, and links to repository files, which the
app cannot serve, kept as their text.
"""
from __future__ import annotations

import re
from pathlib import Path

import streamlit as st

DOC = Path(__file__).resolve().parents[2] / "docs" / "encodings.md"
URL_PATH = "definitions"
TITLE = "Definitions"
ICON = ":material/menu_book:"
MENU = False     # a fifth menu entry pushed the sidebar's controls down, below a 1000 px window's reach

_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]*)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~)")


def _served(target: str) -> bool:
    """A link target that works inside the app: a web address, an anchor, a mail address."""
    return target.startswith(("http://", "https://", "#", "mailto:"))


def _adapt_line(line: str) -> str:
    line = ("#" + line) if line.startswith("#") else line          # `# Title` -> `## Title`: the page has the h1

    def link(m: re.Match) -> str:
        image, text, target = m.groups()
        if _served(target):
            return m.group(0)
        return "" if image else text                               # a repository file: its text, no link

    return _LINK.sub(link, line)


def document(text: str | None = None) -> str:
    """docs/encodings.md (or `text`) as the page shows it: headings one level down, links and
    images pointing into the repository replaced by their text (a link) or dropped (an image);
    code blocks left as they are."""
    text = DOC.read_text(encoding="utf-8") if text is None else text
    out, in_code = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            in_code = not in_code
            out.append(line)
            continue
        out.append(line if in_code else _adapt_line(line))
    return "\n".join(out) + "\n"


def render() -> None:
    """The page: the document, and where it lives."""
    try:
        body = document()
    except OSError as e:
        st.error(f"The definitions (docs/encodings.md) could not be read: {e}")
        return
    st.caption("The definitions behind every page: docs/encodings.md of the repository, shown here.")
    st.markdown(body)


def page() -> st.Page:
    """The page as `st.navigation` takes it (one made here and in `link` route alike: a
    callable page is known by its `URL_PATH`). Not in the sidebar's menu (`MENU`): reached by
    the links of the pages that use its terms, and by its address."""
    return st.Page(render, title=TITLE, icon=ICON, url_path=URL_PATH, visibility="visible" if MENU else "hidden")


def link(label: str = "Definitions") -> None:
    """A link to the page, in the same tab (the session and its view kept)."""
    st.page_link(page(), label=label, icon=ICON)
