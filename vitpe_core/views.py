"""What each page of the app shows, as pure functions of a trace (no Streamlit, no Plotly).

The pages call these and only lay the results out; the benchmark times exactly these calls,
so a click's compute is measured on the code the page runs. Maps are `(H, W)` over the
patch grid, stacks `(L, h, H, W)` (layers, heads), as `analysis.patch_maps` gives them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import analysis
from .checkpoint import group_and_stem
from .config import ViTConfig
from .positional import query_fit

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


def bias_parts(trace: analysis.Trace) -> list[str]:
    """The bias components a page can offer: `[]` without a bias; SaPE² `sum`, `x`, `y` (and
    `bias`, the full bias, when another part of the encoding adds to it, e.g. `sape2+rpb`);
    `row` for any other bias. The encoding's parts are the trace's record (`Trace.bias_sources`): a
    trace stored with its checkpoint offers them without the model."""
    if trace.bias is None:
        return []
    if analysis.sape2_part_names(trace.parts) is None:
        return ["row"]
    others = [name for name in trace.bias_sources if name != "sape2"]
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


def top_k(probs: np.ndarray, class_names: Sequence[str], k: int = 5) -> list[tuple[str, float]]:
    """The `k` most probable classes as (name, probability), the most probable first; a class
    without a name is "class i"."""
    probs = np.asarray(probs, dtype=np.float64)
    return [(class_names[i] if i < len(class_names) else f"class {i}", float(probs[i])) for i in np.argsort(-probs)[:k]]


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
    row = trace.attn[layer, :, P + i, :P].astype(np.float32)                     # (h, P)
    row = row.mean(0) if head is None else row[head]
    out: dict[str, float] = {}
    for name, a in zip(trace.prefix, row):
        kind = "registers" if name.startswith("reg") else name
        out[kind] = out.get(kind, 0.0) + float(a)
    return out


# ----------------------------------------------------------------------------- words for the pages
HOOK_WORDS = {"table": "adds a table", "bias": "biases attention", "rotation": "rotates q/k"}


def hooks_text(hooks) -> str:
    """How an encoding brings in position, in plain words (`PositionEncoding.hooks`):
    "adds a table, biases attention", or "no position information" for none."""
    return ", ".join(HOOK_WORDS.get(h, h) for h in hooks) or "no position information"


def position_hooks(model) -> tuple[str, ...]:
    """How a model brings in position (`PositionEncoding.hooks`); a Swin (no `pos_enc`) biases
    attention inside its windows: `("bias",)` (no absolute table, no rotation)."""
    pos_enc = getattr(model, "pos_enc", None)
    return ("bias",) if pos_enc is None else tuple(pos_enc.hooks)


def options_text(cfg) -> str:
    """The checkpoints table's "options" cell: a ViT's encoding options as JSON (empty without
    any), a Swin's architecture in one line (`swin.explore.config_text`)."""
    import json

    if getattr(cfg, "arch", "vit") == "swin":
        from .swin.explore import config_text
        return config_text(cfg)
    return json.dumps(cfg.encoding_options) if cfg.encoding_options else ""


def readout_text(encoding_options: dict) -> str:
    """The SaPE² read-out of a checkpoint, with the paper's name for it and its published top-1."""
    from .report import SAPE2_READOUTS

    readout = encoding_options.get("readout", "query")
    name, top1 = SAPE2_READOUTS[readout]
    best = " the paper's best setting" if readout == "query" else ""
    return (f"**{name}** — read-out with the {readout}, `readout=\"{readout}\"`:{best} ({top1:.2f} % top-1 on "
            "CIFAR-10 with +APE in the paper). The paper's prose and code name the two variants the other way "
            "round; this app follows its table.")


def without_same_encoding(rows: list[dict]) -> list[dict]:
    """Compare-table rows (`checkpoint`, `encoding`, ...) without the `encoding` column when every
    row's encoding is its checkpoint's name (a group's `long/ape` counts as `ape`); otherwise
    every row keeps its encoding (blanking the rows where it equals the name turned every
    shipped row into a dash as soon as one imported model joined the table)."""
    def same(r: dict) -> bool:
        return r.get("encoding") == group_and_stem(str(r.get("checkpoint")))[1]

    if all(same(r) for r in rows):
        return [{k: v for k, v in r.items() if k != "encoding"} for r in rows]
    return [dict(r) for r in rows]


