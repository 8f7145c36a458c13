"""The bias explorer's attention rollout and live stress tests (shift and resize the input; the
chosen patch follows its content): Streamlit glue around `vitpe_core.positional.rollout_map`
and `vitpe_core.stress`, which compute everything shown.

* Rollout reuses the page's cached trace (it holds every layer's attention): no extra pass.
* The stress test runs one forward pass of the changed input, cached per (checkpoint, image,
  size, shift, fill); with no shift at the native size it computes nothing, and the page is
  as it was without it.
* The controls' keys carry the model's input geometry, so a checkpoint with another patch or
  input size starts from its own "no change" instead of an option it does not have.
* The controls are bound to the view (`shift`, `size`, `fill`, `rollout`, `fusion` in
  session_state and the share link, see `viewsync` and `viewstate`): a link reopens the same stress
  view and rollout.
* Each section is an expander that runs only while open (`section`): closed on a first visit, so
  that the first page sends and draws only its core (BENCHMARKS.md section 4). Which are open is
  part of the view (`open`, in the share link); a link from before it opens a section whose
  settings it moves off their defaults.
"""
from __future__ import annotations

import streamlit as st
from PIL import Image

from vitpe_core import analysis, figures, positional, stress, views
from vitpe_core.gallery import gallery_image
from vitpe_core.inputs import checkpoint_input
from vitpe_core.viewstate import SECTIONS

from . import cache
from .output import chart
from .widgets import bound, show_in_widget

FUSIONS = ("mean", "max")

ROLLOUT_TEXT = ("**Attention rollout** (Abnar & Zuidema 2020): multiply every layer's attention, heads fused by "
                "their mean or max, with the residual connection as ½·A + ½·I, to see how much each input patch "
                "flows into one token's output through the whole network (not one layer, as above).")
STRESS_TEXT = ("Shift the image (whole patches or fractions of one; the edge is filled with the mean colour or a "
               "mirror image) or feed it at another size: the model runs on the changed input, the chosen patch "
               "**follows its content**, and the maps are compared with the original maps moved the same way. "
               "An encoding whose maps move with the content (translation equivariance) shows a white "
               "difference and an error of 0.")
ERROR_HELP = ("The README's *bias shift err*: Σ over layers of mean |b′ − b moved| ÷ Σ of mean |b moved|, over every "
              "head and every pair of patches whose content stayed in the image (b: the bias between patches before, "
              "b′ after; 0 = the bias moved exactly with the content). For whole-patch shifts this is the number "
              "`python -m vitpe_core evaluate --translation` averages over 64 test images; sub-patch shifts and "
              "resizes are compared by the nearest patch centre, so even a perfect map scores above 0 there.")


def section(page: str, what: str, label: str, icon: str):
    """The expander of section `what` (key `<page>_<what>_open`; `.open`: whether to compute it),
    bound to the view's `open` (`widgets.bound`): open where it names `what` (a link:
    `open=rollout,stress`; older links' settings, `viewstate.implied_sections`), and opening or
    closing it writes the view before the rerun, so that the address bar and the share link carry
    it. (Not through `expanded=`: a keyed expander whose `expanded` changes is a new widget, which
    closed the section under the visitor's hands.)"""
    def with_it(is_open: bool) -> tuple[str, ...]:
        now = set(st.session_state["open"]) - {what} | ({what} if is_open else set())
        return tuple(s for s in SECTIONS if s in now)

    return bound(st.expander, f"{page}_{what}_open", "open", to_widget=lambda sections: what in sections,
                 from_widget=with_it, label=label, icon=icon)


# ----------------------------------------------------------------------------- rollout
@cache.budgeted("rollouts", max_items=16)
def _rollout(ref: cache.ModelRef, key: str, fusion: str, _tr: analysis.Trace):
    return positional.rollout(_tr.attn, fusion)                                   # (T, T)


def rollout(name: str, key: str, fusion: str, tr: analysis.Trace):
    """`positional.rollout` `(T, T)` of the page's trace of image `key`, cached (a 224-px ViT's
    takes a tenth of a second)."""
    return _rollout(cache.model_ref(name), key, fusion, tr)


def rollout_section(page: str, ckpt, tr: analysis.Trace, name: str, key: str, display, patch: tuple[int, int]
                    ) -> None:
    box = section(page, "rollout", "Attention rollout", icon=":material/account_tree:")
    if box.open:
        with box:
            _rollout_body(page, ckpt, tr, name, key, display, patch)


