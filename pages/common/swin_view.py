"""The pages for a Swin / Swin-V2 model (`vitpe_core.swin`): Streamlit glue around
`swin.windows.window_rows` and `swin.explore`, which compute everything shown.

* `bias_explorer`: the bias page's body for a Swin. The patch picker on the first stage's
  patch grid; the layer slider runs over every block of every stage (`SwinConfig.block_of`);
  the head is one of that stage's. The clicked patch's learned bias row (Swin: its relative
  position bias table, looked up; Swin-V2: `16·sigmoid(CPB)`) and attention row over its
  window, drawn over the image with the block's window grid and shift; the offset table; the
  prediction. Rollout and the stress test are skipped with a line saying why.
* `compare_panel`, `summary_row`: a Swin on the compare page: its offset bias as its
  position-only kernel beside the window's attention row, and its table row.
* `no_table_note`: what the similarity page says of a Swin (no absolute table).
"""
from __future__ import annotations

import streamlit as st

from vitpe_core import figures, views
from vitpe_core.swin import explore
from vitpe_core.swin.windows import WindowRows, window_rows

from . import cache, picker
from .output import chart, downloads

is_swin = explore.is_swin_model


def rows_of(name: str, ckpt, key: str, img, patch: tuple[int, int], layer: int) -> WindowRows:
    """`window_rows` of the cached trace of image `key` (no forward pass when it is cached)."""
    return window_rows(ckpt.model, None, tuple(patch), layer, trace=cache.swin_trace(name, key, img).blocks)


def window_fig(rows: WindowRows, m, title: str, unit: str, image_rgb=None, **style):
    return figures.window_map_fig(m, row_lines=rows.row_lines, col_lines=rows.col_lines, box=rows.window_box,
                                  patch=rows.token, image_rgb=image_rgb, title=title, colorbar_title=unit, **style)


def bias_explorer(page: str, ckpt, view, image: tuple, layer: int, head: int | None) -> None:
    """The bias page for a Swin: `image` is the page's `(img, key, caption, custom)`."""
    img, key, caption, custom = image
    cfg, (r, c) = ckpt.config, view.patch
    tr = cache.swin_trace(view.ckpt, key, custom)
    rows = window_rows(ckpt.model, None, (r, c), layer, trace=tr.blocks)
    head, note = explore.stage_head(cfg, layer, head)
    left, right = st.columns([2, 3])
    with left:
        display = picker.image_column(page, ckpt, view, (img, key, caption), tr)
    shown_img = explore.pad_display(display, rows, cfg.img_size, cfg.patch_size)
    where = f"{explore.block_text(rows)}, {views.head_text(head)}"
    base = f"{ckpt.name}_window_p{r}-{c}_l{layer}_{views.head_text(head)}"
    with right:
        st.subheader("Bias row in the patch's window")
        st.caption(explore.window_caption(rows, view.patch) + note)
        bias = rows.shown("bias", head)                                         # (Hs, Ws), NaN outside
        chart(window_fig(rows, bias, f"{rows.what}<br>{where}", "bias", shown_img), base + "_bias",
              key=f"{page}_swin_bias")
        downloads(base + "_bias", bias, key=f"{page}_swin_bias_dl", full=rows.bias,
                  shown_what="bias row on the stage grid (NaN outside the window)",
                  full_what="bias row, every head of the stage")
    st.subheader("Attention row of the full model, inside the window")
    a, b = st.columns(2)
    with a:
        attn = rows.shown("attn", head)
        chart(window_fig(rows, attn, f"Attention<br>{where}", "attention", shown_img,
                         colorscale=figures.ATTENTION_SCALE, zmin=0), base + "_attn", key=f"{page}_swin_attn")
        outside = float(rows.outside.mean() if head is None else rows.outside[head])
        st.caption("Softmax weights from the patch's token to the tokens of its window"
                   + (f"; {100 * outside:.1f} % goes to padding tokens, off the image." if outside > 5e-4 else "."))
    with b:
        offsets(page, ckpt.name, rows, cfg.version, head, base)
    st.caption(explore.SKIPPED)


def offsets(page: str, name: str, rows: WindowRows, version: int, head: int | None, base: str) -> None:
    """The block's bias per offset: its position-only kernel (the same for every patch and image)."""
    kernel = explore.offset_bias(rows, version, head)
    title = f"Bias per offset<br>block {rows.layer}, {views.head_text(head)}"
    chart(figures.kernels_fig({name: kernel}, {name: None}, title=title),
          base + "_offsets", key=f"{page}_swin_offsets_{name}")
    st.caption(f"The bias at each offset query − key inside a {rows.window}×{rows.window} window (centre: the query "
               "itself; each map on its own colour scale): Swin's position-only kernel, all of it, since a patch "
               "attends only inside its window.")
    downloads(base + "_offsets", kernel, key=f"{page}_swin_offsets_dl_{name}", shown_what="bias per offset")


def compare_panel(page: str, name: str, ckpt, key: str, img, patch, layer: int, head, ref_grid) -> None:
    """A Swin's panel on the compare page: its offset bias (position-only kernel) and the chosen
    patch's attention row over its window, at the page's block and head (clamped to the model)."""
    patch, layer, head = views.clamp_view(ckpt.config, patch, layer, head, ref_grid)
    head, note = explore.stage_head(ckpt.config, layer, head)
    rows = rows_of(name, ckpt, key, img, patch, layer)
    where = f"{explore.block_text(rows)}, {views.head_text(head)}"
    st.markdown(f"**{name}** · `{ckpt.config.encoding}` · biases attention inside {rows.window}×{rows.window} "
                "windows")
    base = f"{name}_compare_p{patch[0]}-{patch[1]}_l{layer}_{views.head_text(head)}"
    offsets(page, name, rows, ckpt.config.version, head, base)
    chart(window_fig(rows, rows.shown("attn", head), f"{name}: attention<br>{where}", "attention",
                     colorscale=figures.ATTENTION_SCALE, zmin=0), base + "_attn", key=f"{page}_fig_{name}")
    st.caption(f"Patch ({patch[0]}, {patch[1]})'s attention on the stage's token grid, blank outside its window."
               + note)


def summary_row(name: str, ckpt, key: str, img, layer: int, head) -> dict:
    """A Swin's row of the compare table: the ViT's columns, its attention measured in windows."""
    _, layer, head = views.clamp_view(ckpt.config, (0, 0), layer, head)
    head, _ = explore.stage_head(ckpt.config, layer, head)
    stats = explore.window_attention_stats(cache.swin_trace(name, key, img), layer, head)
    test = ckpt.metrics.get("test") or {}
    return {"checkpoint": name, "encoding": ckpt.config.encoding, "top-1 %": test.get("top1"),
            "top-5 %": test.get("top5"), "2D score": None,
            f"attn dist L{layer}": round(stats["mean_distance"], 3),
            f"attn entropy L{layer}": round(stats["entropy"], 3)}


def no_table_note(name: str, ckpt) -> str:
    """What the similarity page adds when checkpoint `name` is a Swin (it has no absolute
    position table); "" otherwise (the page already says a ViT has none)."""
    return f" `{name}`: {explore.no_table_text(ckpt.config)}." if ckpt is not None and is_swin(ckpt) else ""
