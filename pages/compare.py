"""Compare encodings: one image and patch through every checkpoint, one layer/head control for all;
accuracy, attention statistics, how each encodes position (pages/common/position_panel.py), training."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from vitpe_core import figures, views
from pages.common import cache, explain, loading, messages, picker, position_panel, swin_view, uploads, viewsync
from pages.common import widgets
from pages.common.resolution import resolution_explorer, resolution_table
from pages.common.output import chart, downloads

PAGE, COLUMNS = "compare", 2


def main() -> None:
    explain.render(PAGE)
    names = cache.checkpoint_names()
    if not names:
        view = viewsync.current_view(PAGE, names)
        messages.no_checkpoints_info()
        viewsync.render_share(view)
        return
    configs = loading.checkpoint_configs(names)        # headers only: the list, the controls' ranges
    if not configs:
        return
    depth, heads = (max(getattr(c, dim) for c in configs.values()) for dim in ("depth", "heads"))
    view = viewsync.current_view(PAGE, list(configs), dims_for=lambda n: (configs[n].grid, depth, heads))
    with st.sidebar:
        shown = widgets.checkpoints_pick(PAGE, list(configs))
        img, key, caption, is_upload = uploads.image_source(PAGE)
        layer, head = widgets.layer_head_controls(PAGE, depth, heads)
    viewsync.render_share(view, upload_active=is_upload)
    ckpts, shown, ref = loading.load_shown(view.ckpt, shown)
    if ref is None:
        return
    widgets.controls_hint(PAGE, layer, head)
    if not shown:
        st.info("No checkpoint picked: choose some under **Checkpoints to show** in the sidebar.")
    img, key, custom = uploads.fit_image(PAGE, img, key, ref, is_upload)
    left, right = st.columns([1, 2])
    with left:
        picker.patch_picker(PAGE, img, ref, view.patch, f"{caption} — click a patch", max_side=256)
        st.caption(f"Layer {layer}, {views.head_text(head)} for every checkpoint (clamped to a checkpoint's own "
                   "depth / heads where it has fewer; on another grid, the patch under the same point of the image).")
    rows = views.without_same_encoding([summary_row(n, ckpts[n], key, custom, layer, head) for n in shown])
    with right:
        st.subheader("Per checkpoint")
        table = pd.DataFrame(rows).set_index("checkpoint") if rows else pd.DataFrame()
        st.dataframe(table, key=f"{PAGE}_table", placeholder="—", on_select="ignore")
        st.caption(f"2D score: Spearman correlation of the table's similarity with closeness (learned tables); "
                   f"attn dist / entropy: mean distance in patches and entropy (nats) of the attention, layer {layer}.")
        if rows:
            st.download_button("Table (CSV)", data=table.to_csv().encode(), file_name="compare_encodings.csv",
                               mime="text/csv", key=f"{PAGE}_table_csv", on_click="ignore")
        resolution_table(PAGE, shown, ckpts)

    st.subheader(f"Positional component and attention row of patch r={view.patch[0]}, c={view.patch[1]}")
    for start in range(0, len(shown), COLUMNS):
        for col, name in zip(st.columns(COLUMNS), shown[start:start + COLUMNS]):
            with col:
                panel(name, ckpts[name], key, custom, view.patch, layer, head, ref.config.grid)
    colors = figures.checkpoint_colors(list(configs))   # one per listed checkpoint, whatever is shown
    position_panel.position_section(PAGE, shown, ckpts, layer, head, colors, view.patch, ref.config.grid)
    resolution_explorer(PAGE, shown, ckpts)
    training_curves(shown, ckpts, colors)


def training_curves(names, ckpts, colors) -> None:
    """Test top-1 and the table's 2D-structure score per epoch, every shown checkpoint on one chart each."""
    st.subheader("Training, epoch by epoch")
    accuracy = views.accuracy_runs({n: ckpts[n].metrics for n in names})
    structure = cache.structure_runs([n for n in names if "table" in views.position_hooks(ckpts[n].model)])
    left, right = st.columns(2)
    with left:
        if accuracy:
            chart(figures.runs_fig(accuracy, title="Test top-1 % after each epoch", x_title="epoch",
                                   y_title="top-1 %", colors=colors), "compare_test_top1", key=f"{PAGE}_curves")
        else:
            st.caption("No accuracy curves recorded for these checkpoints.")
    with right:
        if structure:
            chart(figures.runs_fig(structure, title="Table's 2D structure by epoch", colors=colors,
                                   x_title="epoch (0 = initialisation)", y_title="Spearman"),
                  "compare_structure", key=f"{PAGE}_structure_curves")
            st.caption("Learned tables only (a fixed sin-cos table does not change with training); the "
                       "similarity page shows the table of any recorded epoch.")
        else:
            st.caption("No recorded table history for these checkpoints.")


def summary_row(name, ckpt, key, img, layer, head) -> dict:
    if swin_view.is_swin(ckpt):          # attention inside windows; no table
        return swin_view.summary_row(name, ckpt, key, img, layer, head)
    _, layer, head = views.clamp_view(ckpt.config, (0, 0), layer, head)
    stats = cache.attention_stats(name, key, img)                  # name -> (L, h)
    test = ckpt.metrics.get("test") or {}
    sim = cache.similarity(name) if "table" in ckpt.model.pos_enc.hooks else None
    return {"checkpoint": name, "encoding": ckpt.config.encoding, "top-1 %": test.get("top1"),
            "top-5 %": test.get("top5"), "2D score": None if sim is None else round(sim["score"]["spearman"], 3),
            f"attn dist L{layer}": round(views.pick_stat(stats, "mean_distance", layer, head), 3),
            f"attn entropy L{layer}": round(views.pick_stat(stats, "entropy", layer, head), 3)}


def panel(name, ckpt, key, img, patch, layer, head, ref_grid) -> None:
    if swin_view.is_swin(ckpt):          # its offset table as its position-only kernel
        return swin_view.compare_panel(PAGE, name, ckpt, key, img, patch, layer, head, ref_grid)
    patch, layer, head = views.clamp_view(ckpt.config, patch, layer, head, ref_grid)
    enc = "" if ckpt.config.encoding == name else f" · `{ckpt.config.encoding}`"
    st.markdown(f"**{name}**{enc} · {views.hooks_text(ckpt.model.pos_enc.hooks)}")
    pv = views.panel_view(cache.trace(name, key, img), cache.positional(name, key, patch, img), patch, layer, head)
    scale, rng, cbar = figures.component_style(pv.label)
    fig = figures.pair_fig(pv.positional, pv.attention, titles=(pv.label, "attention row"),
                           colorbar_titles=(cbar, "attention"), colorscales=(scale, figures.ATTENTION_SCALE),
                           ranges=(rng, (0, None)), patch=patch,
                           title=f"{name}: layer {layer}, {views.head_text(head)}")
    base = f"{name}_compare_p{patch[0]}-{patch[1]}_l{layer}_{views.head_text(head)}"
    chart(fig, base, key=f"{PAGE}_fig_{name}")
    if pv.label == "none":
        st.caption("`none`: no position information at all (the model is permutation-equivariant over patches).")
    what = "no positional part (zeros)" if pv.label == "none" else pv.label + (", normalised 0–1" * pv.normalised)
    downloads(base + "_positional", pv.positional, key=f"{PAGE}_dl_{name}", full=pv.stacked, shown_what=what,
              full_what=f"{pv.label} + attention row")


main()
