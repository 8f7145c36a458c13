"""Embedding similarity: the cosine similarity of a position table's rows — the full N×N
matrix and the ViT paper's Figure 7 (one small map per patch) — for every checkpoint with a
table (imported pretrained ViTs included); the chosen patch's map large, the 2D-structure
score across checkpoints, and the tables recorded during training."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from vitpe_core import analysis, figures, views
from pages.common import cache, explain, film, loading, messages, picker, swin_view, viewsync, widgets
from pages.common.output import chart, downloads, figure7_axes, token_axes
from vitpe_core.viewstate import ViewState

PAGE = "similarity"
SCORE_HELP = ("Spearman rank correlation of similarity with minus the spatial distance over all patch pairs "
              "(1 = similarity falls off perfectly with distance, 0 = no relation)")


def main() -> None:
    explain.render(PAGE)
    names = cache.checkpoint_names()
    ckpts = loading.load_checkpoints(names)
    table_names = [n for n, c in ckpts.items() if "table" in views.position_hooks(c.model)]   # a Swin: none
    view = viewsync.current_view(PAGE, names)
    if not names:
        messages.no_checkpoints_info()
    elif not table_names:
        st.info("None of the checkpoints has an absolute position table (encodings `ape`, `ape2d`, `sincos2d`, "
                "or a composite with one, e.g. `sape2+ape`). Import a pretrained ViT on the Checkpoints page."
                + swin_view.no_table_note(view.ckpt, ckpts.get(view.ckpt)))
    shown = view
    if view.ckpt not in table_names and table_names:
        if view.ckpt:
            st.info(f"`{view.ckpt}` has no position table; showing `{table_names[0]}`."
                    + swin_view.no_table_note(view.ckpt, ckpts.get(view.ckpt)))
        shown = with_ckpt(view, table_names[0])   # here only: the session keeps its model (issue 44)
    with st.sidebar:
        if table_names:
            widgets.checkpoint_select(PAGE, table_names)      # keeps a session's model without a table
            shown = widgets.epoch_control(PAGE, shown)
    viewsync.render_share(view)
    if not table_names:
        return
    st.caption("Your own pretrained ViT (timm, DeiT, DINOv2, Hugging Face) can be imported on the Checkpoints page.")
    res = cache.similarity(shown.ckpt, shown.epoch)
    show(res, shown.ckpt + ("" if shown.epoch is None else f", epoch {shown.epoch}"), shown.ckpt)


def with_ckpt(view: ViewState, name: str) -> ViewState:
    """`view` on checkpoint `name` (its patch kept where it fits the grid), for this page only."""
    grid = cache.get_checkpoint(name).config.grid
    patch = view.patch if view.patch[0] < grid[0] and view.patch[1] < grid[1] else (grid[0] // 2, grid[1] // 2)
    return ViewState(**{**view.__dict__, "ckpt": name, "patch": patch})


def show(res: dict, label: str, source: str) -> None:
    sim, grid, score = res["sim"], tuple(res["grid"]), res["score"]
    H, W = grid
    patch = tuple(st.session_state["patch"])
    if not (patch[0] < H and patch[1] < W):
        patch = (H // 2, W // 2)
        st.session_state["patch"] = patch
    sim_grid = analysis.similarity_grid(sim, grid)                   # (H, W, H, W)
    cols = st.columns(5)
    cols[0].metric("2D structure (Spearman)", f"{score['spearman']:.3f}", help=SCORE_HELP)
    for col, (k, text) in zip(cols[1:], [("same_row", "same row"), ("same_col", "same column"),
                                         ("other", "other pairs"), ("neighbour", "4-neighbours")]):
        col.metric(f"mean similarity, {text}", f"{score[k]:.3f}")
    left, right = st.columns(2)
    with left:
        st.caption(f"Figure 7 for {label}: tile (r, c) is patch (r, c)'s similarity to every patch — click a tile")
        picker.clickable(figures.figure7_image(sim_grid, patch=patch), f"{PAGE}_click",
                         lambda x, y, w, h: figures.figure7_pixel_to_patch(x, y, w, h, grid))
        downloads(f"{source}_figure7", figures.figure7_canvas(sim_grid), key=f"{PAGE}_figure7_dl", full=sim_grid,
                  shown_what="Figure 7 as drawn (NaN gaps)", full_what="similarity, (H, W, H, W)",
                  axes=figure7_axes(grid))
    with right:
        widgets.patch_controls(PAGE, grid)
        widgets.patch_text(patch, grid)
        m = sim_grid[patch]                                          # (H, W)
        base = f"{source}_similarity_p{patch[0]}-{patch[1]}"
        title = f"Patch ({patch[0]}, {patch[1]}) vs every position<br>{label}"
        chart(figures.patch_map_fig(m, title=title,
                                    colorbar_title="cosine<br>similarity", patch=patch,
                                    colorscale=figures.SIMILARITY_SCALE, zmin=-1, zmax=1),
              base, key=f"{PAGE}_patch_map")
        downloads(base, m, key=f"{PAGE}_patch_dl", shown_what="cosine similarity map")
    tabs = st.tabs(["N×N matrix", "Across checkpoints", "During training"])
    with tabs[0]:
        chart(figures.similarity_matrix_fig(sim, grid, patch=patch,
                                            title=f"All {H * W} position embeddings, cosine<br>{label}"),
              f"{source}_similarity_matrix", key=f"{PAGE}_matrix")
        downloads(f"{source}_similarity_matrix", sim, key=f"{PAGE}_matrix_dl", shown_what="N×N cosine similarity",
                  axes=token_axes(grid))
    with tabs[1]:
        across_checkpoints(source, res)
    with tabs[2]:
        during_training(source)


def across_checkpoints(current: str, current_res: dict) -> None:
    rows = cache.structure_scores()
    df = pd.DataFrame.from_dict(rows, orient="index").round(4)
    df.index.name = "source (final table)"
    st.dataframe(df, key=f"{PAGE}_scores", placeholder="—")
    st.caption(SCORE_HELP + "; the other columns are mean cosine similarities of patch pairs in the same row, "
               "the same column, neither, and of 4-neighbours.")
    st.download_button("Scores (CSV)", data=df.to_csv().encode(), file_name="structure_scores.csv",
                       mime="text/csv", key=f"{PAGE}_scores_csv", on_click="ignore")


def during_training(source: str) -> None:
    hist = cache.structure_history(source)
    if not hist:
        st.caption("This checkpoint recorded no training history.")
        return
    epochs = sorted(hist)
    series = {k: [hist[e][k] for e in epochs] for k in ("spearman", "same_row", "same_col", "other")}
    chart(figures.line_fig(epochs, series, title=f"Table's 2D structure in training<br>{source}",
                           x_title="epoch", y_title="score / mean similarity"),
          f"{source}_structure_history", key=f"{PAGE}_history")
    st.caption("Move the epoch slider in the sidebar to see the table of any recorded epoch above.")
    film.emergence_film(PAGE, source)


main()
