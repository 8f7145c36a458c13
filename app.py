"""vitpe: explore how Vision Transformers see position. Run from the repository root:

    streamlit run app.py            # checkpoints from ./checkpoints or $VITPE_CHECKPOINTS

A router only (st.navigation): the pages are in pages/ (their shared widgets and caches in
pages/common/), their computations in vitpe_core (usable without Streamlit).
A link `/?page=similarity&ckpt=ape&patch=3,4` opens that page with its query parameters
(carried over on the switch); see vitpe_core.viewstate for the parameters.
"""
from __future__ import annotations

import streamlit as st   # `streamlit run app.py` puts this folder on sys.path: pages/ and vitpe_core import

from pages.common import definitions, warmup                         # light: imports in a thread
from vitpe_core.viewstate import DEFAULT_PAGE, PAGES as PAGE_NAMES   # torch-free (vitpe_core imports lazily)

NAV = {  # page name (vitpe_core.viewstate.PAGES, the one list) -> (menu title, icon); file pages/NAME.py
    "bias": ("Bias explorer", ":material/my_location:"),
    "similarity": ("Embedding similarity", ":material/grid_view:"),
    "compare": ("Compare encodings", ":material/compare:"),
    "checkpoints": ("Checkpoints", ":material/inventory_2:"),
    definitions.URL_PATH: (definitions.TITLE, definitions.ICON),   # text, not a view (not in PAGES); not in the menu
}
HEADINGS = {"similarity": "Position-embedding similarity"}   # the page's h1 where it differs from the menu


def main() -> None:
    """One visitor's run: route to the page, draw the sidebar's folder line and the status."""
    st.set_page_config(page_title="vitpe — position encodings in ViTs", page_icon="🧭", layout="wide")

    pages = {name: st.Page(f"pages/{name}.py", title=NAV[name][0], icon=NAV[name][1], url_path=name,
                           default=name == DEFAULT_PAGE) for name in sorted(PAGE_NAMES, key=list(NAV).index)}
    pages[definitions.URL_PATH] = definitions.page()                  # docs/encodings.md, rendered
    nav = st.navigation(list(pages.values()))

    # `?page=NAME` on any URL opens that page once per session, keeping the other parameters.
    requested = st.query_params.get("page")
    if not st.session_state.get("_vitpe_routed"):
        st.session_state["_vitpe_routed"] = True
        if requested in pages and pages[requested].url_path != nav.url_path:
            st.switch_page(pages[requested], query_params=st.query_params.to_dict())

    # The page's title first. Then, while the server's warm-up still imports the pages' modules,
    # what it waits for ("Preparing the app: loading Plotly…"), replaced by the page when they are
    # in (torch is not among them: a page run that needs a model waits for it in `cache.load_model`,
    # "Preparing the app: compiling ...… 12 s" on a fresh install). No pandas here: a page that
    # shows a table imports it, and vitpe_core.figures keeps Plotly from using it half-imported
    # (figures.threadsafe; it broke charts under the load test once).
    name = next(n for n, p in pages.items() if p.url_path == nav.url_path)
    st.title(HEADINGS.get(name, NAV[name][0]))
    prefetch = warmup.prefetch_frontend()   # a session's first run: the browser loads Plotly's code meanwhile
    warmup.wait_visibly()
    from pages.common import cache, imported, status, viewsync

    with imported.model_turns().scope():  # a big imported model's turn, taken in the run, is given back at its end
        viewsync.open_link_model()      # a link's imported model joins this session's list first
        with st.sidebar:
            root = cache.checkpoint_root()
            st.caption(f"Checkpoints: `{root}` ({cache.count_text()}). "
                       f"Set `{cache.ENV_VAR}` to use another folder.")

        try:
            nav.run()
        except cache.ModelEvicted as e:     # another visitor's import took its room mid-run: say so, not a traceback
            st.warning(str(e), icon=":material/delete_sweep:")
        finally:
            if prefetch is not None:
                prefetch.empty()
    status.render()
    warmup.page_sent()      # the first visitor's first page is out: the warm-up imports torch once it is drawn


def _no_pages_folder_mode() -> None:
    """Route every run through main(). Streamlit runs the files of a `pages/` folder next to the
    main script as pages of their own (multipage v1) until some session calls st.navigation: the
    first visitors of a fresh server who opened a path (`/compare?show=...`, what the address bar
    shows after any page switch) got that page bare, without the title, the router or the menu's
    names, until someone opened `/`. st.navigation clears the same flag."""
    try:
        from streamlit.runtime.pages_manager import PagesManager

        PagesManager.uses_pages_directory = False
    except (ImportError, AttributeError) as e:  # another Streamlit: the first visit of `/` still fixes it
        warmup.log.warning("could not turn off Streamlit's pages-folder mode (%s): open / first after a restart", e)


if __name__ == "__main__":    # a visitor's run: Streamlit runs this file as __main__
    main()
else:                         # `streamlit run app.py` imports it once, finds this server and serves
    from starlette.middleware import Middleware

    from pages.common.paths import RedirectDeepPaths   # /pages/compare -> /compare, not a blank page
    from pages.common.upload_room import MakeRoomForUploads   # a big upload's bytes inside the budget

    _no_pages_folder_mode()
    app = st.App(__file__, lifespan=warmup.lifespan,   # the file to visitors; warm-up at start
                 middleware=[Middleware(RedirectDeepPaths), Middleware(MakeRoomForUploads)])