# ----------------------------------------------------------------------------- what the model sees of an image
@dataclass(frozen=True)
class Fit:
    """How an image of `image` = (width, height) px reaches a model whose crop keeps the centred
    `seen` = (width, height) px box and whose input is `model` = (width, height) px."""

    image: tuple[int, int]
    seen: tuple[int, int]
    model: tuple[int, int]

    @property
    def dropped(self) -> float:
        """The fraction of the image's pixels the crop leaves out."""
        return 1.0 - (self.seen[0] * self.seen[1]) / max(1, self.image[0] * self.image[1])

    @property
    def upscale(self) -> float:
        """How much the seen box is enlarged to the model's input (1 = not at all)."""
        return max(self.model[0] / max(1, self.seen[0]), self.model[1] / max(1, self.seen[1]))

    def crop_note(self, image_text: str | None = None, *, original: tuple[int, int] | None = None) -> str | None:
        """What the crop leaves out, or None when the model sees the whole image. `image_text`
        names the image (default "this W×H px image"; e.g. an upload shrunk for the server);
        `original`: the (width, height) that text speaks of when it is not `image` (an upload
        shrunk for the server), so the seen box is counted in the original's pixels."""
        if self.seen == self.image:
            return None
        (w, h), (sw, sh) = self.image, self.seen
        if original is not None and tuple(original) != (w, h):              # the box in the original's pixels
            sw, sh = round(sw * original[0] / w), round(sh * original[1] / h)
        sides = " and ".join(s for s, cut in (("left and right", sw < w), ("top and bottom", sh < h)) if cut)
        image_text = image_text or f"this {w}×{h} px image"
        return (f"The model sees only the centred {sw}×{sh} px of {image_text} (its input is "
                f"{self.model[0]}×{self.model[1]} px): {100 * self.dropped:.0f} % of the image, at the {sides}, "
                "is left out. Choose *pad* to show it the whole image.")

    def upscale_note(self) -> str | None:
        """A note for an image the model sees enlarged at least 2×, else None."""
        if self.upscale < 2:
            return None
        return (f"This image is {self.image[0]}×{self.image[1]} px, smaller than the model's "
                f"{self.model[0]}×{self.model[1]} px input: it is enlarged {self.upscale:.0f}× (bicubic), so the "
                "model sees little detail.")


def fit_of(image_size: tuple[int, int], seen_size: tuple[int, int], img_size: tuple[int, int]) -> Fit:
    """`image_size`, `seen_size` as PIL gives them (width, height); `img_size` the model's (H, W)."""
    return Fit(tuple(image_size), tuple(seen_size), (img_size[1], img_size[0]))


PAD_FILL = (128, 128, 128)