def _rollout_body(page: str, ckpt, tr: analysis.Trace, name: str, key: str, display, patch: tuple[int, int]) -> None:
    grid = tr.grid
    st.markdown(ROLLOUT_TEXT)
    sources = positional.rollout_sources(tr.num_prefix, tr.prefix)
    a, b = st.columns(2)
    with a:
        src = bound(st.radio, f"{page}_rollout_of_{tr.num_prefix}", "rollout", label="Rollout of", options=sources,
                    horizontal=True,
                    format_func=lambda s: f"the query patch ({patch[0]}, {patch[1]})" if s == "patch" else s)
    with b:
        fusion = bound(st.radio, f"{page}_rollout_fusion", "fusion", label="Head fusion", options=FUSIONS,
                       horizontal=True)
    token = tr.num_prefix + analysis.patch_index(patch, grid) if src == "patch" else sources.index(src) - 1
    m, prefix_share = positional.rollout_row(rollout(name, key, fusion, tr), grid, tr.num_prefix, token)
    what = f"patch ({patch[0]}, {patch[1]})" if src == "patch" else src
    st.caption(f"How much of {what}'s output comes from each input patch" +
               (f"; {100 * prefix_share:.1f} % comes from the prefix tokens, not drawn." if tr.num_prefix else "."))
    title = f"Rollout of {what}, heads fused by {fusion}, through {len(tr.attn)} layers"
    chart(figures.overlay_fig(display, m, grid, patch=patch if src == "patch" else None, title=title,
                              colorbar_title="rollout", colorscale=figures.ATTENTION_SCALE, zmin=0, zmax=None),
          f"{ckpt.name}_rollout_{src.replace(' ', '')}_{fusion}", key=f"{page}_rollout")


# ----------------------------------------------------------------------------- stress test
@cache.budgeted("stress traces", max_items=8, spinner="Running the model on the changed input…")
def _transformed(ref: cache.ModelRef, key: str, size: tuple[int, int], shift: tuple[int, int], fill: str,
                 _img: Image.Image | None) -> tuple[analysis.Trace, object]:
    ckpt = cache.load_model(ref)
    x = checkpoint_input(_img if _img is not None else gallery_image(key), ckpt)
    x = stress.transform_input(x, stress.Transform(size, shift, fill))
    with cache.traced_room(ckpt.model, x):
        return analysis.trace_image(ckpt.model, x, compact=True), stress.input_rgb(x, *stress.input_norm(ckpt))


def transformed(name: str, key: str, tf: stress.Transform, img: Image.Image | None = None):
    """(trace, `(H, W, 3)` uint8 input as the model sees it) of image `key` changed by `tf`."""
    return _transformed(cache.model_ref(name), key, tuple(tf.size), tuple(tf.shift), tf.fill, img)


def transform_controls(page: str, cfg) -> stress.Transform:
    p, native = cfg.patch_size, tuple(cfg.img_size)
    shifts, sizes = stress.shift_options(p), stress.size_options(native, p)
    geo = f"{native[0]}x{native[1]}p{p}"
    shift_text = lambda v: stress.shift_label(v, p)
    ss = st.session_state

    def shifted(axis: int, key: str) -> None:            # one widget per axis, one (dy, dx) in the view
        d = list(ss["shift"])
        d[axis] = int(ss[key])
        ss["shift"] = (d[0], d[1])

    cols = st.columns([3, 3, 3, 2])
    for axis, col, label in ((1, cols[0], "Shift right (−: left)"), (0, cols[1], "Shift down (−: up)")):
        key = f"{page}_shift_{'yx'[axis]}_{geo}"
        show_in_widget(key, ss["shift"][axis])
        with col:
            st.select_slider(label, shifts, format_func=shift_text, key=key, on_change=shifted, args=(axis, key))
    by_height = {s[0]: s for s in sizes}              # one size per height (a select_slider reads a tuple as a range)
    with cols[2]:
        height = bound(st.select_slider, f"{page}_size_{geo}", "size", label="Input size", options=list(by_height),
                       to_widget=lambda h: native[0] if h is None else h,
                       from_widget=lambda h: None if h == native[0] else int(h),
                       format_func=lambda h: f"{by_height[h][1]}×{h} px" + (" (native)" * (h == native[0])))
    with cols[3]:
        fill = bound(st.radio, f"{page}_fill", "fill", label="Fill", options=stress.FILLS, horizontal=True,
                     help="What enters at the edge: zero (the mean colour after normalisation, as the "
                          "README's shift test) or a mirror image of the edge.")
    return stress.Transform(by_height[height], tuple(ss["shift"]), fill)


