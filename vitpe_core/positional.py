"""How a ViT encodes position: position-only kernels, a relative-vs-absolute score, attention
distance by depth and attention rollout (docs/encodings.md, "Position-only kernels").

A *position-only kernel* is the part of the attention logit (or of the bias) that depends on
the positions of query and key alone: `K[l, h, i, n]` over patch pairs `(N, N)`, per layer
and head. Per kind of encoding:

* relative position bias (`rpb`): its bias, a function of the offset by construction;
* a rotation (`rope_*`): `q̄ᵀ R(φ_i − φ_n) k̄ / sqrt d`, the logit of the mean query and mean key
  (over the image set's patches, per layer and head) rotated to the two positions: what
  RoPE adds to attention when content is held at its average;
* an absolute table (learned or fixed): layer 0's logit between `LN(μ + p_i)` and
  `LN(μ + p_n)`, with `μ` the image set's mean patch embedding and `p` the table rows
  (later layers mix content in, so only layer 0 is defined);
* content-dependent biases (`cope`, `sape2`): the bias averaged over the image set, with its
  standard deviation across images as the spread.

`relative_score` is the share of a kernel's variance that the offset `(Δr, Δc)` alone
explains: 1 for a purely relative kernel, near 0 for one that ignores offsets. `query_fit`
reads one query's row of a kernel against the same offset fit plus a constant per query (the
app's per-query view): an R² of a fit made on all rows, negative where the row differs from
the shared pattern more than from a flat row. Both come from `offset_fit`; the views only lay them out.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .lazy import no_grad

# torch, and the modules that import it, are imported in the functions that use them (`no_grad`: torch's, at
# the call): the app draws its first page before torch is loaded (pages/common/warmup.py loads it in the background).
if TYPE_CHECKING:
    from torch import Tensor

    from .encodings.base import Grid
    from .model import ViT


@dataclass
class Kernels:
    """Position-only kernels of one model on one image set."""

    kind: str                       # "bias", "rotation", "table", "none"
    grid: Grid
    kernel: np.ndarray              # (L', h, N, N); L' = L, or 1 for a table (layer 0 only)
    spread: np.ndarray | None = None  # (L', h, N, N) std across images (content-dependent biases)
    layers: list[int] = field(default_factory=list)


# ----------------------------------------------------------------------------- offsets
def offset_map(kernel: np.ndarray, grid: Grid) -> np.ndarray:
    """`(..., N, N)` -> `(..., 2H-1, 2W-1)`: the mean over patch pairs `(i, n)` of each offset
    `(r_i - r_n, c_i - c_n)`, centred (index `(H-1, W-1)` is offset 0)."""
    from .encodings.grid import relative_index  # lazily: it imports torch

    H, W = grid
    idx = relative_index(grid).numpy().ravel()                                  # (N*N,)
    size = (2 * H - 1) * (2 * W - 1)
    counts = np.bincount(idx, minlength=size)                                    # every offset occurs
    rows = kernel.reshape(-1, idx.size)
    sums = np.stack([np.bincount(idx, weights=row, minlength=size) for row in rows])
    return (sums / counts).reshape(*kernel.shape[:-2], 2 * H - 1, 2 * W - 1)


def offset_fit(kernel: np.ndarray, grid: Grid, *, per_query: bool = False, iters: int = 100) -> np.ndarray:
    """The least-squares fit of `(..., N, N)` kernels by a function of the offset alone,
    `f[offset(i, n)]` (the offset means: `offset_map`), or with `per_query` by
    `f[offset(i, n)] + c[i]`, a relative kernel plus a constant per query (which softmax
    ignores), by alternating means (converges: two-way means on an unbalanced design); `(..., N, N)`."""
    from .encodings.grid import relative_index

    idx = relative_index(grid).numpy()                                           # (N, N)
    flat = lambda k: offset_map(k, grid).reshape(*k.shape[:-2], -1)              # (..., offsets)
    c = np.zeros((*kernel.shape[:-1], 1))                                        # (..., N, 1)
    for _ in range(iters if per_query else 0):
        c_new = (kernel - flat(kernel - c)[..., idx]).mean(-1, keepdims=True)
        done = np.abs(c_new - c).max() < 1e-10
        c = c_new
        if done:
            break
    return flat(kernel - c)[..., idx] + c


def _explained(values: np.ndarray, fitted: np.ndarray, axis: tuple[int, ...]) -> np.ndarray:
    """`1 - Σ (values - fitted)² / Σ (values - mean)²` over `axis`; 1 where `values` is constant."""
    resid = ((values - fitted) ** 2).sum(axis=axis)
    total = ((values - values.mean(axis=axis, keepdims=True)) ** 2).sum(axis=axis)
    return np.where(total > 1e-20, 1.0 - resid / np.maximum(total, 1e-30), 1.0)


def relative_score(kernel: np.ndarray, grid: Grid) -> np.ndarray:
    """Share of the variance of `(..., N, N)` kernels explained by the offset alone, `(...)`:
    `1 - Σ (K - K̄[offset])² / Σ (K - K̄)²` over all patch pairs (1 = purely relative; a
    constant kernel counts as relative). The measure the analysis stores (`analyze`) and the
    README table and docs/encodings.md report."""
    return _explained(kernel, offset_fit(kernel, grid), (-2, -1))


def query_fit(kernel: np.ndarray, grid: Grid, query: int) -> float:
    """How well query `query`'s row of an `(N, N)` kernel follows the offset pattern shared by
    all queries: the whole kernel's `offset_fit` with a constant per query (softmax ignores
    that constant), scored on this row alone as `1 − Σ_n (K[i,n] − fit[i,n])² / Σ_n (K[i,n] −
    mean_n K[i,n])²`. An R² of a fit made on *all* rows, so it lies in `(−∞, 1]`: 1 = the query
    sees exactly what every other query sees, shifted (a relative kernel, even with a
    per-query constant added: 1 at every query); 0 = the shared pattern predicts this row no
    better than a flat row at its mean; below 0 = worse than flat, the query sees a pattern of
    its own (the shipped `sincos2d` at patch (4, 4), mean of heads: −2.02). Not clipped.
    `relative_score` scores the whole kernel without that constant (a share, in `[0, 1]`)."""
    row = kernel[query]
    return float(_explained(row, offset_fit(kernel, grid, per_query=True)[query], (-1,)))


# ----------------------------------------------------------------------------- kernels per kind
@no_grad
def _traces(model: ViT, images: Tensor) -> list[dict]:
    model.eval()
    rec: list[dict] = []
    model(images.float(), trace=rec)
    return rec


@no_grad
def position_kernels(model: ViT, images: Tensor, *, chunk: int = 8,
                     on_trace: Callable[[list[dict]], None] | None = None, progress: str | None = None) -> Kernels:
    """The position-only kernels of `model` on `images (B, 3, H, W)` (normalised, all the same
    size), by the encoding's kind (module doc). A composite with a bias (`sape2+ape`) is
    described by its bias; one with a rotation and no bias by its rotation.

    One traced forward pass, `chunk` images at a time (memory stays bounded for large models);
    `on_trace(rec)` sees each chunk's trace (`analyze` takes its attention statistics from the
    same pass); `progress`: a tqdm description, or None for no bar."""
    import torch
    from tqdm.auto import tqdm

    enc, grid, P = model.pos_enc, model.grid_for(images.shape[-2:]), model.num_prefix
    kind, layers = None, 0
    s1 = s2 = q_sum = k_sum = None          # running sums over images (bias) or image patches (rotation)
    angles: list[Tensor] = []
    for x in tqdm(images.split(chunk), desc=progress, disable=progress is None):
        rec = _traces(model, x)
        if on_trace is not None:
            on_trace(rec)
        if kind is None:
            kind = ("bias" if rec[0]["bias"] is not None else "rotation" if "rotation" in enc.hooks
                    else "table" if "table" in enc.hooks else "none")
            layers = len(rec)
            angles = [enc.angles(grid, layer).float() for layer in range(layers)] if kind == "rotation" else []
        if kind == "bias":
            b = torch.stack([t["bias"][..., P:, P:].expand(x.shape[0], -1, -1, -1) for t in rec])  # (L, b, h, N, N)
            b = b.double()
            s1 = b.sum(1) if s1 is None else s1 + b.sum(1)
            s2 = (b * b).sum(1) if s2 is None else s2 + (b * b).sum(1)
        elif kind == "rotation":   # the trace keeps q, k after rotation: undo it per patch for the content's mean
            q = torch.stack([_unrotate(t["q"][:, :, P:].float(), a).sum((0, 2)) for t, a in zip(rec, angles)])
            k = torch.stack([_unrotate(t["k"][:, :, P:].float(), a).sum((0, 2)) for t, a in zip(rec, angles)])
            q_sum = q if q_sum is None else q_sum + q                            # (L, h, d)
            k_sum = k if k_sum is None else k_sum + k
    n = len(images)
    if kind == "bias":
        mean = s1 / n
        std = (s2 / n - mean * mean).clamp_min(0).sqrt()
        return Kernels("bias", grid, mean.float().numpy(), std.float().numpy(), list(range(layers)))
    if kind == "rotation":
        N = grid[0] * grid[1]
        return Kernels("rotation", grid, rotation_kernels(q_sum / (n * N), k_sum / (n * N), angles), None,
                       list(range(layers)))
    if kind == "table":
        return Kernels("table", grid, table_kernel(model, images)[None], None, [0])
    return Kernels("none", grid, np.zeros((layers, model.cfg.heads, grid[0] * grid[1], grid[0] * grid[1])),
                   None, list(range(layers)))


def rotation_kernels(q: Tensor, k: Tensor, angles: list[Tensor]) -> np.ndarray:
    """`(L, h, N, N)`: `Re Σ_j z̄q_j conj(z̄k_j) e^{i(φ_ij − φ_nj)} / sqrt d`, with `z̄q, z̄k` the mean
    query and key of the patches (`q, k (L, h, d)`, before rotation, as complex pairs) and `φ`
    the encoding's angles per layer (`(h|1, N, d/2)` each)."""
    import torch

    out = []
    for qm, km, ang in zip(q, k, angles):
        zq = torch.complex(qm[..., 0::2], qm[..., 1::2])                        # (h, d/2)
        zk = torch.complex(km[..., 0::2], km[..., 1::2])
        phase = ang[:, :, None, :] - ang[:, None, :, :]                          # (h|1, N, N, d/2)
        rot = torch.polar(torch.ones_like(phase), phase)
        kern = ((zq * zk.conj())[:, None, None, :] * rot).real.sum(-1)          # (h, N, N)
        out.append((kern * qm.shape[-1] ** -0.5).numpy())
    return np.stack(out)


