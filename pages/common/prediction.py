"""The bias explorer's prediction: the top class in words (with the gallery image's true class),
the top-5 classes as bars and the class probabilities to download; for any trace with `probs` (a
ViT's `analysis.Trace`, a Swin's `swin.explore.SwinTrace`). The bars are Streamlit's progress bars,
not a Plotly chart: one chart fewer for the first page to draw (BENCHMARKS.md section 4)."""
from __future__ import annotations

import streamlit as st

from vitpe_core import views
from vitpe_core.gallery import gallery_label
from vitpe_core.inputs import prediction_text

from . import cache, messages
from .output import class_axes, downloads


def show_prediction(page: str, ckpt, tr, key: str) -> None:
    """The prediction of image `key` from trace `tr` (a model with a classification head)."""
    names = cache.class_names(ckpt)
    top, p = views.top_class(tr)
    st.markdown(prediction_text(names, top, p, gallery_label(key), imported=bool(ckpt.metrics.get("imported")),
                                escape=messages.escape_md))
    with st.container(key=f"{page}_top5"):
        st.caption("Top-5 probabilities")
        for name, p in views.top_k(tr.probs, names or []):
            st.progress(p, text=f"{messages.escape_md(name)} — {100 * p:.1f} %")
    downloads(f"{ckpt.name}_probabilities", tr.probs[None], key=f"{page}_probs_dl",
              shown_what="class probabilities", axes=class_axes(names))


def prediction_or_features(page: str, ckpt, tr, key: str) -> None:
    """`show_prediction`, or for a backbone (no head) how many features it puts out instead."""
    if ckpt.config.num_classes:
        show_prediction(page, ckpt, tr, key)
    else:
        st.caption(messages.no_head(len(tr.logits)))
