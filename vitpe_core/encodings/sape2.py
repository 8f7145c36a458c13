"""SaPE², a 2D semantic-aware position encoding (Chen et al. 2025, arXiv 2505.09466).

Per layer and head, from the patch tokens only (prefix tokens get zero bias):
1. gates inside a line: `g^x_ij = σ(q_i·k_j/sqrt d)` for i, j in the same row (W x W per
   row), `g^y` likewise in the same column;
2. positions: `p^x_im = Σ_{j in row(i), x_j >= x_m} g^x_ij` (reverse cumsum, no causal cut),
   clamped at `M = npos_max - 1`;
3. read-out `z_i[t] = r_i·E[:, t]` with `r_i = q_i` (`readout="query"`, the paper's best,
   "SaPE²(K)") or `k_i` (`"key"`, "SaPE²(Q)"), interpolated at the positions;
4. descriptors `S_x[i] ∈ R^W` (one value per column of i's row), `S_y[i] ∈ R^H`;
5. bias `b_in = ‖S_x[i] − S_x[n]‖ + ‖S_y[i] − S_y[n]‖` (sign +, not scaled), diagonal 0.

Checked against a naive per-equation loop in tests/test_cope_sape2.py on several grids.
Implementation notes:
* fully batched: gates as `(B, h, H, W, W)` / `(B, h, W, H, H)` matmuls, distances from the
  Gram matrix `|a|² + |b|² − 2a·b` (no `(…, N, N, d)` tensors, no loops);
* the distance is `sqrt(d² + ε²) − ε` with `ε = 2⁻²⁰` and the diagonal masked to exactly 0,
  so the gradient is finite at zero distance; the error this adds is below ε.
"""
from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

from ._interp import interpolate_readout, reverse_cumsum
from .base import EncodingContext, PositionEncoding, pad_prefix, register_encoding

READOUTS = ("query", "key")
_EPS = 2.0 ** -20  # eps² = 2^-40 is exact in float32, so sqrt(0 + eps²) - eps == 0 exactly


def pairwise_distance(s: Tensor) -> Tensor:
    """Euclidean distances between descriptors: `(B, h, N, m) -> (B, h, N, N)`, zero diagonal,
    finite gradient everywhere."""
    sq = (s * s).sum(-1)                                                   # (B, h, N)
    d2 = sq[..., :, None] + sq[..., None, :] - 2.0 * (s @ s.transpose(-1, -2))  # (B, h, N, N)
    d2 = d2.clamp_min(0.0) * (1.0 - torch.eye(s.shape[-2], device=s.device))
    return (d2 + _EPS * _EPS).sqrt() - _EPS


def _axis_descriptors(q: Tensor, k: Tensor, r: Tensor, e: Tensor, npos_max: int) -> Tensor:
    """Descriptors along the last-but-one axis of `(B, h, L, A, d)` lines: for every token
    `(l, a)`, the interpolated read-out at the gated position of each of the A tokens of its
    line -> `(B, h, L, A, A)`."""
    scale = q.shape[-1] ** -0.5
    gates = torch.sigmoid((q * scale) @ k.transpose(-1, -2))  # (B, h, L, A, A)
    pos = reverse_cumsum(gates).clamp(max=npos_max - 1)        # (B, h, L, A, A)
    z = r @ e                                                  # (B, h, L, A, M+1)
    return interpolate_readout(z, pos)                         # (B, h, L, A, A)


def sape2_bias(q: Tensor, k: Tensor, e_x: Tensor, e_y: Tensor, grid: tuple[int, int],
               readout: str = "query", npos_max: int = 10, return_parts: bool = False):
    """SaPE² bias between patch tokens.

    `q, k: (B, h, N, d)` patch tokens only, `e_x, e_y: (d, npos_max)`, `grid = (H, W)`,
    `N = H*W` row-major. Returns the `(B, h, N, N)` float32 bias, or with `return_parts=True`
    the tuple `(bias, bias_x, bias_y)`.
    """
    H, W = grid
    B, h, N, d = q.shape
    if N != H * W:
        raise ValueError(f"q has {N} tokens but grid {grid} has {H * W}")
    if readout not in READOUTS:
        raise ValueError(f"unknown readout {readout!r}; valid: {READOUTS}")
    for name, e in (("e_x", e_x), ("e_y", e_y)):
        if e.shape != (d, npos_max):
            raise ValueError(f"{name} must have shape (d, npos_max) = {(d, npos_max)}, got {tuple(e.shape)}")
    q, k = q.float(), k.float()
    r = q if readout == "query" else k
    rows = lambda t: rearrange(t, "b h (y x) d -> b h y x d", y=H)   # lines = rows
    cols = lambda t: rearrange(t, "b h (y x) d -> b h x y d", y=H)   # lines = columns
    s_x = _axis_descriptors(rows(q), rows(k), rows(r), e_x.float(), npos_max)  # (B, h, H, W, W)
    s_y = _axis_descriptors(cols(q), cols(k), cols(r), e_y.float(), npos_max)  # (B, h, W, H, H)
    s_x = rearrange(s_x, "b h y x m -> b h (y x) m")                 # (B, h, N, W)
    s_y = rearrange(s_y, "b h x y m -> b h (y x) m")                 # (B, h, N, H)
    bias_x, bias_y = pairwise_distance(s_x), pairwise_distance(s_y)  # (B, h, N, N) each
    bias = bias_x + bias_y
    return (bias, bias_x, bias_y) if return_parts else bias


@register_encoding("sape2")
class SaPE2(PositionEncoding):
    hooks = ("bias",)

    def __init__(self, ctx: EncodingContext, *, npos_max: int = 10, readout: str = "query") -> None:
        super().__init__(ctx)
        if readout not in READOUTS:
            raise ValueError(f"unknown readout {readout!r}; valid: {READOUTS}")
        if npos_max < 2:
            raise ValueError(f"npos_max must be >= 2, got {npos_max}")
        self.npos_max, self.readout = npos_max, readout
        d = ctx.head_dim
        self.sape_x = nn.Parameter(torch.empty(ctx.depth, d, npos_max))  # (L, d, M+1)
        self.sape_y = nn.Parameter(torch.empty(ctx.depth, d, npos_max))
        nn.init.trunc_normal_(self.sape_x, std=0.02)
        nn.init.trunc_normal_(self.sape_y, std=0.02)

    def bias(self, q, k, *, grid, layer, parts=None):
        P = self.ctx.num_prefix
        out = sape2_bias(q[:, :, P:], k[:, :, P:], self.sape_x[layer], self.sape_y[layer], grid,
                         self.readout, self.npos_max, return_parts=parts is not None)
        if parts is None:
            return pad_prefix(out, P)
        bias, parts["x"], parts["y"] = out
        return pad_prefix(bias, P)

    def extra_repr(self) -> str:
        return f"readout={self.readout!r}, npos_max={self.npos_max}"
