"""What each page of the app shows, as pure functions of a trace (no Streamlit, no Plotly).

The pages call these and only lay the results out; the benchmark times exactly these calls,
so a click's compute is measured on the code the page runs. Maps are `(H, W)` over the
patch grid, stacks `(L, h, H, W)` (layers, heads), as `analysis.patch_maps` gives them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import analysis
from .config import ViTConfig
from .encodings import PositionEncoding

PART_LABELS = {"sum": "x + y (the SaPE² bias)", "x": "x part (along the patch's row)",
               "y": "y part (along the patch's column)", "bias": "full bias", "row": "bias row"}


def head_text(head: int | None) -> str:
    return "mean over heads" if head is None else f"head {head}"


@dataclass(frozen=True)
class BiasView:
    """The bias row of one query patch: `full (L, h, H, W)` raw values, and the normalised
    maps the page draws: `shown (H, W)` at (layer, head), `per_layer (L, H, W)`, `per_head (h, H, W)`."""

    part: str
    what: str            # e.g. "SaPE² bias row, x part (along the patch's row)"
    scale_note: str      # what 0 and 1 mean on the normalised maps
    full: np.ndarray
    shown: np.ndarray
    per_layer: np.ndarray
    per_head: np.ndarray


def bias_parts(trace: analysis.Trace, pos_enc: PositionEncoding) -> list[str]:
    """The bias components a page can offer: `[]` without a bias; SaPE² `sum`, `x`, `y` (and
    `bias`, the full bias, when another part of the encoding adds to it, e.g. `sape2+rpb`);
    `row` for any other bias."""
    if trace.bias is None:
        return []
    if analysis.sape2_part_names(trace.parts) is None:
        return ["row"]
    others = [p.name for p in getattr(pos_enc, "parts", [pos_enc]) if "bias" in p.hooks and p.name != "sape2"]
    return ["sum", "x", "y"] + (["bias"] if others else [])


def bias_view(trace: analysis.Trace, maps: dict[str, np.ndarray], encoding: str, layer: int, head: int | None,
              part: str) -> BiasView:
    """`maps = analysis.patch_maps(trace, patch)`; `part` one of `bias_parts(...)`."""
    sape = analysis.sape2_part_names(trace.parts)
    if part == "row" or sape is None:
        part, full = "row", maps["bias"]
        what, scale_note = f"{encoding} bias row", "normalised to [0, 1]"
    else:
        arrays = {"x": lambda: maps[sape[0]], "y": lambda: maps[sape[1]],
                  "sum": lambda: maps[sape[0]] + maps[sape[1]], "bias": lambda: maps["bias"]}
        if part not in arrays:
            raise ValueError(f"unknown bias part {part!r}; valid: {sorted(arrays)}")
        full = arrays[part]()                                                   # (L, h, H, W)
        what = f"{encoding} full bias row" if part == "bias" else \
            "SaPE² bias row" + ("" if part == "sum" else f", {PART_LABELS[part]}")
        scale_note = "0 = near, 1 = far"
    return BiasView(part=part, what=what, scale_note=scale_note, full=full,
                    shown=analysis.normalize01(analysis.reduce_head(full[layer], head)),               # (H, W)
                    per_layer=analysis.normalize01(np.stack([analysis.reduce_head(m, head) for m in full])),
                    per_head=analysis.normalize01(full[layer]))                                        # (h, H, W)


def attention_view(maps: dict[str, np.ndarray], layer: int, head: int | None) -> np.ndarray:
    """The attention row of the query patch at (layer, head): `(H, W)` softmax weights."""
    return analysis.reduce_head(maps["attn"][layer], head)


def clamp_view(cfg: ViTConfig, patch: tuple[int, int], layer: int, head: int | None,
               ref_grid: tuple[int, int] | None = None) -> tuple[tuple[int, int], int, int | None]:
    """A view chosen for the deepest / widest model, clamped to this model's depth and heads;
    the patch chosen on `ref_grid` moves to the patch of this model's grid under the same
    point of the image (its centre), or is clamped to the grid without `ref_grid`."""
    H, W = cfg.grid
    if ref_grid is not None:
        patch = (int((patch[0] + 0.5) * H / ref_grid[0]), int((patch[1] + 0.5) * W / ref_grid[1]))
    return ((min(patch[0], H - 1), min(patch[1], W - 1)), min(layer, cfg.depth - 1),
            None if head is None else min(head, cfg.heads - 1))


@dataclass(frozen=True)
class PanelView:
    """One checkpoint's panel on the compare page: its positional component and attention row."""

    label: str           # "bias row", "table similarity", "RoPE kernel", or "none"
    positional: np.ndarray   # (H, W); normalised to [0, 1] when `normalised`
    attention: np.ndarray    # (H, W)
    normalised: bool

    @property
    def stacked(self) -> np.ndarray:
        """`(2, H, W)`: the positional component and the attention row (the panel's download)."""
        return np.stack([self.positional, self.attention])


