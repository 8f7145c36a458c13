"""What another input size does to a ViT's sense of position: one sweep over sizes.

Per size, on the same images resized (bicubic, antialiased: `stress.transform_input`), with the
model's own run-time resampling of its position parameters (the encoding's `table(grid)`,
`offset_table`, rotary angles at that grid):

* `structure`: the 2D-structure score (Spearman's rho of cosine similarity against −distance,
  `analysis.structure_score`) of the learned table resampled to the size's grid (None: no table);
* `relative_score`: how much of the position-only kernel an offset-only kernel explains, mean over
  layers and heads (`positional.relative_score`; None without a position kernel);
* `distance`: mean attention distance by depth, in patches (mean over heads and images);
  (a Swin, attending inside windows: the next two only)
* `agreement`: the fraction of images whose top-1 class is the one at the native size (None
  without a classification head);
* `feature_cosine`: the mean cosine of the pooled features to the native size's.

`sweep(model, images, sizes, rule=...)` returns one `SizeRow` per size; `default_sizes` picks
0.5x-2x the native size in whole patches, plus one rectangular size. Where libraries resample a
table differently at another size, `rule` runs the model by one library's rule instead of its
own (`RULES`: "timm" resamples a learned table bicubic and antialiased and BEiT's relative tables by
BEiT's geometric rule, as its own code does; "transformers" bicubic without antialiasing, which is
RoPE-ViT's original rule too, and BEiT's tables bilinearly); `rules_for(model)` names the ones that
change something for a model. The app's resolution page, the notebook
API (`explore.resolution`) and the figure (`figures.resolution_figure`) read these rows.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from . import analysis
from .lazy import no_grad
from .positional import mean_attention_distance, position_kernels, relative_score
from .stress import Transform, transform_input
from .swin.explore import is_swin_model

if TYPE_CHECKING:   # torch and the models: imported where used (the app imports this module before torch)
    from torch import Tensor

    from .encodings.base import Grid
    from .model import ViT
    from .swin.model import SwinTransformer

MAX_SIDE_PATCHES = 64          # a sweep's largest grid side (attention maps grow with the 4th power of it)
# name -> (learned table: interpolation, antialias; BEiT's relative tables: resize); "model": its own
RULES = {"model": None, "timm": (("bicubic", True), "geometric"), "transformers": (("bicubic", False), "bilinear")}


@dataclass(frozen=True)
class SizeRow:
    """One input size's figures (module doc)."""

    size: tuple[int, int]
    grid: Grid
    native: bool
    structure: float | None
    relative_score: float | None
    distance: tuple[float, ...]       # per layer, in patches
    agreement: float | None
    feature_cosine: float

    @property
    def label(self) -> str:
        return f"{self.size[0]}×{self.size[1]}"


