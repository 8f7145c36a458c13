"""What a page puts out: its Plotly charts (the camera button saves PNG or SVG, the sidebar's
choice) and the download buttons of the data behind them (CSV of the map shown, NPY of the
full array)."""
from __future__ import annotations

import io

import numpy as np
import streamlit as st

from vitpe_core import figures

FIGURE_FORMAT = "_vitpe_figure_format"   # the session's figure download format: "png" or "svg"


def chart(fig, name: str, key: str) -> None:
    """A Plotly chart whose camera button saves `name`.png or `name`.svg: the sidebar's "Figure
    download format" (drawn by a run's first chart, then set aside: a second draw of its key
    raises; kept for the session in `session_state["_vitpe_figure_format"]`). SVG is drawn by
    the browser's Plotly, vector and editable, as PNG is: no server-side image export."""
    from streamlit.errors import StreamlitDuplicateElementKey

    ss, formats = st.session_state, ["png", "svg"]
    chosen = ss.setdefault(FIGURE_FORMAT, "png")
    try:                                               # the widget starts at the session's choice on every page
        st.sidebar.radio("Figure download format", formats, index=formats.index(chosen), key="figure_format",
                         horizontal=True, format_func=str.upper,
                         on_change=lambda: ss.__setitem__(FIGURE_FORMAT, ss["figure_format"]),
                         help="What the camera button at the top right of every chart saves: PNG (twice the "
                              "screen size) or SVG (vector, for papers).")
    except StreamlitDuplicateElementKey:
        pass                                           # an earlier chart of this run drew it
    config = figures.export_config(name)
    config["toImageButtonOptions"]["format"] = ss[FIGURE_FORMAT]
    st.plotly_chart(fig, config=config, key=key)


def _csv(a: np.ndarray) -> bytes:
    a = np.asarray(a)
    a2 = a.reshape(-1, a.shape[-1]) if a.ndim != 2 else a
    buf = io.StringIO()
    np.savetxt(buf, a2, delimiter=",", fmt="%.6g")
    return buf.getvalue().encode()


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(a), allow_pickle=False)
    return buf.getvalue()


def downloads(name: str, shown: np.ndarray, key: str, *, full: np.ndarray | None = None,
              shown_what: str = "the map shown", full_what: str | None = None) -> None:
    """CSV of the map shown and NPY of the full array (`full`, default the map), each button
    saying what it holds (`shown_what`, `full_what`: e.g. "shown map, normalised 0–1" and
    "raw bias, all layers × heads"; the shapes in their tooltips). The labels wrap rather than
    being cut off in a narrow column."""
    safe = figures.export_config(name)["toImageButtonOptions"]["filename"]
    full = shown if full is None else full
    with st.container(horizontal=True, key=f"{key}_row"):
        st.download_button(f"CSV: {shown_what}", data=lambda: _csv(shown), file_name=f"{safe}.csv", mime="text/csv",
                           key=f"{key}_csv", on_click="ignore", wrap=True,
                           help=f"Comma-separated, shape {tuple(np.shape(shown))} (2-D: one line per row)")
        st.download_button(f"NPY: {full_what or shown_what}", data=lambda: _npy(full), file_name=f"{safe}.npy",
                           mime="application/octet-stream", key=f"{key}_npy", on_click="ignore", wrap=True,
                           help=f"numpy.load() it: shape {tuple(np.shape(full))}, {np.asarray(full).dtype}")
