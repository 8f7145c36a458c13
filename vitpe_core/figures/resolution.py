"""The resolution sweep (`vitpe_core.resolution`): `resolution_fig`, one chart of what each input
size keeps of the model's behaviour and sense of position, and `distance_by_size_fig`, the
attention distance by depth per size."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from .common import CHECKPOINT_PALETTE, _title

RESOLUTION_SERIES = (   # SizeRow field, legend name, what it says
    ("agreement", "top-1 as at native size", "the share of images whose top-1 class is the native size's"),
    ("feature_cosine", "feature cosine to native", "the mean cosine of the pooled features to the native size's"),
    ("structure", "table's 2D structure", "Spearman's rho of the resampled table's similarity against distance"),
    ("relative_score", "position kernel: offset-only share", "how much of the position-only kernel an "
                                                              "offset-only kernel explains"),
)


def _scale(row, native) -> float:
    """The size's linear scale: sqrt of its area over the native area."""
    return float(np.sqrt(row.size[0] * row.size[1] / (native.size[0] * native.size[1])))


def resolution_fig(rows: Sequence, *, title: str) -> go.Figure:
    """One line per figure of `RESOLUTION_SERIES` over the sizes' scale (square sizes joined, rectangular ones
    as hollow markers), the native size marked; hover names each size in pixels and patches."""
    native = next(r for r in rows if r.native)
    aspect = native.size[0] / native.size[1]
    fig = go.Figure()
    for i, (field, name, what) in enumerate(RESOLUTION_SERIES):
        pts = [(r, getattr(r, field)) for r in rows if getattr(r, field) is not None]
        if not pts:
            continue
        color = CHECKPOINT_PALETTE[i % len(CHECKPOINT_PALETTE)]
        for same, (mode, symbol) in ((True, ("lines+markers", "circle")), (False, ("markers", "circle-open"))):
            sel = [(r, v) for r, v in pts if (abs(r.size[0] / r.size[1] - aspect) < 1e-9) == same]
            if not sel:
                continue
            fig.add_trace(go.Scatter(
                x=[_scale(r, native) for r, _ in sel], y=[v for _, v in sel], mode=mode, name=name,
                legendgroup=field, showlegend=same or not any(abs(r.size[0] / r.size[1] - aspect) < 1e-9
                                                              for r, _ in pts),
                line=dict(color=color), marker=dict(color=color, symbol=symbol, size=8),
                customdata=[[r.label, f"{r.grid[0]}×{r.grid[1]}"] for r, _ in sel],
                hovertemplate=f"%{{customdata[0]}} px (%{{customdata[1]}} patches): %{{y:.3f}}<extra>{what}</extra>"))
    fig.add_vline(x=1.0, line=dict(color="#888", dash="dot"), annotation_text=f"native {native.label}",
                  annotation_position="top")
    _title(fig, title, b=40)
    fig.update_layout(xaxis_title="input size (× native, by area)", yaxis_title="value",
                      height=360 + fig.layout.margin.t + 20, hovermode="closest",
                      legend=dict(orientation="h", y=-0.22, yanchor="top"))
    square = [r for r in rows if abs(r.size[0] / r.size[1] - aspect) < 1e-9]
    fig.update_xaxes(tickvals=[round(_scale(r, native), 3) for r in square],
                     ticktext=[f"{_scale(r, native):.2g}×<br>{r.label}" for r in square])
    return fig


def distance_by_size_fig(rows: Sequence, *, title: str) -> go.Figure:
    """Mean attention distance by depth (patches; mean over heads and images), one line per size,
    darker for larger sizes."""
    fig = go.Figure()
    native = next(r for r in rows if r.native)
    for r in sorted(rows, key=lambda r: r.size[0] * r.size[1]):
        shade = min(1.0, max(0.15, _scale(r, native) / 2))
        fig.add_trace(go.Scatter(x=list(range(len(r.distance))), y=list(r.distance), mode="lines+markers",
                                 name=r.label + (" (native)" if r.native else ""),
                                 line=dict(color=f"rgba(31, 119, 180, {shade:.2f})", width=3 if r.native else 1.5),
                                 hovertemplate=f"{r.label}, layer %{{x}}: %{{y:.2f}} patches<extra></extra>"))
    _title(fig, title, b=40)
    fig.update_layout(xaxis_title="layer (depth)", yaxis_title="mean attention distance (patches)",
                      height=320 + fig.layout.margin.t, legend=dict(orientation="h", y=-0.22, yanchor="top"))
    return fig
