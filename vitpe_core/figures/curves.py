"""Line and bar charts: training curves, scores per epoch or per layer, top-k probabilities.

Lines of several checkpoints take one colour per checkpoint name everywhere
(`common.checkpoint_colors`).

* `curves_fig`: a run's loss and accuracy curves, as recorded by `vitpe_core.train`.
* `topk_fig`: horizontal bars of the `k` most probable classes.
* `line_fig`: several series over one shared x.
* `runs_fig`: one line per run, each with its own x (a score per epoch).
* `distance_by_depth_fig`: the ViT paper's Figure 7 (right), a statistic per head by layer.
* `encoding_scale_fig`: the encoding's scale in training, one panel per quantity, one line
  per layer.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..views import top_k
from .common import CHECKPOINT_PALETTE, _fast, _title, _title_layout, checkpoint_colors


def curves_fig(curves: Mapping[str, Sequence[float]], *, title: str = "Training curves") -> go.Figure:
    """`curves`: `epoch` plus any of `train_loss`, `test_loss` (left) and `train_acc`,
    `test_top1`, `test_top5` (right, percent), as recorded by `vitpe_core.train`."""
    epochs = list(curves.get("epoch") or range(1, 1 + max((len(v) for v in curves.values()), default=0)))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss", "accuracy (%)"))
    for col, keys in ((1, ("train_loss", "test_loss")), (2, ("train_acc", "test_top1", "test_top5"))):
        for key in keys:
            values = curves.get(key)
            if values:
                fig.add_trace(go.Scatter(x=epochs[:len(values)], y=list(values), mode="lines+markers", name=key),
                              row=1, col=col)
    fig.update_xaxes(title="epoch")
    _title(fig, title, subplot_titles=True, b=40)
    fig.update_layout(legend=dict(orientation="h", y=-0.2))
    return fig


def topk_fig(probs: np.ndarray, class_names: Sequence[str], *, k: int = 5,
             title: str = "Prediction: top-5 probabilities") -> go.Figure:
    """Horizontal bars of the `k` most probable classes, the most probable on top."""
    names, p = zip(*reversed(top_k(probs, class_names, k)))           # the most probable on top
    bar = {"type": "bar", "x": np.array(p) * 100, "y": list(names), "orientation": "h",
           "text": [f"{v * 100:.1f}%" for v in p], "textposition": "auto",
           "hovertemplate": "%{y}: %{x:.2f}%<extra></extra>"}
    layout = _title_layout(title)
    layout.update(xaxis={"title": {"text": "probability (%)"}, "range": [0, 100]}, height=200 + layout["margin"]["t"])
    return _fast([bar], layout)


def line_fig(x: Sequence[float], series: Mapping[str, Sequence[float]], *, title: str, x_title: str,
             y_title: str) -> go.Figure:
    fig = go.Figure([go.Scatter(x=list(x), y=list(v), mode="lines+markers", name=k) for k, v in series.items()])
    _title(fig, title, b=40)
    fig.update_layout(xaxis_title=x_title, yaxis_title=y_title, height=260 + fig.layout.margin.t,
                      legend=dict(orientation="h", y=-0.25, yanchor="top"))
    return fig


def runs_fig(runs: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str, x_title: str,
             y_title: str, colors: Mapping[str, str] | None = None) -> go.Figure:
    """One line per run, each with its own x (runs may record different epochs), coloured by
    `colors` (name -> colour; default `checkpoint_colors` of the runs shown: pass the one map of
    every checkpoint so that a name has the same colour in every chart)."""
    colors = colors if colors is not None else checkpoint_colors(list(runs))
    fig = go.Figure([go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=name,
                                line=dict(color=colors.get(name)), marker=dict(color=colors.get(name)))
                     for name, (x, y) in runs.items()])
    _title(fig, title, b=40)
    fig.update_layout(xaxis_title=x_title, yaxis_title=y_title, height=340 + fig.layout.margin.t,
                      hovermode="x unified", legend=dict(orientation="h", y=-0.2, yanchor="top"))
    return fig


def distance_by_depth_fig(distances: Mapping[str, np.ndarray], *, title: str,
                          colors: Mapping[str, str] | None = None, y_title: str = "mean attention distance (patches)"
                          ) -> go.Figure:
    """The ViT paper's Figure 7 (right): per checkpoint, every head's statistic `(L, h)` as dots
    at its layer, and the mean over heads as a line; several checkpoints overlaid."""
    colors = colors if colors is not None else checkpoint_colors(list(distances))
    fig = go.Figure()
    for name, d in distances.items():
        d = np.asarray(d, dtype=float)
        L, h = d.shape
        color = colors.get(name)
        fig.add_trace(go.Scatter(x=np.repeat(np.arange(L), h) + np.tile(np.linspace(-0.15, 0.15, h), L),
                                 y=d.ravel(), mode="markers", marker=dict(color=color, size=5, opacity=0.6),
                                 name=name, legendgroup=name, showlegend=False,
                                 hovertemplate="layer %{x:.0f}: %{y:.2f}<extra>" + name + "</extra>"))
        fig.add_trace(go.Scatter(x=np.arange(L), y=d.mean(1), mode="lines", line=dict(color=color), name=name,
                                 legendgroup=name))
    _title(fig, title, b=40)
    fig.update_layout(xaxis_title="layer (depth)", yaxis_title=y_title, height=340 + fig.layout.margin.t,
                      legend=dict(orientation="h", y=-0.2, yanchor="top"))
    return fig


def encoding_scale_fig(series: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float]]]], *,
                       title: str) -> go.Figure:
    """`views.encoding_scale_series`: quantity -> layer -> (epochs, values); one panel per
    quantity, one line per layer (a layer keeps its colour in every panel)."""
    names = list(series)
    layers = sorted({lay for s in series.values() for lay in s}, key=lambda s: int(s[1:]) if s[1:].isdigit() else 0)
    colors = {lay: CHECKPOINT_PALETTE[i % len(CHECKPOINT_PALETTE)] for i, lay in enumerate(layers)}
    fig = make_subplots(rows=1, cols=max(1, len(names)), subplot_titles=names, horizontal_spacing=0.08)
    for col, name in enumerate(names, start=1):
        for lay, (x, y) in series[name].items():
            fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines+markers", name=f"layer {lay[1:]}",
                                     legendgroup=lay, showlegend=col == 1, line=dict(color=colors[lay]),
                                     marker=dict(color=colors[lay], size=4),
                                     hovertemplate=f"layer {lay[1:]}, epoch %{{x}}: %{{y:.4g}}<extra>{name}</extra>"),
                          row=1, col=col)
    fig.update_xaxes(title="epoch")
    _title(fig, title, subplot_titles=True, b=40)
    fig.update_layout(height=320 + fig.layout.margin.t, legend=dict(orientation="h", y=-0.25, yanchor="top"))
    return fig
