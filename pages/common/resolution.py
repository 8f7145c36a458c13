"""The compare page's answers about other input sizes: the "Top-1 % at other input resolutions"
table (what `python -m vitpe_core evaluate --sizes ... --record` stored in each checkpoint's
metrics) and the resolution explorer (`vitpe_core.resolution`: one model swept over input sizes)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from vitpe_core import figures, resolution, views
from vitpe_core.swin.explore import is_swin_model
from pages.common import cache
from pages.common.output import chart

EXPLAIN = ("What another input size does to the model, with its own run-time resampling of its position "
           "parameters (the table resampled, the bias resized, the rotation angles at the new grid), on the "
           "gallery images resized: whether its top-1 stays the native size's, how close its pooled features "
           "stay, how well the resampled table keeps its 2D structure, how much of its position-only kernel is "
           "an offset-only kernel, and how far it attends by depth. Square sizes are joined by lines, the "
           "rectangular one is a hollow marker.")


RULE_LABELS = {"model": "as its own library", "timm": "as timm", "transformers": "as transformers"}
RULE_HELP = ("At another size a learned table is resampled: timm bicubic and antialiased, transformers (and "
             "RoPE-ViT's original code) bicubic without antialiasing; BEiT's relative tables by BEiT's geometric "
             "rule in timm (and BEiT's own code), bilinearly in transformers. The model's own library is what it "
             "was imported from (a shipped model: timm's).")


def resolution_table(page: str, names, ckpts) -> None:
    rows = views.resolution_rows({n: ckpts[n].metrics for n in names})
    st.markdown("**Top-1 % at other input resolutions**")
    if rows:
        st.dataframe(pd.DataFrame.from_dict(rows, orient="index"), key=f"{page}_resolution", placeholder="—")
    else:
        st.caption("Not measured for these checkpoints: run `python -m vitpe_core evaluate "
                   "checkpoints/NAME.safetensors --sizes 24,32,40,48 --record`.")


def resolution_explorer(page: str, names, ckpts) -> None:
    """Pick one shown checkpoint and its sizes (0.5x-2x native, one rectangular), sweep on request
    (with a progress bar; cached in the memory budget), then the chart, the distance by depth and the table."""
    st.subheader("At other input sizes: when does the model lose its sense of position?")
    st.markdown(EXPLAIN)
    if not names:
        return
    cols = st.columns([1, 3])
    name = cols[0].selectbox("Model", names, key=f"{page}_res_model")
    if is_swin_model(ckpts[name]):
        st.caption(f"`{name}` is a Swin: it attends inside windows (fixed when it was built, as transformers "
                   "keeps them) and has no table nor one position kernel, so only its top-1 and features are "
                   "compared across sizes.")
    cfg = ckpts[name].config
    options = {f"{h}×{w}": (h, w) for h, w in resolution.default_sizes(cfg.img_size, cfg.patch_size)}
    picked = cols[1].multiselect("Input sizes (px)", list(options), default=list(options),
                                 key=f"{page}_res_sizes_{name}")
    sizes = tuple(options[p] for p in picked)
    rules = resolution.rules_for(ckpts[name].model)
    rule = "model"
    if len(rules) > 1:   # libraries resample its table differently at another size: each by name
        rule = st.radio("Its tables at other sizes, resampled", rules, key=f"{page}_res_rule_{name}", horizontal=True,
                        format_func=RULE_LABELS.get, help=RULE_HELP)
    asked = st.session_state.setdefault(f"{page}_res_asked", set())
    if st.button("Sweep these sizes", key=f"{page}_res_go", type="primary"):
        asked.add((name, sizes, rule))
    if (name, sizes, rule) not in asked and not resolution_cached(name, sizes, rule):
        st.caption(f"{len(sizes)} sizes, each a traced pass over the gallery images: press **Sweep these sizes**.")
        return
    bar = st.progress(0.0, text="Sweeping input sizes…")
    rows = resolution_sweep(name, sizes, lambda i, n, s: bar.progress(
        i / n, text=f"Sweeping input sizes: {s[0]}×{s[1]} px ({i + 1} of {n})"), rule)
    bar.empty()
    below, above = resolution.lost_at(rows)
    st.markdown(_verdict(rows, below, above))
    how = "" if rule == "model" else f", tables resampled {RULE_LABELS[rule]}"
    chart(figures.resolution_fig(rows, title=f"{name} at other input sizes{how}"), f"{name}_resolution",
          key=f"{page}_res_chart")
    if rows[0].distance:
        chart(figures.distance_by_size_fig(rows, title=f"{name}: attention distance by depth, per input size"),
              f"{name}_resolution_distance", key=f"{page}_res_distance")
    table = pd.DataFrame(resolution.rows_json(rows))
    table["size"] = [r.label for r in rows]
    table["grid"] = [f"{r.grid[0]}×{r.grid[1]}" for r in rows]
    table = table.set_index("size")
    shown = table.astype(object).where(table.notna(), "—").astype(str)     # not measured (no table, no head): —
    st.dataframe(shown, key=f"{page}_res_table", placeholder="—")
    st.download_button("Sweep (CSV)", data=table.to_csv().encode(), file_name=f"{name}_resolution.csv",
                       mime="text/csv", key=f"{page}_res_csv", on_click="ignore")


def _verdict(rows, below, above) -> str:
    what = "top-1 stays the native size's" if rows[0].agreement is not None else "pooled features stay (cosine)"
    parts = []
    if below is not None:
        parts.append(f"at {below.label} px and below")
    if above is not None:
        parts.append(f"at {above.label} px and above")
    if not parts:
        return f"On every size swept, its {what} for at least 90 % of the gallery images (or a cosine of 0.9)."
    return f"Its {what} for less than 90 % of the gallery images (or a cosine under 0.9) " + " and ".join(parts) + "."


# ----------------------------------------------------------------------------- the sweep, cached
@cache.budgeted("resolution sweeps", max_items=32)
def _resolution(ref: cache.ModelRef, sizes: tuple[tuple[int, int], ...], rule: str, _on_size=None) -> list:
    from vitpe_core import positional
    ckpt = cache.load_model(ref)
    return resolution.sweep(ckpt.model, positional.image_set(ckpt), sizes, on_size=_on_size, rule=rule)


def resolution_sweep(name: str, sizes: tuple[tuple[int, int], ...], on_size=None, rule: str = "model") -> list:
    """`resolution.sweep`'s rows for checkpoint `name` at `sizes` on the gallery image set (tables
    resampled by `rule`), cached in the memory budget like the traces; `on_size(done, total, size)`
    reports progress while computing."""
    return _resolution(cache.model_ref(name), tuple(sizes), rule, on_size)


def resolution_cached(name: str, sizes: tuple[tuple[int, int], ...], rule: str = "model") -> bool:
    """Whether `resolution_sweep(name, sizes, rule=rule)` would answer from the cache (no sweep to run)."""
    return _resolution.is_cached(cache.model_ref(name), tuple(sizes), rule)
