"""Controlled widgets: the pages' controls bound to the view in `st.session_state` (see
`viewsync`).

Each widget has its own key, is set from the view before it is drawn (only when the two differ,
so a newer value in the browser is never overwritten by an older one), and writes the view back
in its `on_change` callback, so views survive page switches: `bound` does this for any widget;
the checkpoint, layer / head, patch and epoch controls are built on it.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import streamlit as st

from vitpe_core.checkpoint import GROUPS, in_group
from vitpe_core.viewstate import FINAL_EPOCH, MEAN_HEAD, ViewState

from .viewsync import commit, epochs_of

NARROW_PX = 768                    # up to this width the sidebar starts collapsed: the main area says so


def show_in_widget(key: str, value: Any) -> None:
    """Set widget `key` to `value` before it is drawn, only if it shows something else: writing
    an unchanged value would send it to the browser again and could undo a newer change
    made there while this run was under way."""
    ss = st.session_state
    if key not in ss or ss[key] != value:
        ss[key] = value


def bound(widget: Callable[..., Any], key: str, canon: str, *, to_widget: Callable[[Any], Any] = lambda v: v,
          from_widget: Callable[[Any], Any] = lambda v: v, then: Callable[[], None] | None = None,
          **kwargs) -> Any:
    """Draw `widget(key=key)` showing `session_state[canon]`; a change writes it back (and
    calls `then`)."""
    show_in_widget(key, to_widget(st.session_state[canon]))

    def changed() -> None:
        st.session_state[canon] = from_widget(st.session_state[key])
        if then is not None:
            then()

    return widget(key=key, on_change=changed, **kwargs)


def checkpoint_select(prefix: str, names: Sequence[str], *, label: str = "Checkpoint") -> str:
    """Select box of the checkpoints, bound to the view's `ckpt`. A session's checkpoint not among
    `names` (the similarity page lists only those with a table) shows the first of them and stays
    the session's until the visitor picks one."""
    return bound(st.selectbox, f"{prefix}_ckpt", "ckpt", label=label, options=list(names),
                 to_widget=lambda name: name if name in names else names[0],
                 help="Checkpoints in the folder; '+' composes encodings (e.g. sape2+ape).")


def checkpoints_pick(prefix: str, names: Sequence[str]) -> list[str]:
    """Multiselect of checkpoints, in the order picked, bound to the view's `show` (the link keeps
    it); `None` there = the main folder's checkpoints and this session's imported models, not the
    groups' (`long/...`), unless there is nothing else."""
    default = [n for n in names if not in_group(n)] or list(names)
    return bound(st.multiselect, f"{prefix}_show", "show", label="Checkpoints to show", options=list(names),
                 to_widget=lambda v: list(default if v is None else v),
                 from_widget=lambda v: None if list(v) == default else tuple(v),
                 placeholder="Pick checkpoints to compare",
                 help="In the order picked; the share link keeps the pick. " + (
                     "Shown at first: all but the longer-budget runs (" + ", ".join(f"{g}/" for g in GROUPS)
                     + "), which you can add here." if len(default) < len(names) else "Shown at first: all."))


def layer_head_controls(prefix: str, depth: int, heads: int) -> tuple[int, int | None]:
    """Layer slider and head select (`None` = mean over heads), bound to the view."""
    if depth > 1:
        bound(st.select_slider, f"{prefix}_layer", "layer", label="Layer", options=list(range(depth)))
    else:
        st.caption("Layer 0 (the model has one layer)")
    bound(st.selectbox, f"{prefix}_head", "head", label="Head", options=[MEAN_HEAD, *map(str, range(heads))],
          format_func=lambda h: "mean over heads" if h == MEAN_HEAD else f"head {h}",
          to_widget=lambda h: MEAN_HEAD if h is None else str(h),
          from_widget=lambda h: None if h == MEAN_HEAD else int(h))
    return st.session_state["layer"], st.session_state["head"]


def controls_hint(prefix: str, layer: int, head: int | None) -> None:
    """On screens up to `NARROW_PX` wide (a phone: the sidebar starts collapsed) the main area
    says which layer and head the maps show and where their controls are. A second set of
    controls here would fight the sidebar's: a rerun carries every widget's value from the
    browser, and the copy the browser had not yet updated would set the view back."""
    box = f"{prefix}_controls_hint"
    st.html(f"<style>@media (min-width: {NARROW_PX + 1}px) {{ .st-key-{box} {{ display: none; }} }}</style>")
    with st.container(key=box):
        st.caption(f"Showing layer {layer}, {'mean over heads' if head is None else f'head {head}'}. The image, "
                   "layer and head controls are in the sidebar: tap » at the top left.")


def patch_controls(prefix: str, grid: tuple[int, int]) -> tuple[int, int]:
    """Row / column number inputs (the keyboard-accessible way to choose a patch)."""
    H, W = grid
    r_col, c_col = st.columns(2)

    def changed() -> None:
        st.session_state["patch"] = (int(st.session_state[f"{prefix}_row"]), int(st.session_state[f"{prefix}_col"]))

    r, c = st.session_state["patch"]
    show_in_widget(f"{prefix}_row", int(r))
    show_in_widget(f"{prefix}_col", int(c))
    r_col.number_input("Row r", min_value=0, max_value=H - 1, step=1, key=f"{prefix}_row", on_change=changed)
    c_col.number_input("Column c", min_value=0, max_value=W - 1, step=1, key=f"{prefix}_col", on_change=changed)
    return st.session_state["patch"]


def patch_text(patch: tuple[int, int], grid: tuple[int, int]) -> None:
    """The chosen patch and its token index, in bold."""
    r, c = patch
    st.markdown(f"**Patch ({r}, {c})** — token n = r·W + c = {r * grid[1] + c} of {grid[0]}×{grid[1]}")


def epoch_control(page: str, view: ViewState) -> ViewState:
    """A slider over the epochs recorded in the view's checkpoint's history, bound to the
    view's `epoch` (None = final weights; in the share link); returns the view. A `view` on
    another checkpoint than the session's (shown in its place, the similarity page) is not
    committed."""
    epochs = epochs_of(view.ckpt)
    if view.epoch is not None and view.epoch not in epochs:       # the page showed another checkpoint
        view = ViewState(**{**view.__dict__, "epoch": None})
        if view.ckpt == st.session_state.get("ckpt"):
            commit(view)
    if not epochs:
        st.sidebar.caption("This checkpoint recorded no training history.")
        return view
    with st.sidebar:
        bound(st.select_slider, f"{page}_epoch", "epoch", label="Epoch (table recorded during training)",
              options=[*epochs, FINAL_EPOCH], help="Watch the row/column structure emerge as training proceeds.",
              to_widget=lambda e: FINAL_EPOCH if e is None else e,
              from_widget=lambda v: None if v == FINAL_EPOCH else int(v))
    return view
