"""Analysis: torch in, numpy out, no Streamlit.

* position tables: cosine similarity `(N, N)`, the ViT paper's Figure-7 grid `(H, W, H, W)`,
  and a 2D-structure score (Spearman correlation of similarity with minus the spatial
  distance, plus same-row / same-column summaries);
* per image and query patch: every layer/head's positional bias row and attention row as
  `(H, W)` maps, SaPE²'s x and y parts separately, for every encoding where they exist;
* per layer and head: mean attention distance (in patches) and attention entropy (nats);
* RoPE's positional kernel `mean_k cos(θ_ik − θ_jk)` for rotation encodings.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .lazy import no_grad
from .positional import attention_entropy, mean_attention_distance

# torch, and the modules that import it, are imported in the functions that use them (`no_grad`: torch's, at
# the call): the app draws its first page before torch is loaded (pages/common/warmup.py loads it in the background).
if TYPE_CHECKING:
    from torch import Tensor

    from .encodings.base import Grid
    from .model import ViT


# ----------------------------------------------------------------------------- tables
@no_grad
def position_table(model: ViT, grid: Grid | None = None, params: dict[str, Tensor] | None = None) -> Tensor | None:
    """`(N, D)` patch rows of the model's absolute table (None if it has none). `params`
    replaces the encoding's parameters (a `history` snapshot from a checkpoint)."""
    enc = model.pos_enc
    if params is not None:
        enc = copy.deepcopy(enc)
        enc.load_state_dict({k: v.float() for k, v in params.items()}, strict=False)
    grid = grid or model.cfg.grid
    table = enc.table(grid)                                  # (P'+N, D): P' = 0 for a patches-only table
    return None if table is None else table[table.shape[0] - grid[0] * grid[1]:].detach().float().cpu()


def cosine_similarity(table: Tensor | np.ndarray) -> np.ndarray:
    """`(N, D)` -> `(N, N)` cosine similarity of every pair of rows."""
    import torch

    t = torch.as_tensor(table, dtype=torch.float32).detach()
    t = t / t.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return (t @ t.T).numpy()


def similarity_grid(sim: np.ndarray, grid: Grid) -> np.ndarray:
    """`(N, N)` -> `(H, W, H, W)`: `[r, c]` is the map of patch (r, c)'s similarity to all."""
    H, W = grid
    return sim.reshape(H, W, H, W)


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank), as Spearman's rho needs."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    ranks = np.empty(len(x), dtype=np.float64)
    boundaries = np.flatnonzero(np.diff(xs)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [len(x)]))
    for s, e in zip(starts, ends):  # loops over distinct values, not elements
        ranks[order[s:e]] = (s + e - 1) / 2.0
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = _ranks(np.asarray(a, np.float64)), _ranks(np.asarray(b, np.float64))
    ra -= ra.mean()
    rb -= rb.mean()
    denom = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / denom) if denom > 0 else 0.0


def structure_score(sim: np.ndarray, grid: Grid) -> dict[str, float]:
    """How well similarity follows 2D layout, over all off-diagonal pairs:
    `spearman`: rank correlation of similarity with −Euclidean distance (1 = perfectly
    ordered by distance, 0 = no relation); `same_row`, `same_col`, `other`: mean similarity
    of pairs in the same row, the same column, neither; `neighbour`: mean similarity of
    4-neighbours."""
    from .encodings.grid import grid_coords

    r, c = (x.numpy() for x in grid_coords(grid))
    dr, dc = r[:, None] - r[None, :], c[:, None] - c[None, :]
    dist = np.sqrt(dr ** 2 + dc ** 2)
    off = ~np.eye(len(r), dtype=bool)
    row, col = (dr == 0) & off, (dc == 0) & off
    nb = (np.abs(dr) + np.abs(dc)) == 1
    mean = lambda m: float(sim[m].mean()) if m.any() else float("nan")
    return {"spearman": spearman(sim[off], -dist[off]), "same_row": mean(row), "same_col": mean(col),
            "other": mean(off & ~row & ~col), "neighbour": mean(nb)}