def letterbox(img, img_size: tuple[int, int], crop_pct: float = 1.0, fill: tuple[int, int, int] = PAD_FILL):
    """`img` (PIL) centred on a grey canvas of the model's aspect ratio (`img_size` = (H, W)),
    enlarged by 1 / `crop_pct` so that the model's centre crop keeps the whole image: pad
    instead of crop. The image's pixels are not resampled."""
    from PIL import Image

    H, W = img_size
    img = img.convert("RGB")
    scale = max(img.width / W, img.height / H) / max(min(float(crop_pct), 1.0), 1e-3)
    w, h = max(img.width, round(W * scale)), max(img.height, round(H * scale))
    canvas = Image.new("RGB", (w, h), fill)
    canvas.paste(img, ((w - img.width) // 2, (h - img.height) // 2))
    return canvas


def bias_short(bv: BiasView) -> str:
    """A short name of a bias view for chart titles ("SaPE² bias, x part", "rpb bias")."""
    if bv.part == "row":
        return bv.what.replace(" bias row", " bias")
    if bv.part == "bias":
        return bv.what.replace(" full bias row", " full bias")
    return "SaPE² bias" + ("" if bv.part == "sum" else f", {bv.part} part")


def bias_caption(bv: BiasView) -> str:
    """What the bias maps show and how they are scaled (the details chart titles leave out)."""
    scale = ("0 = near the query patch, 1 = far from it" if bv.scale_note == "0 = near, 1 = far"
             else "0 = its smallest bias, 1 = its largest")
    return f"{bv.what}; each map is rescaled to 0–1 on its own ({scale}); the NPY download holds the raw values."


def kernel_view(arrays: dict[str, np.ndarray], layer: int, head: int | None) -> tuple[np.ndarray, float | None] | None:
    """From `positional.analyze`'s arrays: the offset kernel `(2H-1, 2W-1)` at `layer` (clamped;
    layer 0 for tables) and head (None = mean of heads), with its relative score; None for
    models without position information."""
    if str(arrays["kind"]) == "none":
        return None
    off, score = arrays["offset_kernel"], arrays["relative_score"]               # (L', h, ., .), (L', h)
    lay = min(layer, off.shape[0] - 1)
    if head is None:
        return off[lay].mean(0), float(score[lay].mean())
    hh = min(head, off.shape[1] - 1)
    return off[lay, hh], float(score[lay, hh])


def relative_scores_by_layer(arrays: dict[str, np.ndarray]) -> dict[str, float | None]:
    """`{"L0": score, ...}` (mean over heads) for a table of checkpoints; None where not defined."""
    if str(arrays["kind"]) == "none":
        return {}
    return {f"L{i}": float(s) for i, s in enumerate(arrays["relative_score"].mean(1))}


def query_kernel_view(arrays: dict[str, np.ndarray], layer: int, head: int | None, patch: tuple[int, int],
                      grid: tuple[int, int]) -> tuple[np.ndarray, float] | None:
    """From `positional.analyze`'s arrays: the position-only logits of query `patch` to every key,
    `(H, W)` (a row of the `(N, N)` kernel), at `layer` (clamped; layer 0 for tables) and head
    (None = mean of heads), with how well the offset fit of the whole kernel explains *this row*
    (`positional.query_fit`: an R² in `(−∞, 1]`, 1 for a relative kernel at every query, below 0
    where the shared offset pattern fits this row worse than a flat row); None for models
    without position information."""
    if str(arrays["kind"]) == "none":
        return None
    H, W = grid
    kern = arrays["kernel"]                                                      # (L', h, N, N)
    assert kern.shape[-1] == H * W, (kern.shape, grid)
    lay, i = min(layer, kern.shape[0] - 1), patch[0] * W + patch[1]
    k = kern[lay].mean(0) if head is None else kern[lay, min(head, kern.shape[1] - 1)]   # (N, N)
    return k[i].reshape(H, W), query_fit(k, grid, i)


def film_grids(sims: dict[int, np.ndarray], grid: tuple[int, int]) -> dict[int, np.ndarray]:
    """epoch -> `(N, N)` table similarity  ->  epoch -> `(H, W, H, W)` Figure-7 grid, in epoch order
    (the frames of `figures.figure7_film_fig` / `figure7_gif`)."""
    return {int(e): analysis.similarity_grid(np.asarray(sims[e]), grid) for e in sorted(sims)}


SCALE_SERIES = {"enc_bias_ratio_L": "bias std / logit std", "enc_ex_norm_L": "‖E_x‖", "enc_ey_norm_L": "‖E_y‖"}


def encoding_scale_series(curves: dict) -> dict[str, dict[str, tuple[list, list]]]:
    """The encoding-scale record of a checkpoint's training curves (`analysis.encoding_scale`,
    one value per epoch and layer): quantity -> layer ("L0", ...) -> (epochs, values), epochs
    without a value left out; quantities without any value are absent (an empty dict for a
    checkpoint trained before the record existed, or without a bias)."""
    epochs = list(curves.get("epoch") or [])
    out: dict[str, dict[str, tuple[list, list]]] = {}
    for prefix, what in SCALE_SERIES.items():
        layers = sorted((k for k in curves if k.startswith(prefix) and k[len(prefix):].isdigit()),
                        key=lambda k: int(k[len(prefix):]))
        for key in layers:
            values = list(curves[key])
            xs = epochs if len(epochs) == len(values) else list(range(1, len(values) + 1))
            pts = [(x, v) for x, v in zip(xs, values) if v is not None]
            if pts:
                out.setdefault(what, {})["L" + key[len(prefix):]] = ([x for x, _ in pts], [v for _, v in pts])
    return out
