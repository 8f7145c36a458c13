"""The operators' status section (a closed expander at the bottom of the sidebar): the upload
store's files, size and cap, the number of live browser sessions, the imported models held
with the memory they take, and the process's one memory budget (`VITPE_CACHE_MB`): how much of
it every cache and store holds, with its entries and evictions. Each figure is read when the
section is drawn; one that cannot be read (Streamlit's runtime not running, as in AppTest) says
so instead of failing."""
from __future__ import annotations

import streamlit as st

from . import cache, imported, upload_store


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
        store = upload_store.image_store()
        files, used = store.size()
        st.caption(f"Uploaded images: {files} file(s), {used / 2**20:.1f} of {store.max_bytes / 2**20:.0f} MiB "
                   f"(least recently used out) in `{store.folder}`.")
        n = live_sessions()
        st.caption(f"Live sessions: {n if n is not None else 'unknown (no Streamlit runtime)'}.")
        models = imported.model_store()
        st.caption(f"Imported models held: {len(models)} of {models.max_items}, {models.bytes / 2**20:.1f} MiB.")
        st.caption(turns_text(imported.model_turns()))
        st.caption(budget_text(*cache.budget_sizes()))


def budget_text(held: int, limit: int, pools: dict[str, dict[str, int]]) -> str:
    """The memory budget as the panel says it: the total, then one line per cache or store that
    holds or has held something, largest first."""
    lines = [f"Memory budget (`VITPE_CACHE_MB`): {held / 2**20:.1f} of {limit / 2**20:.0f} MiB held by the "
             "caches and stores, least recently used out:"]
    for name, p in sorted(pools.items(), key=lambda kv: -kv[1]["bytes"]):
        if p["entries"] or p["evictions"]:
            lines.append(f"- {name}: {p['bytes'] / 2**20:.1f} MiB in {p['entries']} entr"
                         f"{'y' if p['entries'] == 1 else 'ies'}, {p['evictions']} evicted")
    return "  \n".join(lines)


def turns_text(turns) -> str:
    """How the runs on big imported models took turns (`vitpe_core.turns`), as the panel says it."""
    return (f"Big imported models (≥ {imported.BIG_MODEL_MB} MiB) take turns, {turns.slots} run at a time: "
            f"{turns.taken} turn(s) taken, {turns.waited} waited for"
            + (f", {turns.timeouts} went on after {turns.wait_s:.0f} s without one." if turns.timeouts else "."))