def stress_section(page: str, ckpt, tr: analysis.Trace, name: str, key: str, custom, patch: tuple[int, int],
                   layer: int, head: int | None) -> None:
    box = section(page, "stress", "Stress test: shift and resize", icon=":material/open_with:")
    if box.open:
        with box:
            _stress_body(page, ckpt, tr, name, key, custom, patch, layer, head)


def _stress_body(page: str, ckpt, tr: analysis.Trace, name: str, key: str, custom, patch: tuple[int, int],
                 layer: int, head: int | None) -> None:
    cfg = ckpt.config
    st.markdown(STRESS_TEXT)
    tf = transform_controls(page, cfg)
    if tf.is_identity(tuple(cfg.img_size)):
        st.caption("Move a control to run the model on a shifted or resized copy of the image.")
        return
    after, rgb = transformed(name, key, tf, custom)
    parts = views.bias_parts(tr)
    part = st.session_state.get(f"{page}_part") if len(parts) > 1 else None
    part = part if part in parts else (parts[0] if parts else None)
    sv = stress.stress_view(tr, after, tf, tuple(cfg.img_size), cfg.patch_size, patch, layer, head, part)
    names = cache.class_names(ckpt)
    top, p = views.top_class(after)
    before_top = views.top_class(tr)[0]
    moved = f"patch ({patch[0]}, {patch[1]}) → ({sv.patch[0]}, {sv.patch[1]})"
    prediction = (f". Prediction: **{names[top]}** ({p * 100:.1f} %), " + ("the same as before." if sv.same_prediction
                  else f"**changed** from {names[before_top]}.")) if names else " (a backbone: no prediction)."
    st.markdown(f"Grid {sv.grid[0]}×{sv.grid[1]}; the chosen {moved} follows its content" +
                ("" if sv.inside else " (its centre left the image: the nearest edge patch is shown)") + prediction)
    m = st.columns(3)
    if sv.bias_error is not None:
        m[0].metric("Bias shift error (all layers and heads)", f"{sv.bias_error:.3f}", help=ERROR_HELP)
        m[1].metric("This bias map", f"{sv.bias.error:.3f}", help="The same ratio for the map drawn below: "
                    "mean |after − moved| ÷ mean |moved| over the cells whose content stayed in the image.")
    m[2].metric("This attention row", f"{sv.attention.error:.3f}", help="mean |after − moved| ÷ mean |moved| of the "
                "attention row drawn below (attention mixes content in, so it need not move exactly).")
    display = figures.display_image(Image.fromarray(rgb), tuple(tf.size), max_side=max(320, 20 * max(sv.grid)))
    where = f"layer {layer}, {views.head_text(head)}"
    base = f"{ckpt.name}_stress_{tf.size[0]}px_s{tf.shift[0]}_{tf.shift[1]}_{tf.fill}_l{layer}_{views.head_text(head)}"
    a, b = st.columns(2)
    if sv.bias is not None:
        with a:
            chart(figures.overlay_fig(display, sv.bias_shown, sv.grid, patch=sv.patch, title=f"Bias after the "
                                      f"change<br>{where}", colorbar_title="bias<br>(0-1)"),
                  base + "_bias", key=f"{page}_stress_bias")
    with b:
        chart(figures.overlay_fig(display, sv.attention.new, sv.grid, patch=sv.patch, colorbar_title="attention",
                                  title=f"Attention after the change<br>{where}", colorscale=figures.ATTENTION_SCALE,
                                  zmin=0, zmax=None), base + "_attn", key=f"{page}_stress_attn")
    st.caption("Below, raw values on the new grid: the original map moved with the content, the map after the "
               "change, and their difference (white: moved exactly; grey: content that came from outside the image, "
               "not compared).")
    shown = [("bias", "Bias map", sv.bias, figures.BIAS_SCALE, "bias"),
             ("attn", "Attention row", sv.attention, figures.ATTENTION_SCALE, "attention")]
    for short, label, ms, scale, unit in shown:
        if ms is not None:
            chart(figures.shift_diff_fig(ms.expected, ms.new, ms.diff, patch=sv.patch, colorscale=scale,
                                         colorbar_title=unit, title=f"{label}, {where}: did it move with the "
                                         f"content? (error {ms.error:.3f})"),
                  f"{base}_{short}_diff", key=f"{page}_stress_{short}_diff")
