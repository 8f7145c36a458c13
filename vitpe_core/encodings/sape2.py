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
The model's fast path (and training) uses the fused `sape2_attention` of functional.py
(`SaPE2.attend`; on CPU its C++ kernel, `_kernels.py`, with the eager code as fallback);
`sape2_bias` here serves the trace path and anyone who wants the bias alone.
Implementation notes (speed: see BENCHMARKS.md):
* fully batched, no loops: the gate logits are the attention's own `q·k/sqrt d` (passed in,
  or one `(N x N)` matmul), their same-row and same-column entries diagonals of its
  `(H, W, H, W)` view (`_LineLogits`, one-allocation backward); both read-out tables in one
  matmul; line cumsums by `reverse_cumsum` (a matmul for short lines); no `(…, N, N, d)` tensors;
* distances and their gradient are one autograd Function (`_SaPE2Distance`): squared
  distances from one matmul of augmented vectors for both axes at once, an analytic
  backward, the result written straight into the `(B, h, T, T)` bias (one allocation);
* the diagonal is exactly 0 and, as for `torch.cdist`, the gradient at zero distance is 0.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ._interp import check_npos_max, full_precision
from .base import EncodingContext, PositionEncoding, register_encoding
from .functional import sape2_attention
from .sape2_descriptors import descriptors

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
    (torch.cdist's choice). `grad: (B, h, N, N)`, any strides (a view into the padded bias's
    gradient: no copy).

    `∂/∂s_i = Σ_n w_in (s_i - s_n) + Σ_n w_ni (s_i - s_n)` with `w = grad / dist`, computed as
    `s_i · rows_i - ((w + wᵀ) s)_i`; one matmul pair with `[s, 1]` gives both `(w + wᵀ) s` and
    the row sums (no separate reductions over the N x N weights)."""
    w = torch.div(grad, dist).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)    # (A, B, h, N, N)
    s_aug = torch.cat((s, torch.ones_like(s[..., :1])), dim=-1)               # (A, B, h, N, m+1)
    # (w + w^T) @ [s, 1], computed as [s,1]^T @ w^T + [s,1]^T @ w: with m << N the narrow output
    # is about twice as fast on CPU, and w^T stays a view (no N x N copy)
    s_t = s_aug.transpose(-1, -2)                                             # (A, B, h, m+1, N)
    ws_t = torch.matmul(s_t, w.transpose(-1, -2)) + torch.matmul(s_t, w)      # (A, B, h, m+1, N)
    rows = ws_t[..., -1:, :].transpose(-1, -2)                                # (A, B, h, N, 1)
    return s * rows - ws_t[..., :-1, :].transpose(-1, -2)                     # (A, B, h, N, m)


class _SaPE2Distance(torch.autograd.Function):
    """`b_in = ‖S_x[i] − S_x[n]‖ + ‖S_y[i] − S_y[n]‖` written straight into a `(B, h, P+N, P+N)`
    tensor whose prefix rows/columns stay 0."""

    @staticmethod
    def forward(ctx, s_x: Tensor, s_y: Tensor, num_prefix: int, return_parts: bool):
        B, h, N, _ = s_x.shape
        P = num_prefix
        s = _stack((s_x, s_y))                                                # (2, B, h, N, m)
        dist = _distances(s)                                                  # (2, B, h, N, N)
        out = s.new_empty(B, h, P + N, P + N)                                 # (B, h, T, T)
        out[..., :P, :].zero_()                                               # prefix rows and columns: 0
        out[..., P:, :P].zero_()
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
        g = _distances_backward(s, dist, grad[..., P:, P:])                   # (2, B, h, N, m)
        return g[0, ..., :w_x], g[1, ..., :w_y], None, None


class _LineLogits(torch.autograd.Function):
    """Same-row and same-column entries of the logits `(B, h, P+N, P+N)`: `row (B, h, H, W, W)`
    (`row[y, x, u]` = logit of patch (y, x) to (y, u)) and `col (B, h, W, H, H)` (`col[x, y, v]`
    = logit of (y, x) to (v, x)), both diagonals of the `(H, W, H, W)` view of the patch block.
    The backward writes both into one zero tensor (autograd's diagonal backward would
    allocate one padded N x N tensor per axis and add them)."""

    @staticmethod
    def forward(ctx, logits: Tensor, grid: tuple[int, int], num_prefix: int):
        H, W = grid
        P = num_prefix
        l6 = logits[..., P:, P:].unflatten(-1, (H, W)).unflatten(-3, (H, W))  # (B, h, H, W, H, W)
        row = l6.diagonal(dim1=2, dim2=4).permute(0, 1, 4, 2, 3)             # (B, h, H, W, W)
        col = l6.diagonal(dim1=3, dim2=5).permute(0, 1, 4, 2, 3)             # (B, h, W, H, H)
        ctx.shape, ctx.grid, ctx.num_prefix = logits.shape, grid, P
        return (row.clone(memory_format=torch.contiguous_format),
                col.clone(memory_format=torch.contiguous_format))

    @staticmethod
    def backward(ctx, grad_row: Tensor, grad_col: Tensor):
        H, W = ctx.grid
        P = ctx.num_prefix
        g = grad_row.new_zeros(ctx.shape)                                     # (B, h, T, T)
        g6 = g[..., P:, P:].unflatten(-1, (H, W)).unflatten(-3, (H, W))       # (B, h, H, W, H, W)
        # the pair (i, i) lies on both diagonals: add, do not overwrite
        g6.diagonal(dim1=2, dim2=4).add_(grad_row.permute(0, 1, 3, 4, 2))    # (B, h, W, W, H)
        g6.diagonal(dim1=3, dim2=5).add_(grad_col.permute(0, 1, 3, 4, 2))    # (B, h, H, H, W)
        return g, None, None


def sape2_bias(q: Tensor, k: Tensor, e_x: Tensor, e_y: Tensor, grid: tuple[int, int],
               readout: str = "query", npos_max: int = 10, return_parts: bool = False, *,
               num_prefix: int = 0, logits: Tensor | None = None):
    """SaPE² bias between patch tokens.

    `q, k: (B, h, N, d)` patch tokens only, `e_x, e_y: (d, npos_max)`, `grid = (H, W)`,
    `N = H*W` row-major. Returns the `(B, h, N, N)` float32 bias (computed in float32 from
    half inputs, with autocast off: docs/encodings.md, "Mixed precision"), or with `return_parts=True`
    the tuple `(bias, bias_x, bias_y)`. With `num_prefix=P` the bias comes already padded to
    `(B, h, P+N, P+N)` with zero prefix rows/columns (the parts stay `(B, h, N, N)`).
    `logits`: `q·k^T/sqrt d` over all `P+N` tokens when the caller has them already (the
    attention does); the gates then reuse them instead of a second matmul.
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
    with full_precision(q):                                                   # float32 under autocast too
        q, k = q.float(), k.float()
        r = q if readout == "query" else k
        P = num_prefix
        if logits is None:  # all gate logits in one matmul, over the patches only
            logits, offset = (q * d ** -0.5) @ k.transpose(-1, -2), 0             # (B, h, N, N)
        elif logits.shape[-2:] != (P + N, P + N):
            raise ValueError(f"logits must cover the {P}+{N} tokens, got shape {tuple(logits.shape)}")
        else:
            offset = P                                                            # (B, h, P+N, P+N)
        row_logits, col_logits = _LineLogits.apply(logits.float(), grid, offset)  # (B,h,H,W,W), (B,h,W,H,H)
        s_x, s_y = descriptors(row_logits, col_logits, r, e_x, e_y, grid, npos_max)  # (B,h,N,W), (B,h,N,H)
        return _SaPE2Distance.apply(s_x, s_y, num_prefix, return_parts)          # (B, h, P+N, P+N)


