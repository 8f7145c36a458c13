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
Implementation notes (speed: see BENCHMARKS.md):
* fully batched, no loops: all gate logits come from one `(N x N)` matmul whose same-row and
  same-column entries are diagonals of its `(H, W, H, W)` view; both read-out tables in one
  matmul; no `(…, N, N, d)` tensors;
* distances and their gradient are one autograd Function (`_SaPE2Distance`): squared
  distances from one matmul of augmented vectors for both axes at once, an analytic
  backward, the result written straight into the `(B, h, T, T)` bias (one allocation);
* the diagonal is exactly 0 and, as for `torch.cdist`, the gradient at zero distance is 0.
"""
from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

from ._interp import interpolate_readout, reverse_cumsum
from .base import EncodingContext, PositionEncoding, register_encoding

READOUTS = ("query", "key")


def _stack(descriptors: tuple[Tensor, ...]) -> Tensor:
    """Descriptors of different widths `(B, h, N, m_a)` zero-padded into one `(A, B, h, N, m)`
    (zero columns change no distance)."""
    m = max(s.shape[-1] for s in descriptors)
    out = descriptors[0].new_zeros(len(descriptors), *descriptors[0].shape[:-1], m)
    for a, s in enumerate(descriptors):
        out[a, ..., : s.shape[-1]] = s
    return out


def _distances(s: Tensor) -> Tensor:
    """`(A, B, h, N, m) -> (A, B, h, N, N)` Euclidean distances, diagonal exactly 0.

    One matmul of augmented vectors gives the squared distances directly:
    `[−2s_i, |s_i|², 1] · [s_n, 1, |s_n|²] = |s_i − s_n|²`."""
    sq = (s * s).sum(-1, keepdim=True)                                        # (A, B, h, N, 1)
    one = torch.ones_like(sq)
    left = torch.cat((s * -2.0, sq, one), dim=-1)                             # (A, B, h, N, m+2)
    right = torch.cat((s, one, sq), dim=-1)                                   # (A, B, h, N, m+2)
    d2 = torch.matmul(left, right.transpose(-1, -2))                          # (A, B, h, N, N)
    d2.diagonal(dim1=-2, dim2=-1).zero_()
    return d2.clamp_min_(0.0).sqrt_()


def _distances_backward(s: Tensor, dist: Tensor, grad: Tensor) -> Tensor:
    """Gradient of `sum(grad * dist)` w.r.t. `s: (A, B, h, N, m)`; zero where a distance is 0
    (torch.cdist's choice)."""
    w = torch.div(grad, dist).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)    # (A, B, h, N, N)
    wt = w.transpose(-1, -2)                                                  # a view: no N x N copy
    rows = w.sum(-1, keepdim=True) + wt.sum(-1, keepdim=True)                 # (A, B, h, N, 1)
    return s * rows - torch.matmul(w, s) - torch.matmul(wt, s)                # (A, B, h, N, m)


class _SaPE2Distance(torch.autograd.Function):
    """`b_in = ‖S_x[i] − S_x[n]‖ + ‖S_y[i] − S_y[n]‖` written straight into a `(B, h, P+N, P+N)`
    tensor whose prefix rows/columns stay 0."""

    @staticmethod
    def forward(ctx, s_x: Tensor, s_y: Tensor, num_prefix: int, return_parts: bool):
        B, h, N, _ = s_x.shape
        P = num_prefix
        s = _stack((s_x, s_y))                                                # (2, B, h, N, m)
        dist = _distances(s)                                                  # (2, B, h, N, N)
        out = s.new_zeros(B, h, P + N, P + N)                                 # (B, h, T, T)
        torch.add(dist[0], dist[1], out=out[..., P:, P:])
        ctx.save_for_backward(s, dist)
        ctx.num_prefix, ctx.widths = P, (s_x.shape[-1], s_y.shape[-1])
        if return_parts:
            d_x, d_y = dist[0].clone(), dist[1].clone()
            ctx.mark_non_differentiable(d_x, d_y)
            return out, d_x, d_y
        return out

    @staticmethod
    def backward(ctx, grad: Tensor, *_):
        s, dist = ctx.saved_tensors
        P, (w_x, w_y) = ctx.num_prefix, ctx.widths
        g = _distances_backward(s, dist, grad[None, ..., P:, P:])             # (2, B, h, N, m)
        return g[0, ..., :w_x], g[1, ..., :w_y], None, None


def _line_descriptors(gate_logits: Tensor, z: Tensor, npos_max: int) -> Tensor:
    """Descriptors along lines: `gate_logits: (B, h, L, A, A)` (token `a` of a line against
    every token of the same line), `z: (B, h, L, A, M+1)` read-outs -> `(B, h, L, A, A)`:
    for token `(l, a)`, its read-out at the gated position of each of the A tokens of its line."""
    pos = reverse_cumsum(torch.sigmoid(gate_logits)).clamp(max=npos_max - 1)  # (B, h, L, A, A)
    return interpolate_readout(z, pos)                                         # (B, h, L, A, A)


def sape2_bias(q: Tensor, k: Tensor, e_x: Tensor, e_y: Tensor, grid: tuple[int, int],
               readout: str = "query", npos_max: int = 10, return_parts: bool = False, *,
               num_prefix: int = 0):
    """SaPE² bias between patch tokens.

    `q, k: (B, h, N, d)` patch tokens only, `e_x, e_y: (d, npos_max)`, `grid = (H, W)`,
    `N = H*W` row-major. Returns the `(B, h, N, N)` float32 bias, or with `return_parts=True`
    the tuple `(bias, bias_x, bias_y)`. With `num_prefix=P` the bias comes already padded to
    `(B, h, P+N, P+N)` with zero prefix rows/columns (the parts stay `(B, h, N, N)`).
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
    # all gate logits in one matmul; same-row and same-column pairs are diagonals of its 6D view
    logits = rearrange((q * d ** -0.5) @ k.transpose(-1, -2), "b h (y x) (v u) -> b h y x v u", y=H, v=H)
    row_logits = logits.diagonal(dim1=2, dim2=4).permute(0, 1, 4, 2, 3)      # (B, h, H, W, W)
    col_logits = logits.diagonal(dim1=3, dim2=5).permute(0, 1, 4, 2, 3)      # (B, h, W, H, H)
    z = r @ torch.cat((e_x, e_y), dim=1).float()                             # (B, h, N, 2(M+1))
    z_x = rearrange(z[..., :npos_max], "b h (y x) t -> b h y x t", y=H)      # (B, h, H, W, M+1)
    z_y = rearrange(z[..., npos_max:], "b h (y x) t -> b h x y t", y=H)      # (B, h, W, H, M+1)
    s_x = _line_descriptors(row_logits, z_x, npos_max)                       # (B, h, H, W, W)
    s_y = _line_descriptors(col_logits, z_y, npos_max)                       # (B, h, W, H, H)
    s_x = rearrange(s_x, "b h y x m -> b h (y x) m")                         # (B, h, N, W)
    s_y = rearrange(s_y, "b h x y m -> b h (y x) m")                         # (B, h, N, H)
    return _SaPE2Distance.apply(s_x, s_y, num_prefix, return_parts)          # (B, h, P+N, P+N)


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
        out = sape2_bias(q[:, :, P:], k[:, :, P:], self.sape_x[layer], self.sape_y[layer], grid, self.readout,
                         self.npos_max, return_parts=parts is not None, num_prefix=P)  # (B, h, T, T)
        if parts is None:
            return out
        bias, parts["x"], parts["y"] = out
        return bias

    def extra_repr(self) -> str:
        return f"readout={self.readout!r}, npos_max={self.npos_max}"
