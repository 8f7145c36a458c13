"""Checkpoints: what is shipped — every checkpoint's encoding, size and accuracy; for the
chosen one its configuration, training recipe, results and training curves."""
from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from vitpe_core import figures, views
from pages.common import cache, explain, import_form, messages, report_button, viewsync, widgets
from pages.common.output import chart

PAGE = "checkpoints"


def main() -> None:
    explain.render(PAGE)
    imported = import_form.model_import_form(PAGE)
    names = cache.checkpoint_names()
    if imported:
        st.session_state["ckpt"] = imported
    view = viewsync.current_view(PAGE, names)
    viewsync.render_share(view)
    if not names:
        messages.no_checkpoints_info()
        return
    st.caption(f"Checkpoints: `{cache.checkpoint_root()}` ({cache.count_text()})")
    rows, ckpts = [], {}
    for name in names:
        try:
            ckpts[name] = ckpt = cache.get_checkpoint(name)
        except (ValueError, OSError) as e:
            rows.append({"checkpoint": name, "encoding": f"unreadable: {e}"})
            continue
        m = ckpt.metrics                   # the cache has checked its shape (sanitize_metrics)
        test, structure = m.get("test") or {}, m.get("structure") or {}
        recipe = m.get("recipe") or {}
        rows.append({"checkpoint": name, "encoding": ckpt.config.encoding,
                     "options": views.options_text(ckpt.config),      # a Swin's: C, depths, heads, window
                     "parameters": sum(p.numel() for p in ckpt.model.parameters()),
                     "dataset": cache.dataset_of(ckpt), "epochs": m.get("epochs", recipe.get("epochs")),
                     "test top-1 %": test.get("top1"), "test top-5 %": test.get("top5"),
                     "2D structure (Spearman)": structure.get("spearman"),
                     "history epochs": len(ckpt.history)})
    table = pd.DataFrame(views.without_same_encoding(rows)).set_index("checkpoint")
    st.dataframe(table, key=f"{PAGE}_table", placeholder="—")
    st.download_button("Table (CSV)", data=table.to_csv().encode(), file_name="checkpoints.csv", mime="text/csv",
                       key=f"{PAGE}_table_csv", on_click="ignore")
    if view.ckpt not in ckpts:
        return
    with st.sidebar:
        widgets.checkpoint_select(PAGE, names)
    details(view.ckpt, ckpts[view.ckpt])


def details(name: str, ckpt) -> None:
    m = ckpt.metrics                       # the cache has checked its shape (sanitize_metrics)
    safe = name.replace("/", "_")          # long/ape -> long_ape in file names
    st.header(name)
    report_button.offer(PAGE, name, ckpt)
    if m.get("metrics_problems"):
        st.warning("Some of this checkpoint's metrics are not in the shape `vitpe_core.train` writes and are "
                   "not shown: " + "; ".join(m["metrics_problems"]) + ". Re-record them with `python -m vitpe_core "
                   f"evaluate checkpoints/{name}.safetensors --sizes 24,32,40,48 --translation --record`.")
    test, cols = m.get("test") or {}, st.columns(4)
    cols[0].metric("test top-1", "—" if test.get("top1") is None else f"{test['top1']:.2f} %")
    cols[1].metric("test top-5", "—" if test.get("top5") is None else f"{test['top5']:.2f} %")
    cols[2].metric("parameters", f"{sum(p.numel() for p in ckpt.model.parameters()):,}")
    cols[3].metric("family" if m.get("imported") else "dataset", m.get("family") or cache.dataset_of(ckpt))
    if m.get("imported"):
        st.markdown(f"Imported from {messages.code_md(str(m.get('source')))} · licence: "
                    f"{messages.escape_md(str(m.get('licence') or 'not stated'))} · eval transform: "
                    f"{messages.escape_md(json.dumps(m.get('preprocess')))}")
        if m.get("notes"):
            st.info("Import notes: " + messages.escape_md(str(m["notes"])))
    curves = m.get("curves")
    if curves and any(curves.get(k) for k in curves if k != "epoch"):
        chart(figures.curves_fig(curves, title=f"Training curves of {name}"), f"{name}_curves",
              key=f"{PAGE}_curves")
        try:
            df = pd.DataFrame(curves)       # sanitize_metrics kept only series of one value per epoch
            st.download_button("Curves (CSV)", data=df.to_csv(index=False).encode(), file_name=f"{safe}_curves.csv",
                               mime="text/csv", key=f"{PAGE}_curves_csv", on_click="ignore")
        except ValueError:
            pass
    else:
        st.caption("No training curves recorded.")
    encoding_scale(name, ckpt, curves or {})
    left, right = st.columns(2)
    with left:
        st.subheader("Model configuration")
        st.json(ckpt.config.to_dict(), expanded=True)
    with right:
        st.subheader("Training recipe")
        st.json(m.get("recipe") or {"recipe": "not recorded"}, expanded=True)
    res = m.get("resolution")
    if res:
        st.subheader("Accuracy at other input resolutions")
        st.dataframe(pd.DataFrame.from_dict(res, orient="index"), key=f"{PAGE}_resolution", placeholder="—")
    trans = m.get("translation")
    if trans:
        st.subheader("Translation test")
        st.dataframe(pd.DataFrame.from_dict(trans, orient="index"), key=f"{PAGE}_translation", placeholder="—")
    with st.expander("All metrics (JSON)"):
        st.json(m, expanded=False)
        st.download_button("Metrics (JSON)", data=json.dumps(m, indent=1, sort_keys=True).encode(),
                           file_name=f"{safe}_metrics.json", mime="application/json", key=f"{PAGE}_metrics_json",
                           on_click="ignore")


SCALE_CAPTION = ("How loud the encoding's attention bias is, per layer, after each epoch (on 64 test images): **bias "
                 "std / logit std** is the spread of the SaPE² / CoPE bias over key patches divided by that of the "
                 "content logits q·k/√d (0 = the bias cannot move attention; 1 = as strong as content). **‖E_x‖, "
                 "‖E_y‖**: norms of SaPE²'s per-layer read-out tables.")


def encoding_scale(name: str, ckpt, curves: dict) -> None:
    series = views.encoding_scale_series(curves)
    if not series:
        why = ("its encoding adds no attention bias" if "bias" not in views.position_hooks(ckpt.model)
               else "it was trained before training recorded it")
        st.caption(f"No encoding-scale record (bias against logits by layer): {why}.")
        return
    chart(figures.encoding_scale_fig(series, title=f"Encoding scale by layer, {name}"), f"{name}_encoding_scale",
          key=f"{PAGE}_encoding_scale")
    st.caption(SCALE_CAPTION)


main()