# ----------------------------------------------------------------------------- traces
@dataclass
class Trace:
    """One forward pass of one image with everything recorded, as numpy, batch index 0."""

    grid: Grid
    num_prefix: int
    logits: np.ndarray                              # (classes,)
    attn: np.ndarray                                # (L, h, T, T)
    bias: np.ndarray | None                         # (L, h, T, T) or None
    parts: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (L, h, N, N)
    prefix: tuple[str, ...] = ("CLS",)              # a name per prefix token, in token order
    hooks: tuple[str, ...] = ()                     # how the encoding brings in position (`PositionEncoding.hooks`)
    bias_sources: tuple[str, ...] = ()              # the encoding's parts that bias attention, by name (`sape2`, ...)

    @property
    def probs(self) -> np.ndarray:
        e = np.exp(self.logits - self.logits.max())
        return e / e.sum()


@no_grad
def trace_image(model: ViT, image: Tensor, compact: bool = False) -> Trace:
    """Run `image: (3, H_img, W_img)` (already normalised) through the trace path. `compact`: the
    trace the app keeps (`compact_trace`, the same values), each layer's maps converted as they are
    gathered and its float32 record let go: a ViT-B/16's trace never whole in float32 twice over."""
    model.eval()
    rec: list[dict] = []
    logits = model(image[None].float(), trace=rec)
    grid = model.grid_for(image.shape[-2:])
    shape = tuple(rec[0]["attn"].shape[1:])
    names = list(rec[0]["parts"] or {})
    float32_bytes = 4 * len(rec) * math.prod(shape) * (1 + (rec[0]["bias"] is not None)) + sum(
        4 * len(rec) * math.prod(rec[0]["parts"][n].shape[1:]) for n in names)
    dtype = np.float16 if compact and float32_bytes > COMPACT_ABOVE else np.float32

    def gather(get) -> np.ndarray:           # (L, ...) in `dtype`, one layer at a time
        out = None
        for i, t in enumerate(rec):
            layer = get(t).float().numpy()
            if out is None:
                out = np.empty((len(rec), *layer.shape), dtype)
            out[i] = layer
        return out

    bias = None
    if rec[0]["bias"] is not None:
        bias = gather(lambda t: t["bias"].expand(1, *shape)[0])
    parts = {n: gather(lambda t, n=n: t["parts"][n].expand(1, *t["parts"][n].shape[1:])[0]) for n in names}
    for t in rec:                            # what is left of the float32 record: the attention
        t["bias"] = t["parts"] = None
    attn = gather(lambda t: t.pop("attn")[0])
    enc = model.pos_enc
    return Trace(grid, model.num_prefix, logits[0].numpy(), attn, bias, parts, tuple(model.prefix_names()),
                 tuple(enc.hooks), tuple(p.name for p in getattr(enc, "parts", [enc]) if "bias" in p.hooks))


COMPACT_ABOVE = 4 * 2**20   # a trace whose maps take more (a 224-px model's: 21–85 MiB) is kept in float16


def trace_room(model: ViT, image_hw: tuple[int, int]) -> int:
    """Memory `trace_image(compact=True)` takes while it runs, about: twice the float32 record of
    every layer's maps (the attention; with a bias, the bias and up to two parts: SaPE²'s x and y),
    and a layer's attention-sized temporaries. For a ViT-B/16 at 224 px this says 60 MB with a
    learned table and 194 MB with SaPE² + APE; `python -m benchmarks.trace_memory` measured 53–61
    and 152–155 MB. What the app makes room for in its memory budget before tracing a big model."""
    H, W = model.grid_for(image_hw)
    tokens = model.num_prefix + H * W
    maps = 4 if "bias" in model.pos_enc.hooks else 1
    layer = 4 * model.cfg.heads * tokens * tokens
    return 2 * model.cfg.depth * layer * maps + 8 * layer


