"""Pieces shared by CoPE and SaPE²: gated positions and their read-out, and the precision they
are computed in (docs/encodings.md, "Mixed precision")."""
from __future__ import annotations

import contextlib

import torch
from torch import Tensor


TRIANGLE_MAX = 16  # lines up to this long are summed by one matmul (SaPE²'s rows and columns)
NPOS_MAX_LIMIT = 4096  # positions are counts along a line or sequence: far beyond any grid we build


def check_npos_max(npos_max) -> int:
    """`npos_max` (CoPE / SaPE² table length) as an int in [2, NPOS_MAX_LIMIT], else ValueError."""
    if not isinstance(npos_max, int) or isinstance(npos_max, bool) or not 2 <= npos_max <= NPOS_MAX_LIMIT:
        raise ValueError(f"npos_max must be an integer from 2 to {NPOS_MAX_LIMIT}, got {npos_max!r}")
    return npos_max


def compute_dtype(*ts: Tensor) -> torch.dtype:
    """The dtype CoPE and SaPE² compute in for inputs `ts`: float64 if any is float64, else
    float32. bf16 / fp16 inputs (autocast, a half model) are taken as the values they are and
    computed on in float32: a gate sum rounded to 8 bits of mantissa moves a position across an
    integer (a read-out from another table column), which float32 does not at these lengths."""
    return torch.float64 if any(t.dtype == torch.float64 for t in ts) else torch.float32


def full_precision(t: Tensor):
    """A context where autocast is off on `t`'s device, so that the float32 code inside stays
    float32 (CUDA autocast would run its matmuls in bf16 and its cumsums in float32: a mix
    that mismatches dtypes, and rounds positions)."""
    device = t.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.autocast(device, enabled=False)
    return contextlib.nullcontext()


def reverse_cumsum(g: Tensor) -> Tensor:
    """`p[..., m] = sum_{j >= m} g[..., j]` along the last axis (no causal cut).

    Every position is a sum of the non-negative gates only: `total - cumsum + g` is cheaper
    but rounds to small negative numbers when the last gates are ~0, and a negative position
    has no integer read-out below it. Short lines (SaPE²) take one matmul with a triangle of
    ones, cheaper there than flip-cumsum-flip; long ones (CoPE's whole sequence) the flips."""
    A = g.shape[-1]
    if A <= TRIANGLE_MAX:
        tri = torch.ones(A, A, dtype=g.dtype, device=g.device).tril_()   # [j, m] = j >= m
        return g @ tri
    return g.flip(-1).cumsum(-1).flip(-1)


def interpolate_readout(z: Tensor, p: Tensor) -> Tensor:
    """Linear interpolation of integer read-outs `z[..., t]` at fractional positions `p`.

    `z: (..., A, M+1)`, `p: (..., A, K)` with `0 <= p <= M` -> `(..., A, K)`:
    `z[p] = (p - floor p) * z[ceil p] + (1 - p + floor p) * z[floor p]`. floor/ceil carry no
    gradient: `p` gets its gradient through the interpolation weight only.
    """
    floor = p.floor()
    w = p - floor                                        # (..., A, K)
    z_floor = torch.gather(z, -1, floor.long())          # (..., A, K)
    z_ceil = torch.gather(z, -1, p.ceil().long())        # (..., A, K)
    return z_ceil * w + z_floor * (1 - w)
