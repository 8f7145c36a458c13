"""The operators' status section (a closed expander at the bottom of the sidebar): the upload
store's files, size and cap, the number of live browser sessions, and the imported models held
with the memory they take. Each figure is read when the section is drawn; one that cannot be
read (Streamlit's runtime not running, as in AppTest) says so instead of failing."""
from __future__ import annotations

import streamlit as st

from . import cache


def live_sessions() -> int | None:
    """Browser sessions with an open websocket (Streamlit's session manager); None where the
    runtime or that API is missing."""
    try:
        from streamlit.runtime import Runtime

        return int(Runtime.instance()._session_mgr.num_active_sessions())
    except Exception:
        return None


def render() -> None:
    with st.sidebar.expander("Server status", expanded=False):
        store = cache.image_store()
        files, used = store.size()
        st.caption(f"Uploaded images: {files} file(s), {used / 2**20:.1f} of {store.max_bytes / 2**20:.0f} MiB "
                   f"(least recently used out) in `{store.folder}`.")
        n = live_sessions()
        st.caption(f"Live sessions: {n if n is not None else 'unknown (no Streamlit runtime)'}.")
        models = cache.model_store()
        st.caption(f"Imported models held: {len(models)} of {models.max_items}, "
                   f"{models.bytes / 2**20:.1f} of {models.max_bytes / 2**20:.0f} MiB.")