NORMALISED_COMPONENTS = ("bias row",)   # raw bias values differ in scale between models


def panel_view(trace: analysis.Trace, component: tuple[str, np.ndarray] | None, patch: tuple[int, int],
               layer: int, head: int | None) -> PanelView:
    """`component = analysis.positional_component(model, trace, patch)`; patch/layer/head
    already clamped (`clamp_view`)."""
    attn = attention_view(analysis.patch_maps(trace, patch), layer, head)       # (H, W)
    if component is None:
        return PanelView("none", np.zeros_like(attn), attn, False)
    label, full = component
    pos = analysis.reduce_head(full[layer], head)                                # (H, W)
    norm = label in NORMALISED_COMPONENTS
    return PanelView(label, analysis.normalize01(pos) if norm else pos, attn, norm)


def pick_stat(stats: dict[str, np.ndarray], key: str, layer: int, head: int | None) -> float:
    """One attention statistic (`analysis.attention_stats`, `(L, h)`) at a layer, one head or their mean."""
    a = stats[key]
    return float(a[layer].mean()) if head is None else float(a[layer, head])


def top_class(trace: analysis.Trace) -> tuple[int, float]:
    """The predicted class index and its probability."""
    probs = trace.probs
    top = int(np.argmax(probs))
    return top, float(probs[top])


def accuracy_runs(metrics: dict[str, dict]) -> dict[str, tuple[list, list]]:
    """name -> (epochs, test top-1 per epoch) from each checkpoint's recorded curves (those
    with a consistent record only)."""
    out = {}
    for name, m in metrics.items():
        curves = m.get("curves") or {}
        top1 = curves.get("test_top1") or []
        epochs = curves.get("epoch") or list(range(1, len(top1) + 1))
        if top1 and len(epochs) == len(top1):
            out[name] = (list(epochs), list(top1))
    return out


def resolution_rows(metrics: dict[str, dict]) -> dict[str, dict[str, float]]:
    """name -> {"24px": top-1, ...} in increasing size, for checkpoints that measured other resolutions."""
    rows = {}
    for name, m in metrics.items():
        res = m.get("resolution")
        if res:
            sizes = sorted(res, key=lambda s: int(s) if str(s).isdigit() else 0)
            rows[name] = {f"{size}px": res[size].get("top1") for size in sizes}
    return rows


def prefix_share(trace: analysis.Trace, patch: tuple[int, int], layer: int, head: int | None) -> dict[str, float]:
    """How much of the query patch's attention goes to each kind of prefix token ("CLS",
    "dist", "registers"), at (layer, head or the mean of heads)."""
    P, i = trace.num_prefix, analysis.patch_index(patch, trace.grid)
    row = trace.attn[layer, :, P + i, :P]                                        # (h, P)
    row = row.mean(0) if head is None else row[head]
    out: dict[str, float] = {}
    for name, a in zip(trace.prefix, row):
        kind = "registers" if name.startswith("reg") else name
        out[kind] = out.get(kind, 0.0) + float(a)
    return out
