"""Bias explorer: click a patch of an image and see the encoding's attention bias row for it
(SaPE² as in the paper's Figure 4: x part, y part, their sum; per head or averaged; per
layer; normalised to [0, 1]), the full model's attention row, and the prediction."""
from __future__ import annotations

import numpy as np
import streamlit as st

from vitpe_core import analysis, figures
from pages.common import cache, ui
from vitpe_core.gallery import gallery_label

PAGE = "bias"
PART_LABELS = {"sum": "x + y (the SaPE² bias)", "x": "x part (along the patch's row)",
               "y": "y part (along the patch's column)", "bias": "full bias"}


def readout_text(encoding_options: dict) -> str:
    if encoding_options.get("readout", "query") == "key":
        return ("**SaPE²(Q)** — read-out with the key, `readout=\"key\"` (90.17 % top-1 on CIFAR-10 "
                "with +APE in the paper).")
    return ("**SaPE²(K)** — read-out with the query, `readout=\"query\"`: the paper's best setting "
            "(93.98 % top-1 on CIFAR-10 with +APE). The paper's prose and code name the two variants "
            "the other way round; this app follows the table's names.")


def head_text(head: int | None) -> str:
    return "mean over heads" if head is None else f"head {head}"


def main() -> None:
    st.title("Bias explorer")
    names = cache.checkpoint_names()
    view = ui.current_view(PAGE, names)
    if not names:
        ui.no_checkpoints_info()
        ui.render_share(view)
        return
    with st.sidebar:
        ui.checkpoint_select(PAGE, names)
    ckpt = ui.load_checkpoint_or_error(view.ckpt)
    if ckpt is None:
        return
    cfg, grid = ckpt.config, ckpt.config.grid
    with st.sidebar:
        img, key, caption, is_upload = ui.image_source(PAGE)
        layer, head = ui.layer_head_controls(PAGE, cfg.depth, cfg.heads)
    ui.render_share(view, upload_active=is_upload)

    tr = cache.trace(view.ckpt, key, img if is_upload else None)
    display = figures.display_image(img, cfg.img_size)
    left, right = st.columns([2, 3])
    with left:
        st.caption(f"{caption} — click a patch (grid {grid[0]}×{grid[1]}, as the model sees the image)")
        ui.clickable(figures.grid_image(display, grid, view.patch), f"{PAGE}_click",
                     lambda x, y, w, h: figures.pixel_to_patch(x, y, w, h, grid))
        ui.patch_controls(PAGE, grid)
        ui.patch_text(view.patch, grid)
        show_prediction(ckpt, tr, key)
    maps = analysis.patch_maps(tr, view.patch)                      # name -> (L, h, H, W)
    with right:
        show_bias(ckpt, tr, maps, display, view, layer, head)
    show_attention(maps, display, view, layer, head, grid)


def show_prediction(ckpt, tr: analysis.Trace, key: str) -> None:
    names = cache.class_names(ckpt)
    probs = tr.probs
    top = int(np.argmax(probs))
    truth = gallery_label(key)
    st.markdown(f"Prediction: **{names[top]}** ({probs[top] * 100:.1f} %)"
                + (f" — true class: {truth}" if truth else ""))
    ui.chart(figures.topk_fig(probs, names), f"{ckpt.name}_top5", key=f"{PAGE}_top5")
    ui.downloads(f"{ckpt.name}_probabilities", probs[None], key=f"{PAGE}_probs_dl")