def default_sizes(img_size: tuple[int, int], patch: int, lo: float = 0.5, hi: float = 2.0, count: int = 7
                  ) -> list[tuple[int, int]]:
    """`count` square-ish sizes from `lo`x to `hi`x the native one in whole patches (the width kept
    in proportion), the native size, and one rectangular size (the native height, 1.5x the width)."""
    H, W = img_size[0] // patch, img_size[1] // patch
    rows = {max(1, round(H * (lo * (hi / lo) ** (i / (count - 1))))) for i in range(count)}
    sizes = {(r * patch, max(1, round(W * r / H)) * patch) for r in rows} | {tuple(img_size)}
    sizes.add((H * patch, max(W + 1, round(1.5 * W)) * patch))
    return sorted(s for s in sizes if max(s) // patch <= MAX_SIDE_PATCHES)


def check_sizes(sizes: Sequence[tuple[int, int]], patch: int) -> list[tuple[int, int]]:
    """`sizes` as sorted (H, W) int pairs, each a multiple of `patch` and at most `MAX_SIDE_PATCHES`
    a side; ValueError otherwise."""
    out = []
    for s in sizes:
        h, w = int(s[0]), int(s[1])
        if h <= 0 or w <= 0 or h % patch or w % patch:
            raise ValueError(f"input size {h}x{w}: each side must be a positive multiple of the patch size {patch}")
        if max(h, w) // patch > MAX_SIDE_PATCHES:
            raise ValueError(f"input size {h}x{w}: at most {MAX_SIDE_PATCHES * patch} px a side "
                             f"({MAX_SIDE_PATCHES} patches) in a sweep")
        out.append((h, w))
    return sorted(set(out))


@no_grad
def _outputs(model: ViT | SwinTransformer, x: Tensor) -> tuple[Tensor, Tensor]:
    """(logits, pooled features) of `x`, as the model's `forward` computes them."""
    tokens = model.forward_features(x)
    if is_swin_model(model):
        feat = tokens.mean(1)
        return model.head(feat), feat
    feat = model.pool(tokens)
    logits = model.head(feat)
    if model.cfg.dist_token:
        logits = (logits + model.head_dist(tokens[:, 1])) / 2
    return logits, feat


def _resampled(model):
    """(learned tables, BEiT-style relative tables) of `model`'s encoding: the modules a rule sets."""
    from .encodings.absolute import LearnedAbsolute
    from .encodings.rpb import RelativePositionBiasCLS
    mods = list(model.pos_enc.modules()) if not is_swin_model(model) else []
    return ([m for m in mods if isinstance(m, LearnedAbsolute)],
            [m for m in mods if isinstance(m, RelativePositionBiasCLS)])


def rules_for(model) -> list[str]:
    """The rule names that change what `model` computes at another size: "model" and, where it has a
    learned table or BEiT's relative tables, "timm" and "transformers"."""
    tables, rel = _resampled(model)
    return ["model", "timm", "transformers"] if tables or rel else ["model"]


def with_rule(model, rule: str):
    """`model` resampling its tables at other sizes by `rule` (`RULES`): a copy whose encoding is its
    own (the weights of every other layer shared; the caller's model never changes), or `model`
    itself for "model"."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; valid: {', '.join(RULES)}")
    if RULES[rule] is None:
        return model
    (mode, antialias), table_resize = RULES[rule]
    other = copy.copy(model)
    other._modules = dict(model._modules)
    other._modules["pos_enc"] = copy.deepcopy(model.pos_enc)
    tables, rel = _resampled(other)
    for m in tables:
        m.interpolation, m.antialias = mode, antialias
    for m in rel:
        m.table_resize = table_resize
    return other


def _chunk(model: ViT, grid: Grid, budget: int = 24 * 2**20) -> int:
    """Images per traced pass: one pass's attention maps within `budget` bytes."""
    T = model.num_prefix + grid[0] * grid[1]
    per_image = 4 * model.cfg.depth * model.cfg.heads * T * T
    return max(1, min(16, budget // max(per_image, 1)))


@no_grad
def measure(model: ViT | SwinTransformer, images: Tensor, size: tuple[int, int]) -> dict:
    """The raw figures of `images (B, 3, H, W)` (normalised, native size) at input `size`: the
    logits and pooled features, the position-only kernel's relative score, the attention distance
    by depth and the table's 2D-structure score (see the module doc). A Swin (windows; no table, no
    global kernel): the logits and features only."""
    import torch

    model.eval()
    x = transform_input(images.float(), Transform(tuple(size)))
    grid = model.grid_for(tuple(size))
    if is_swin_model(model):
        logits, feats = zip(*(_outputs(model, c) for c in x.split(16)))
        return {"logits": torch.cat(logits), "features": torch.cat(feats), "grid": grid, "structure": None,
                "relative_score": None, "distance": np.zeros(0)}
    distances: list[np.ndarray] = []

    def on_trace(rec: list[dict]) -> None:       # one layer's (b, h, T, T) at a time, as positional.analyze
        distances.append(np.stack([mean_attention_distance(t["attn"].float().numpy(), grid, model.num_prefix).mean(-1)
                                   for t in rec], 1))                                   # (b, L)

    kern = position_kernels(model, x, chunk=_chunk(model, grid), on_trace=on_trace)
    logits, feats = zip(*(_outputs(model, c) for c in x.split(16)))
    table = analysis.position_table(model, grid)
    structure = None if table is None else analysis.structure_score(analysis.cosine_similarity(table), grid)["spearman"]
    rel = None if kern.kind == "none" else float(relative_score(kern.kernel, kern.grid).mean())
    return {"logits": torch.cat(logits), "features": torch.cat(feats), "grid": grid, "structure": structure,
            "relative_score": rel, "distance": np.concatenate(distances).mean(0)}


def sweep(model: ViT | SwinTransformer, images: Tensor, sizes: Sequence[tuple[int, int]], *,
          on_size: Callable[[int, int, tuple[int, int]], None] | None = None, rule: str = "model") -> list[SizeRow]:
    """One `SizeRow` per size of `sizes` (the native size is measured too, as the reference);
    `on_size(done, total, size)` is called before each size (a progress bar); `rule`: whose
    resampling of the tables (`RULES`; default the model's own)."""
    import torch  # lazily: the app imports this module before torch

    model = with_rule(model, rule)
    native = tuple(model.cfg.img_size)
    sizes = check_sizes([*sizes, native], model.cfg.patch_size)
    order = [native] + [s for s in sizes if s != native]
    figures = {}
    for i, size in enumerate(order):
        if on_size is not None:
            on_size(i, len(order), size)
        figures[size] = measure(model, images, size)
    ref = figures[native]
    rows = []
    for size in sizes:
        f = figures[size]
        agreement = None
        if model.cfg.num_classes:
            agreement = float((f["logits"].argmax(-1) == ref["logits"].argmax(-1)).float().mean())
        cos = torch.nn.functional.cosine_similarity(f["features"], ref["features"], dim=-1).mean()
        rows.append(SizeRow(size, f["grid"], size == native, f["structure"], f["relative_score"],
                            tuple(float(d) for d in f["distance"]), agreement, float(cos)))
    return rows


def lost_at(rows: Sequence[SizeRow], threshold: float = 0.9) -> tuple[SizeRow | None, SizeRow | None]:
    """The nearest sizes of the native aspect below and above the native one whose agreement (or,
    without a head, feature cosine) falls under `threshold`: where the model starts to lose its
    sense of position."""
    def score(r: SizeRow) -> float:
        return r.feature_cosine if r.agreement is None else r.agreement

    area = lambda r: r.size[0] * r.size[1]  # noqa: E731
    native = next(r for r in rows if r.native)
    same = [r for r in rows if r.size[0] * native.size[1] == r.size[1] * native.size[0]]   # the native aspect
    below = [r for r in same if area(r) < area(native) and score(r) < threshold]
    above = [r for r in same if area(r) > area(native) and score(r) < threshold]
    return (max(below, key=area) if below else None, min(above, key=area) if above else None)


def rows_json(rows: Sequence[SizeRow]) -> list[dict]:
    """The rows as plain JSON (the HTML report, the notebook)."""
    return [{"size": list(r.size), "grid": list(r.grid), "native": r.native,
             "structure": None if r.structure is None or math.isnan(r.structure) else round(r.structure, 4),
             "relative_score": None if r.relative_score is None else round(r.relative_score, 4),
             "distance": [round(d, 4) for d in r.distance],
             "agreement": None if r.agreement is None else round(r.agreement, 4),
             "feature_cosine": round(r.feature_cosine, 4)} for r in rows]
