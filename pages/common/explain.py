"""Each page's "What am I looking at?" section: what the page shows, for a student who has read
the ViT paper but not the SaPE² paper. The texts are Markdown files, one per page, in
`texts/<page>.md` beside this module, read each time a page draws its section (an edit shows on
the next rerun)."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

TEXTS = Path(__file__).parent / "texts"


def text(page: str) -> str:
    """Page `page`'s explanation (Markdown); FileNotFoundError for a page without one."""
    return (TEXTS / f"{page}.md").read_text(encoding="utf-8")


def render(page: str) -> None:
    """The page's "What am I looking at?" expander (closed)."""
    with st.expander("What am I looking at?", expanded=False):
        st.markdown(text(page))
