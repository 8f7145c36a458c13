"""Bias explorer: click a patch of an image and see the encoding's attention bias row for it (SaPE² as in the paper's
Figure 4: x part, y part, their sum; per head or averaged; per layer; normalised to [0, 1]), the full model's
attention row, the prediction, attention rollout, a live stress test (shift, resize; the patch follows its content).
A Swin's window bias and attention: pages/common/swin_view.py."""
from __future__ import annotations

import streamlit as st

from vitpe_core import analysis, figures, views
from pages.common import cache, explain, loading, messages, picker, stress_panel, swin_view, uploads
from pages.common import viewsync, widgets
from pages.common.output import chart, downloads
from vitpe_core.views import head_text

PAGE = "bias"


def main() -> None:
    explain.render(PAGE)
    names = cache.checkpoint_names()
    view = viewsync.current_view(PAGE, names)
    if not names:
        messages.no_checkpoints_info()
        viewsync.render_share(view)
        return
    with st.sidebar:
        widgets.checkpoint_select(PAGE, names)
    ckpt = loading.header_or_error(view.ckpt)   # its model is loaded where a view needs it: not for a stored trace
    if ckpt is None:
        return
    cfg, grid = ckpt.config, ckpt.config.grid
    with st.sidebar:
        img, key, caption, is_upload = uploads.image_source(PAGE)
        layer, head = widgets.layer_head_controls(PAGE, cfg.depth, cfg.heads)
    viewsync.render_share(view, upload_active=is_upload)
    widgets.controls_hint(PAGE, layer, head)
    img, key, custom = uploads.fit_image(PAGE, img, key, ckpt, is_upload)
    if swin_view.is_swin(cfg):          # windows, patch merging: pages/common/swin_view.py
        return swin_view.bias_explorer(PAGE, cache.get_checkpoint(view.ckpt), view, (img, key, caption, custom), layer,
                                       head)
    tr = loading.trace_or_error(view.ckpt, key, custom)
    if tr is None:
        return
    left, right = st.columns([2, 3])
    with left:
        display = picker.image_column(PAGE, ckpt, view, (img, key, caption), tr)
    maps = analysis.patch_maps(tr, view.patch)                      # name -> (L, h, H, W)
    with right:            # a model without a bias shows its attention row here, not empty space
        if not (has_bias := show_bias(ckpt, tr, maps, display, view, layer, head)):
            show_attention(tr, maps, display, view, layer, head, grid)
    if has_bias:
        show_attention(tr, maps, display, view, layer, head, grid)
    stress_panel.rollout_section(PAGE, ckpt, tr, view.ckpt, key, display, view.patch)
    stress_panel.stress_section(PAGE, ckpt, tr, view.ckpt, key, custom, view.patch, layer, head)


def show_bias(ckpt, tr, maps, display, view, layer, head) -> bool:
    cfg, grid = ckpt.config, ckpt.config.grid
    parts = views.bias_parts(tr)
    if not parts:
        st.info(f"`{cfg.encoding}` adds no attention bias (it {views.hooks_text(tr.hooks)}): "
                "there is no bias row to show. Its positional component is on the Compare page (table similarity "
                "or RoPE kernel); here is the full model's attention row from the chosen patch instead.")
        return False
    if parts != ["row"]:
        st.markdown(views.readout_text(cfg.encoding_options))
    part = parts[0] if len(parts) == 1 else st.radio("Bias component", parts, key=f"{PAGE}_part", horizontal=True,
                                                     format_func=views.PART_LABELS.__getitem__)
    bv = views.bias_view(tr, maps, cfg.encoding, layer, head, part)
    short, title = views.bias_short(bv), f"{views.bias_short(bv)}, layer {layer}, {head_text(head)}"
    st.caption(views.bias_caption(bv))
    base = f"{ckpt.name}_bias_{bv.part}_p{view.patch[0]}-{view.patch[1]}_l{layer}_{head_text(head)}"
    cbar = "bias<br>(0-1)"
    # Only the open tab runs (on_change="rerun"): a click rebuilds one figure here, not four.
    tabs = st.tabs(["On the image", "Heatmap", "All layers", "All heads"], key=f"{PAGE}_bias_tab", on_change="rerun")
    with tabs[0]:
        if tabs[0].open:
            chart(figures.overlay_fig(display, bv.shown, grid, patch=view.patch, title=title, colorbar_title=cbar),
                  base + "_overlay", key=f"{PAGE}_bias_overlay")
    with tabs[1]:
        if tabs[1].open:
            chart(figures.patch_map_fig(bv.shown, title=title, colorbar_title=cbar, patch=view.patch, zmin=0,
                                        zmax=1), base, key=f"{PAGE}_bias_map")
    with tabs[2]:
        if tabs[2].open:
            chart(figures.layers_fig(bv.per_layer, title=f"{short}, every layer, {head_text(head)}",
                                     colorbar_title=cbar, patch=view.patch), base + "_layers",
                  key=f"{PAGE}_bias_layers")
    with tabs[3]:
        if tabs[3].open:
            chart(figures.layers_fig(bv.per_head, title=f"{short}, layer {layer}, every head", colorbar_title=cbar,
                                     patch=view.patch, labels=[f"head {i}" for i in range(bv.per_head.shape[0])]),
                  base + "_heads", key=f"{PAGE}_bias_heads")
    # under every tab (the caption above promises the raw values in the NPY)
    downloads(base, bv.shown, key=f"{PAGE}_bias_dl", full=bv.full, shown_what="shown map, normalised 0–1",
              full_what="raw bias, all layers × heads")
    return True


def show_attention(tr, maps, display, view, layer, head, grid) -> None:
    st.subheader("Attention row of the full model")
    attn = views.attention_view(maps, layer, head)                           # (H, W)
    title = f"Attention, layer {layer}, {head_text(head)}"
    shares = views.prefix_share(tr, view.patch, layer, head)
    prefix = ", ".join(f"{k} {100 * v:.0f} %" for k, v in shares.items())
    st.caption(f"Softmax weights from the query patch (r={view.patch[0]}, c={view.patch[1]}) to every patch; the "
               f"prefix tokens are left out of the map" + (f" (attention to them: {prefix})." if prefix else "."))
    base = f"{view.ckpt}_attention_p{view.patch[0]}-{view.patch[1]}_l{layer}_{head_text(head)}"
    # As the bias above: only the open tab runs, and the first page draws one chart here, not two.
    tabs = st.tabs(["On the image", "Heatmap"], key=f"{PAGE}_attn_tab", on_change="rerun")
    with tabs[0]:
        if tabs[0].open:
            chart(figures.overlay_fig(display, attn, grid, patch=view.patch, title=title, colorbar_title="attention",
                                      colorscale=figures.ATTENTION_SCALE, zmin=0, zmax=None),
                  base + "_overlay", key=f"{PAGE}_attn_overlay")
    with tabs[1]:
        if tabs[1].open:
            chart(figures.patch_map_fig(attn, title=title, colorbar_title="attention", patch=view.patch,
                                        colorscale=figures.ATTENTION_SCALE, zmin=0),
                  base, key=f"{PAGE}_attn_map")
    downloads(base, attn, key=f"{PAGE}_attn_dl", full=maps["attn"], shown_what="shown attention row",
              full_what="attention rows, all layers × heads")

main()