@register_encoding("sape2")
class SaPE2(PositionEncoding):
    hooks = ("bias",)
    uses_logits = True

    def __init__(self, ctx: EncodingContext, *, npos_max: int = 10, readout: str = "query") -> None:
        super().__init__(ctx)
        if readout not in READOUTS:
            raise ValueError(f"unknown readout {readout!r}; valid: {READOUTS}")
        self.npos_max, self.readout = check_npos_max(npos_max), readout
        d = ctx.head_dim
        self.sape_x = nn.Parameter(torch.empty(ctx.depth, d, npos_max))  # (L, d, M+1)
        self.sape_y = nn.Parameter(torch.empty(ctx.depth, d, npos_max))
        nn.init.trunc_normal_(self.sape_x, std=0.02)
        nn.init.trunc_normal_(self.sape_y, std=0.02)

    def bias(self, q, k, *, grid, layer, parts=None, logits=None):
        P = self.ctx.num_prefix
        out = sape2_bias(q[:, :, P:], k[:, :, P:], self.sape_x[layer], self.sape_y[layer], grid, self.readout,
                         self.npos_max, return_parts=parts is not None, num_prefix=P,
                         logits=logits)                                          # (B, h, T, T)
        if parts is None:
            return out
        bias, parts["x"], parts["y"] = out
        return bias

    def attend(self, q, k, v, *, grid, layer, scale, qkv=None):
        return sape2_attention(q, k, v, self.sape_x[layer], self.sape_y[layer], grid, self.readout,
                               self.npos_max, num_prefix=self.ctx.num_prefix, scale=scale, qkv=qkv)

    def extra_repr(self) -> str:
        return f"readout={self.readout!r}, npos_max={self.npos_max}"