def _unrotate(x: Tensor, ang: Tensor) -> Tensor:
    """Inverse of `encodings.base.rotate_patches` on patch tokens `(B, h, N, d)`."""
    import torch

    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos + x2 * sin, -x1 * sin + x2 * cos), dim=-1).flatten(-2)


@no_grad
def table_kernel(model: ViT, images: Tensor) -> np.ndarray:
    """`(h, N, N)`: layer 0's logits between the table's rows with content held at the image
    set's mean patch embedding: `q_i = W_q LN(μ + p_i)`, `k_n = W_k LN(μ + p_n)`."""
    grid = model.grid_for(images.shape[-2:])
    N = grid[0] * grid[1]
    patches = model.patch_embed.proj(images.float()).flatten(2).transpose(1, 2)  # (B, N, D)
    mu = patches.mean((0, 1))                                                    # (D,)
    table = model.pos_enc.table(grid)                                            # (P'+N, D)
    x = mu + table[table.shape[0] - N:]                                          # (N, D)
    x = model.blocks[0].norm1(model.norm_pre(x) if model.cfg.pre_norm else x)    # CLIP: its LayerNorm first
    attn = model.blocks[0].attn
    q, k, _ = attn.qkv(x).reshape(N, 3, attn.heads, -1).permute(1, 2, 0, 3)      # (h, N, d) each
    return ((q * attn.scale) @ k.transpose(-1, -2)).numpy()                      # (h, N, N)


