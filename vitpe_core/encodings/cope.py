"""CoPE, Contextual Position Encoding (Golovneva et al. 2024, arXiv 2405.18719), non-causal,
over the raster-flattened sequence of all T tokens, as the SaPE² paper's ViT baseline.

`g_ij = σ(q_i·k_j/sqrt d)`, `p_ij = Σ_{t>=j} g_it` clamped at `M = npos_max-1`,
`z_i[t] = q_i·e[t]`, bias `b_ij = z_i[p_ij]` (linear interpolation).
Checked against a naive per-equation loop in tests/test_cope_sape2.py. The model's fast path
uses the fused `cope_attention` of functional.py (`CoPE.attend`; on CPU its C++ kernel); `cope_bias` serves the trace.
Deviation: none from docs/encodings.md; `e` is trunc-normal(0.02) initialised (the reference
code uses zeros, which gives the gates no gradient at the first step).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ._interp import check_npos_max, full_precision, interpolate_readout, reverse_cumsum
from .base import EncodingContext, PositionEncoding, register_encoding
from .functional import cope_attention


def cope_bias(q: Tensor, k: Tensor, e: Tensor, npos_max: int = 10, *, logits: Tensor | None = None) -> Tensor:
    """`q, k: (B, h, T, d)`, `e: (d, npos_max)` -> bias `(B, h, T, T)` float32 (from half inputs
    too, autocast off: docs/encodings.md, "Mixed precision"). `logits`: `q·k^T/sqrt d` when
    the caller has it already (the gates then reuse it)."""
    if e.shape != (q.shape[-1], npos_max):
        raise ValueError(f"e must have shape (d, npos_max) = {(q.shape[-1], npos_max)}, got {tuple(e.shape)}")
    with full_precision(q):                                        # float32 under autocast too
        q, k = q.float(), k.float()
        scale = q.shape[-1] ** -0.5
        if logits is None:
            logits = (q * scale) @ k.transpose(-1, -2)             # (B, h, T, T)
        gates = torch.sigmoid(logits.float())                      # (B, h, T, T)
        pos = reverse_cumsum(gates).clamp(max=npos_max - 1)        # (B, h, T, T)
        z = q @ e.float()                                          # (B, h, T, M+1)
        return interpolate_readout(z, pos)                         # (B, h, T, T)


@register_encoding("cope")
class CoPE(PositionEncoding):
    hooks = ("bias",)
    uses_logits = True

    def __init__(self, ctx: EncodingContext, *, npos_max: int = 10) -> None:
        super().__init__(ctx)
        self.npos_max = check_npos_max(npos_max)
        self.cope_embed = nn.Parameter(torch.empty(ctx.depth, ctx.head_dim, npos_max))  # (L, d, M+1)
        nn.init.trunc_normal_(self.cope_embed, std=0.02)

    def bias(self, q, k, *, grid, layer, parts=None, logits=None):
        return cope_bias(q, k, self.cope_embed[layer], self.npos_max, logits=logits)

    def attend(self, q, k, v, *, grid, layer, scale, qkv=None):
        return cope_attention(q, k, v, self.cope_embed[layer], self.npos_max, scale=scale, qkv=qkv)