def trace_bytes(trace: Trace) -> int:
    """Bytes of a trace's maps (attention, bias, bias parts)."""
    return sum(a.nbytes for a in (trace.attn, trace.bias, *trace.parts.values()) if a is not None)


def compact_trace(trace: Trace, above: int = COMPACT_ABOVE) -> Trace:
    """The trace the app keeps in memory: a big trace's attention, bias and bias parts (every
    layer and head: the pages and their downloads show any of them) in float16, half the bytes
    (a ViT-B/16's 22–85 MiB become 11–42 MiB); the logits stay float32. Traces of at most
    `above` bytes (the compact models': ~1 MiB) are returned as they are. The functions below
    read float16 traces (their outputs are float32); values agree to float16's 3 digits."""
    if trace_bytes(trace) <= above:
        return trace
    half = lambda a: None if a is None else a.astype(np.float16)
    return Trace(trace.grid, trace.num_prefix, trace.logits, half(trace.attn), half(trace.bias),
                 {k: half(v) for k, v in trace.parts.items()}, trace.prefix, trace.hooks, trace.bias_sources)


def patch_index(patch: tuple[int, int], grid: Grid) -> int:
    r, c = patch
    if not (0 <= r < grid[0] and 0 <= c < grid[1]):
        raise ValueError(f"patch {patch} is outside the {grid[0]}x{grid[1]} grid")
    return r * grid[1] + c


def patch_maps(trace: Trace, patch: tuple[int, int]) -> dict[str, np.ndarray]:
    """For query patch `(r, c)`: `(L, h, H, W)` maps of the attention row (over patches),
    the bias row (if any) and each named bias part (e.g. SaPE²'s `x`, `y`), plus
    `cls_attn`: how much the CLS token attends to each patch (models with a CLS token)."""
    H, W = trace.grid
    P, i = trace.num_prefix, patch_index(patch, trace.grid)
    L, h = trace.attn.shape[:2]
    f32 = lambda a: a.reshape(L, h, H, W).astype(np.float32, copy=False)      # float16 traces: `compact_trace`
    out = {"attn": f32(trace.attn[:, :, P + i, P:])}
    if trace.prefix[:1] == ("CLS",):
        out["cls_attn"] = f32(trace.attn[:, :, 0, P:])
    if trace.bias is not None:
        out["bias"] = f32(trace.bias[:, :, P + i, P:])
    for name, part in trace.parts.items():
        out[name] = f32(part[:, :, i, :])
    return out


