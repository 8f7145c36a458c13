"""What a page puts out: its Plotly charts (the camera button saves PNG or SVG, the sidebar's
choice) and the download buttons of the data behind them (CSV of the map shown, with a header
row and a header column naming its axes; NPY of the full array)."""
from __future__ import annotations

import csv
import io
from typing import NamedTuple, Sequence

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
    # a map figure sets its own width (its maps, its colour bar beside them); others fill the column
    st.plotly_chart(fig, config=config, key=key, width="content" if fig.layout.width else "stretch")


class Axes(NamedTuple):
    """What the rows and columns of a CSV download are: a label per row and per column, and
    the top-left cell saying which is which (e.g. "patch row \\ patch column")."""
    rows: Sequence[str]
    cols: Sequence[str]
    corner: str = ""


def patch_axes(shape: tuple[int, ...]) -> Axes:
    """A patch map `(H, W)`: rows `r0…` (patch rows), columns `c0…` (patch columns)."""
    H, W = shape[-2:]
    return Axes([f"r{r}" for r in range(H)], [f"c{c}" for c in range(W)], "patch row \\ patch column")


def token_axes(grid: tuple[int, int]) -> Axes:
    """An `(N, N)` matrix over the grid's patches in row-major order: `r{row}c{column}` both ways."""
    names = [f"r{r}c{c}" for r in range(grid[0]) for c in range(grid[1])]
    return Axes(names, names, "query patch \\ key patch")


def figure7_axes(grid: tuple[int, int]) -> Axes:
    """Figure 7's canvas (`figures.figure7_canvas`): tile (r, c) holds patch (r, c)'s similarity
    to every patch (i, j); rows `r{r} i{i}`, columns `c{c} j{j}`, the NaN gaps `gap`."""
    H, W = grid
    rows = [f"r{r} i{i}" if i < H else "gap" for r in range(H) for i in range(H + 1)][:-1]
    cols = [f"c{c} j{j}" if j < W else "gap" for c in range(W) for j in range(W + 1)][:-1]
    return Axes(rows, cols, "tile row r, key row i \\ tile column c, key column j")


def class_axes(names: Sequence[str], what: str = "probability") -> Axes:
    """One row of values per class (probabilities): the class names as columns."""
    return Axes([what], list(names), "class")


def _csv(a: np.ndarray, axes: Axes | None = None) -> bytes:
    """`a` as CSV with a header row and a header column (`axes`; default `patch_axes` for a
    2-D map, `row i` / `column j` otherwise)."""
    a = np.asarray(a)
    a2 = a.reshape(-1, a.shape[-1]) if a.ndim != 2 else a
    if axes is None or len(axes.rows) != a2.shape[0] or len(axes.cols) != a2.shape[1]:
        axes = patch_axes(a2.shape) if a.ndim == 2 else Axes([f"row {i}" for i in range(a2.shape[0])],
                                                           [f"column {j}" for j in range(a2.shape[1])])
    fmt = ",".join(["%.6g"] * a2.shape[1])                     # as np.savetxt formats a row: one % per line
    lines = [_csv_cells([axes.corner, *axes.cols])]
    lines += [f"{_csv_cells([label])},{fmt % tuple(row)}" for label, row in zip(axes.rows, a2.astype(float).tolist())]
    return ("\n".join(lines) + "\n").encode()


def _csv_cells(cells: Sequence[str]) -> str:
    """One CSV line of text cells (a label with a comma or a quote in it is quoted)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(cells)
    return buf.getvalue()


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(a), allow_pickle=False)
    return buf.getvalue()


def downloads(name: str, shown: np.ndarray, key: str, *, full: np.ndarray | None = None,
              shown_what: str = "the map shown", full_what: str | None = None, axes: Axes | None = None) -> None:
    """CSV of the map shown and NPY of the full array (`full`, default the map), each button
    saying what it holds (`shown_what`, `full_what`: e.g. "shown map, normalised 0–1" and
    "raw bias, all layers × heads"; the shapes in their tooltips). The CSV's first row and
    first column name the axes (`axes`: `patch_axes`, the default for a 2-D map, `token_axes`,
    `figure7_axes`, `class_axes`). The labels wrap rather than being cut off in a narrow column."""
    safe = figures.export_config(name)["toImageButtonOptions"]["filename"]
    full = shown if full is None else full
    with st.container(horizontal=True, key=f"{key}_row"):
        st.download_button(f"CSV: {shown_what}", data=lambda: _csv(shown, axes), file_name=f"{safe}.csv",
                           mime="text/csv", key=f"{key}_csv", on_click="ignore", wrap=True,
                           help=f"Comma-separated, shape {tuple(np.shape(shown))}: one line per row, the first "
                                "line and the first column name the rows and columns")
        st.download_button(f"NPY: {full_what or shown_what}", data=lambda: _npy(full), file_name=f"{safe}.npy",
                           mime="application/octet-stream", key=f"{key}_npy", on_click="ignore", wrap=True,
                           help=f"numpy.load() it: shape {tuple(np.shape(full))}, {np.asarray(full).dtype}")