def show_bias(ckpt, tr, maps, display, view, layer, head) -> None:
    cfg, grid = ckpt.config, ckpt.config.grid
    if "bias" not in maps:
        st.info(f"`{cfg.encoding}` adds no attention bias (hooks: {', '.join(ckpt.model.pos_enc.hooks) or 'none'}). "
                "Its positional component is on the Compare page (table similarity or RoPE kernel); "
                "the attention row is below.")
        return
    sape = analysis.sape2_part_names(tr.parts)
    if sape is not None:
        st.markdown(readout_text(cfg.encoding_options))
        enc = ckpt.model.pos_enc
        other_bias = [p.name for p in getattr(enc, "parts", [enc]) if "bias" in p.hooks and p.name != "sape2"]
        options = ["sum", "x", "y"] + (["bias"] if other_bias else [])   # full = SaPE² + e.g. rpb
        part = st.radio("Bias component", options, key=f"{PAGE}_part", horizontal=True,
                        format_func=PART_LABELS.__getitem__)
        arrays = {"x": maps[sape[0]], "y": maps[sape[1]], "sum": maps[sape[0]] + maps[sape[1]], "bias": maps["bias"]}
        full = arrays[part]                                           # (L, h, H, W)
        if part == "bias":
            what = f"{cfg.encoding} full bias row"
        else:
            what = "SaPE² bias row" + ("" if part == "sum" else f", {PART_LABELS[part]}")
        scale_note = "0 = near, 1 = far"
    else:
        part, full = "row", maps["bias"]
        what, scale_note = f"{cfg.encoding} bias row", "normalised to [0, 1]"
    shown = analysis.normalize01(analysis.reduce_head(full[layer], head))    # (H, W)
    title = f"{what}, layer {layer}, {head_text(head)} ({scale_note})"
    base = f"{ckpt.name}_bias_{part}_p{view.patch[0]}-{view.patch[1]}_l{layer}_{head_text(head)}"
    tab_overlay, tab_map, tab_layers, tab_heads = st.tabs(["On the image", "Heatmap", "All layers", "All heads"])
    with tab_overlay:
        ui.chart(figures.overlay_fig(display, shown, grid, patch=view.patch, title=title,
                                     colorbar_title="bias<br>(0-1)"), base + "_overlay", key=f"{PAGE}_bias_overlay")
    with tab_map:
        ui.chart(figures.patch_map_fig(shown, title=title, colorbar_title="bias<br>(0-1)", patch=view.patch,
                                       zmin=0, zmax=1), base, key=f"{PAGE}_bias_map")
        ui.downloads(base, shown, key=f"{PAGE}_bias_dl", full=full)
    with tab_layers:
        per_layer = analysis.normalize01(np.stack([analysis.reduce_head(m, head) for m in full]))   # (L, H, W)
        ui.chart(figures.layers_fig(per_layer, title=f"{what}, every layer, {head_text(head)} ({scale_note})",
                                    colorbar_title="bias<br>(0-1)", patch=view.patch),
                 base + "_layers", key=f"{PAGE}_bias_layers")
    with tab_heads:
        per_head = analysis.normalize01(full[layer])                 # (h, H, W)
        ui.chart(figures.layers_fig(per_head, title=f"{what}, layer {layer}, every head ({scale_note})",
                                    colorbar_title="bias<br>(0-1)", patch=view.patch,
                                    labels=[f"head {i}" for i in range(per_head.shape[0])]),
                 base + "_heads", key=f"{PAGE}_bias_heads")


def show_attention(maps, display, view, layer, head, grid) -> None:
    st.subheader("Attention row of the full model")
    attn = analysis.reduce_head(maps["attn"][layer], head)                   # (H, W)
    title = f"Attention row, layer {layer}, {head_text(head)}"
    st.caption(f"Softmax weights from the query patch (r={view.patch[0]}, c={view.patch[1]}) to every patch "
               "(the CLS column is left out).")
    base = f"{view.ckpt}_attention_p{view.patch[0]}-{view.patch[1]}_l{layer}_{head_text(head)}"
    a, b = st.columns(2)
    with a:
        ui.chart(figures.overlay_fig(display, attn, grid, patch=view.patch, title=title, colorbar_title="attention",
                                     colorscale=figures.ATTENTION_SCALE, zmin=0, zmax=None),
                 base + "_overlay", key=f"{PAGE}_attn_overlay")
    with b:
        ui.chart(figures.patch_map_fig(attn, title=title, colorbar_title="attention", patch=view.patch,
                                       colorscale=figures.ATTENTION_SCALE, zmin=0),
                 base, key=f"{PAGE}_attn_map")
        ui.downloads(base, attn, key=f"{PAGE}_attn_dl", full=maps["attn"])


main()