# ----------------------------------------------------------------------------- attention by depth
def mean_attention_distance(attn: np.ndarray, grid: Grid, num_prefix: int) -> np.ndarray:
    """`attn (..., T, T)` -> `(...)`: the expected distance in patches from each patch query to
    the patches it attends to (weights renormalised over patch keys), averaged over queries
    (the ViT paper's Figure 7, right)."""
    from .encodings.grid import grid_coords

    r, c = (x.numpy() for x in grid_coords(grid))
    dist = np.sqrt((r[:, None] - r[None]) ** 2 + (c[:, None] - c[None]) ** 2)   # (N, N)
    a = attn[..., num_prefix:, num_prefix:]
    a = a / np.clip(a.sum(-1, keepdims=True), 1e-12, None)
    return (a * dist).sum(-1).mean(-1)


def attention_entropy(attn: np.ndarray, num_prefix: int) -> np.ndarray:
    """`attn (..., T, T)` -> `(...)`: the entropy in nats of each patch query's full attention row,
    averaged over patch queries."""
    rows = np.clip(attn[..., num_prefix:, :], 1e-12, None)
    return -(rows * np.log(rows)).sum(-1).mean(-1)


def rollout(attn: np.ndarray, fusion: str = "mean") -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020): `attn (L, h, T, T)` -> `(T, T)`, the product
    over layers of `0.5 A_l + 0.5 I` (rows renormalised), `A_l` the heads fused by their mean
    or max; row `i` is how much each input token flows into token `i` at the output."""
    if fusion not in ("mean", "max"):
        raise ValueError(f"unknown head fusion {fusion!r}; valid: mean, max")
    T = attn.shape[-1]
    out = np.eye(T)
    for a in attn:
        a = np.asarray(a, dtype=np.float32)                                       # float16 traces (compact)
        fused = a.mean(0) if fusion == "mean" else a.max(0)                      # (T, T)
        step = 0.5 * fused + 0.5 * np.eye(T)
        step = step / step.sum(-1, keepdims=True)
        out = step @ out
    return out


def rollout_sources(num_prefix: int, prefix_names: tuple[str, ...] | list[str]) -> list[str]:
    """The tokens whose rollout the bias explorer offers: the query patch, then every prefix
    token by name (CLS, dist, reg 0, …; none for a model without prefix tokens)."""
    assert len(prefix_names) == num_prefix, (prefix_names, num_prefix)
    return ["patch", *prefix_names]


def rollout_map(attn: np.ndarray, grid: Grid, num_prefix: int, token: int, fusion: str = "mean"
                ) -> tuple[np.ndarray, float]:
    """Rollout of token `token` (an index into the `T = P + N` tokens) over the input patches:
    `(H, W)` (row `token` of `rollout(attn, fusion)`, patch columns), and the share of its
    flow that comes from the prefix tokens (the map sums to 1 minus that share)."""
    return rollout_row(rollout(attn, fusion), grid, num_prefix, token)


def rollout_row(rolled: np.ndarray, grid: Grid, num_prefix: int, token: int) -> tuple[np.ndarray, float]:
    """`rollout_map` from an already computed `rollout` `(T, T)` (the app caches it per image)."""
    row = rolled[token]                                                          # (T,)
    return row[num_prefix:].reshape(grid), float(row[:num_prefix].sum())


# ----------------------------------------------------------------------------- one checkpoint, one image set
def image_set(ckpt) -> Tensor:
    """The fixed image set the statistics are taken on: every gallery image (the CIFAR-10 test
    images, then the photos) as `ckpt`'s model takes it, `(B, 3, H, W)`."""
    import torch

    from .gallery import gallery_ids, gallery_image
    from .inputs import checkpoint_input
    return torch.stack([checkpoint_input(gallery_image(i), ckpt) for i in gallery_ids()])


