"""The compare page's "How is position encoded?" section: every shown checkpoint's
position-only kernel side by side with its relative score, and attention distance by depth
(vitpe_core.positional computes them; definitions: docs/encodings.md, the app's Definitions page)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from vitpe_core import figures, views
from vitpe_core.swin.explore import is_swin_model

from . import cache, definitions
from .output import chart

EXPLAIN = ("**Position-only kernel**: the part of the attention logit between a query and a key that depends on their "
           "positions alone, drawn over the offset (Δr, Δc) from the query (centre = the query itself; blue = attends "
           "less, red = more, each map on its own scale). A relative position bias *is* such a kernel; for RoPE it is "
           "the logit of the average query and key rotated to the two positions; for a table, layer 0's logit between "
           "two table rows with content at its average; for SaPE² and CoPE, the bias averaged over the 17 gallery "
           "images. **rel** is the relative score: the share of the kernel's variance that the offset alone explains "
           "(1 = purely relative, ~0 = it depends on where the query is).")


QUERY_EXPLAIN = ("**Per query patch**: the same kernel, read as the chosen query patch (outlined) sees it: its "
                 "position-only logit to every key on the image grid (blue = less, red = more, each map on its own "
                 "scale). Move the query to see where a kernel is *not* stationary: a purely relative kernel shows the "
                 "same pattern shifted with the query. **fit** is an R² for this map: the offset kernel fitted to all "
                 "queries at once (plus a constant per query, which softmax ignores), scored on this query alone as "
                 "1 − (its squared error here) ÷ (this map's variance about its mean). 1: the query sees the shared "
                 "pattern exactly (a relative kernel: 1 at every query); 0: the shared pattern does no better than a "
                 "flat map; below 0 (no lower bound, not clipped): worse than a flat map, this query sees a pattern "
                 "of its own.")


def position_section(page: str, names: list[str], ckpts: dict, layer: int, head: int | None,
                     colors: dict[str, str], patch: tuple[int, int] | None = None,
                     ref_grid: tuple[int, int] | None = None) -> None:
    st.subheader("How is position encoded?")
    st.markdown(EXPLAIN)
    definitions.link("Definitions: how each kernel and score is computed")
    swin = [n for n in names if is_swin_model(ckpts[n])]
    if swin:
        st.caption(f"Not analysed here: {', '.join(swin)} (Swin: attention inside windows, the grid merged at every "
                   "stage; its position-only kernel is the bias per offset drawn in its panel above).")
        names = [n for n in names if n not in swin]
    results, bar = {}, st.progress(0.0, text="Position analysis…")
    for i, name in enumerate(names):
        bar.progress(i / max(1, len(names)), text=f"Position analysis: {name} ({i + 1} of {len(names)})")
        try:
            results[name] = cache.position_analysis(name)
        except (ValueError, OSError) as e:
            st.error(f"{name}: the position analysis failed: {e}")
    bar.empty()
    if not results:
        return
    kernels, scores = {}, {}
    for name, arr in results.items():
        pv = views.kernel_view(arr, layer, head)
        if pv is not None:
            kernels[name], scores[name] = pv
    if kernels:
        head_txt = "mean of heads" if head is None else f"head {head}"
        title = f"Position-only kernels<br>layer {layer}, {head_txt}<br>(tables: layer 0)"
        chart(figures.kernels_fig(kernels, scores, title=title), "position_kernels", key=f"{page}_kernels")
    full_names(list(results))
    if patch is not None:
        query_kernels(page, results, ckpts, layer, head, patch, ref_grid)
    table = pd.DataFrame({n: views.relative_scores_by_layer(a) for n, a in results.items()}).T
    st.markdown("**Relative score per layer** (mean over heads; tables are defined at layer 0 only)")
    st.dataframe(table.round(3), key=f"{page}_relative", placeholder="—")
    dist = {n: a["mean_distance"] for n, a in results.items()}
    chart(figures.distance_by_depth_fig(dist, title="Mean attention distance by depth<br>dots: heads, line: their mean",
                                        colors=colors), "attention_distance", key=f"{page}_distance")
    st.caption("As in the ViT paper's Figure 7 (right): how far, in patches, each head looks on average, on the same "
               "17 images. Heads that stay local in early layers and widen with depth are the usual pattern.")


def full_names(names: list[str]) -> None:
    """The full name of each checkpoint whose kernel panels shorten it (`figures.panel_title`: a
    title as wide as its tile; the hover shows the full name too)."""
    shortened = [n for n in names if figures.short_name(n) != n]
    if shortened:
        st.caption("Shortened in the panel titles: " + "; ".join(f"`{figures.short_name(n)}` = `{n}`"
                                                                 for n in shortened))


def query_kernels(page: str, results: dict, ckpts: dict, layer: int, head: int | None, patch: tuple[int, int],
                  ref_grid: tuple[int, int] | None) -> None:
    """Every checkpoint's kernel row of the query patch (the patch under the same point of the
    image on another grid), side by side on the image grid, with its offset fit."""
    maps, patches, fits = {}, {}, {}
    for name, arrays in results.items():
        cfg = ckpts[name].config
        p, _, _ = views.clamp_view(cfg, patch, layer, head, ref_grid)
        qv = views.query_kernel_view(arrays, layer, head, p, cfg.grid)
        if qv is not None:
            (maps[name], fits[name]), patches[name] = qv, p
    if not maps:
        return
    head_txt = "mean of heads" if head is None else f"head {head}"
    chart(figures.query_kernels_fig(maps, patches, fits, title=f"Per query: patch ({patch[0]}, {patch[1]}) to "
                                    f"every key<br>layer {layer}, {head_txt}<br>(tables: layer 0)"),
          f"position_kernels_query_p{patch[0]}-{patch[1]}", key=f"{page}_query_kernels")
    st.markdown(QUERY_EXPLAIN)
