"""vitpe: explore how Vision Transformers see position. Run from the repository root:

    streamlit run app.py            # checkpoints from ./checkpoints or $VITPE_CHECKPOINTS

A router only (st.navigation): the pages are in pages/ (their shared widgets and caches in
pages/common/), their computations in vitpe_core (usable without Streamlit).
A link `/?page=similarity&ckpt=ape&patch=3,4` opens that page with its query parameters
(carried over on the switch); see vitpe_core.viewstate for the parameters.
"""
from __future__ import annotations

import pandas  # noqa: F401  imported once, here: Plotly uses a half-imported pandas that another session's
#                 page script is still importing (AttributeError: partially initialized module; load test)
import streamlit as st   # `streamlit run app.py` puts this folder on sys.path: pages/ and vitpe_core import

from pages.common import cache, status
from vitpe_core.viewstate import DEFAULT_PAGE, PAGES as PAGE_NAMES

st.set_page_config(page_title="vitpe — position encodings in ViTs", page_icon="🧭", layout="wide")

NAV = {  # page name (vitpe_core.viewstate.PAGES, the one list) -> (menu title, icon); file pages/NAME.py
    "bias": ("Bias explorer", ":material/my_location:"),
    "similarity": ("Embedding similarity", ":material/grid_view:"),
    "compare": ("Compare encodings", ":material/compare:"),
    "checkpoints": ("Checkpoints", ":material/inventory_2:"),
}
PAGES = {name: st.Page(f"pages/{name}.py", title=NAV[name][0], icon=NAV[name][1], url_path=name,
                       default=name == DEFAULT_PAGE) for name in sorted(PAGE_NAMES, key=list(NAV).index)}
nav = st.navigation(list(PAGES.values()))

# `?page=NAME` on any URL opens that page once per session, keeping the other parameters.
requested = st.query_params.get("page")
if not st.session_state.get("_vitpe_routed"):
    st.session_state["_vitpe_routed"] = True
    if requested in PAGES and PAGES[requested].url_path != nav.url_path:
        st.switch_page(PAGES[requested], query_params=st.query_params.to_dict())

with st.sidebar:
    root = cache.checkpoint_root()
    st.caption(f"Checkpoints: `{root}` ({len(cache.checkpoint_names())} found). "
               f"Set `{cache.ENV_VAR}` to use another folder.")

nav.run()
status.render()