def normalize01(m: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1] over the last two axes (the paper's Figure-4 normalisation)."""
    lo = m.min(axis=(-2, -1), keepdims=True)
    hi = m.max(axis=(-2, -1), keepdims=True)
    return (m - lo) / np.where(hi > lo, hi - lo, 1.0)


def attention_stats(trace: Trace) -> dict[str, np.ndarray]:
    """Per layer and head `(L, h)`: `mean_distance` — expected Euclidean distance in patches
    from each patch query to the patches it attends to (attention renormalised over patch
    keys), averaged over queries; `entropy` — entropy in nats of each query's full
    attention row, averaged over patch queries."""
    mean_distance, entropy = [], []
    for layer in trace.attn:       # one layer's temporaries at a time (a ViT-B/16's whole trace: 22 MB each)
        attn = np.asarray(layer, dtype=np.float32)                             # (h, T, T); float16 traces
        mean_distance.append(mean_attention_distance(attn, trace.grid, trace.num_prefix))   # (h,)
        entropy.append(attention_entropy(attn, trace.num_prefix))
    return {"mean_distance": np.stack(mean_distance), "entropy": np.stack(entropy)}   # (L, h) each


@no_grad
def rope_kernel(model: ViT, grid: Grid, layer: int, patch: tuple[int, int]) -> np.ndarray | None:
    """`(h, H, W)`: the positional kernel of a rotation encoding seen from `patch`,
    `mean_k cos(θ_ik − θ_jk)` (1 where rotation leaves q·k unchanged)."""
    import torch

    ang = model.pos_enc.angles(grid, layer)               # (h|1, N, d/2) or None
    if ang is None:
        return None
    i = patch_index(patch, grid)
    k = torch.cos(ang[:, i:i + 1] - ang).mean(-1)         # (h|1, N)
    k = k.expand(model.cfg.heads, -1)
    return k.reshape(-1, *grid).float().numpy()


def positional_component(model: ViT, trace: Trace, patch: tuple[int, int]) -> tuple[str, np.ndarray] | None:
    """What the compare page shows as an encoding's positional view of `patch`, `(L, h, H, W)`:
    the bias row if the encoding has a bias, else the table similarity row, else the RoPE
    kernel; None for `none`."""
    if trace.bias is not None:
        return "bias row", patch_maps(trace, patch)["bias"]
    L, h = trace.attn.shape[:2]
    table = position_table(model, trace.grid)
    if table is not None:
        row = cosine_similarity(table)[patch_index(patch, trace.grid)].reshape(*trace.grid)
        return "table similarity", np.broadcast_to(row, (L, h, *trace.grid)).copy()
    kernels = [rope_kernel(model, trace.grid, layer, patch) for layer in range(L)]
    if kernels[0] is not None:
        return "RoPE kernel", np.stack(kernels)
    return None


def sape2_part_names(parts: dict) -> tuple[str, str] | None:
    """Trace part names of SaPE²'s x and y parts (`x`/`y` alone, `sape2.x`/`sape2.y` in a
    composite), or None when the encoding has no SaPE²."""
    xs = [n for n in parts if n == "x" or n.endswith("sape2.x")]
    return (xs[0], xs[0][:-1] + "y") if xs and xs[0][:-1] + "y" in parts else None


def reduce_head(m: np.ndarray, head: int | None) -> np.ndarray:
    """`(h, H, W)` -> `(H, W)`: one head, or the mean over heads (`head=None`)."""
    return m.mean(0) if head is None else m[head]


# ----------------------------------------------------------------------------- how loud is the bias
@no_grad
def encoding_scale(model: ViT, images: Tensor) -> dict[str, float]:
    """Per layer `l`, how large the encoding's attention bias is next to the content logits,
    on `images (B, 3, H, W)` (normalised): `enc_bias_ratio_L{l}` = std of the bias / std of
    `q·k/sqrt d` over the patch block (mean over images and heads; 0 = the bias cannot move
    attention). For SaPE² also `enc_ex_norm_L{l}`, `enc_ey_norm_L{l}`: Frobenius norms of its
    read-out tables E_x, E_y. Empty for encodings without a bias. Training records these per
    epoch (`curves`)."""
    was_training = model.training
    model.eval()
    rec: list[dict] = []
    model(images.float(), trace=rec)
    model.train(was_training)
    out: dict[str, float] = {}
    if rec[0]["bias"] is None:
        return out
    P = model.num_prefix
    for layer, t in enumerate(rec):
        q, k = t["q"][:, :, P:].float(), t["k"][:, :, P:].float()
        logits = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)                    # (B, h, N, N)
        bias = t["bias"][..., P:, P:].float().expand_as(logits)
        ratio = bias.std(dim=(-2, -1)) / logits.std(dim=(-2, -1)).clamp_min(1e-12)  # (B, h)
        out[f"enc_bias_ratio_L{layer}"] = round(float(ratio.mean()), 5)
    parts = getattr(model.pos_enc, "parts", [model.pos_enc])
    for part in parts:
        if hasattr(part, "sape_x"):
            for layer in range(part.sape_x.shape[0]):
                out[f"enc_ex_norm_L{layer}"] = round(float(part.sape_x[layer].norm()), 5)
                out[f"enc_ey_norm_L{layer}"] = round(float(part.sape_y[layer].norm()), 5)
    return out