CHUNK_BYTES = 24 * 2**20   # one chunk's attention maps at most (a 224-px ViT-B's image alone: 21 MiB)


def _chunk(model: ViT, grid: Grid) -> int:
    """Images per traced pass in `analyze`: 8, fewer for big models so that a pass's attention
    `(b, L, h, T, T)` float32 stays near `CHUNK_BYTES` (the pass keeps several arrays of that
    size: a ViT-B/16 at 8 images a pass peaked 1.3 GB above its weights, in the app's server)."""
    T = model.num_prefix + grid[0] * grid[1]
    per_image = model.cfg.depth * model.cfg.heads * T * T * 4
    return max(1, min(8, CHUNK_BYTES // per_image))


@no_grad
def analyze(ckpt, progress: bool = False) -> tuple[dict, dict[str, np.ndarray]]:
    """Summary (JSON-able: the relative score per layer and head and its mean, mean attention
    distance and entropy per layer and head, on `image_set`) and the arrays behind it
    (`kernel`, `spread`, `offset_kernel`, `mean_distance`, `entropy`). One traced forward pass
    over the image set gives both the kernels and the attention statistics."""
    model, images = ckpt.model.eval(), image_set(ckpt)
    grid, distances, entropies = model.grid_for(images.shape[-2:]), [], []

    def attention_stats(rec: list[dict]) -> None:
        # One layer at a time: the temporaries are a layer's (b, h, T, T), not all layers' (a ViT-B/16's
        # five 22 MB copies made the compare page the big memory walk's peak, issue 47).
        dist, ent = [], []
        for t in rec:
            attn = t["attn"].float().numpy()                                     # (b, h, T, T)
            dist.append(mean_attention_distance(attn, grid, model.num_prefix))  # (b, h)
            ent.append(attention_entropy(attn, model.num_prefix))
        distances.append(np.stack(dist, 1))                                      # (b, L, h)
        entropies.append(np.stack(ent, 1))

    kern = position_kernels(model, images, on_trace=attention_stats, chunk=_chunk(model, grid),
                            progress=f"{ckpt.name}: {len(images)} images" if progress else None)
    dist, ent = np.concatenate(distances).mean(0), np.concatenate(entropies).mean(0)   # (L, h)
    score = relative_score(kern.kernel, kern.grid)                               # (L', h)
    summary = {"kind": kern.kind, "layers": kern.layers, "images": int(len(images)),
               "relative_score": None if kern.kind == "none" else round(float(score.mean()), 4),
               "relative_score_by_layer_head": np.round(score, 4).tolist(),
               "mean_distance": np.round(dist, 4).tolist(), "entropy": np.round(ent, 4).tolist()}
    arrays = {"kind": np.array(kern.kind), "kernel": kern.kernel.astype(np.float32),
              "offset_kernel": offset_map(kern.kernel, kern.grid).astype(np.float32),
              "mean_distance": dist, "entropy": ent, "relative_score": score}
    if kern.spread is not None:
        arrays["spread"] = kern.spread.astype(np.float32)
    return summary, arrays


def cache_path(checkpoint: str | Path) -> Path:
    """`NAME.analysis.npz` beside `NAME.safetensors`."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.stem + ".analysis.npz")


def _fingerprint(checkpoint: Path) -> str:
    """The checkpoint's content hash (stable across clones, unlike a modification time)."""
    import hashlib
    h = hashlib.sha256()
    with open(checkpoint, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest() + "-v1"


def write_cache(checkpoint: str | Path, arrays: dict[str, np.ndarray]) -> Path:
    """Store `analyze`'s arrays beside the checkpoint, stamped with its content hash."""
    from .checkpoint import atomic_write_bytes
    buf = io.BytesIO()
    np.savez_compressed(buf, fingerprint=np.array(_fingerprint(Path(checkpoint))), **arrays)
    path = cache_path(checkpoint)
    atomic_write_bytes(path, buf.getvalue())
    return path


def read_cache(checkpoint: str | Path) -> dict[str, np.ndarray] | None:
    """The cached arrays, or None when missing, unreadable or written for another version of
    the checkpoint (a retrained file invalidates its cache)."""
    path = cache_path(checkpoint)
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["fingerprint"]) != _fingerprint(Path(checkpoint)):
                return None
            return {k: z[k] for k in z.files if k != "fingerprint"}
    except (OSError, ValueError, KeyError):
        return None
