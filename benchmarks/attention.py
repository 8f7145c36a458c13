"""Sections 1 and 7 of the benchmark: one attention layer, forward + backward.

1. `model.Attention` + `build_encoding`, called as `attn(x, pos, grid, layer=0)`, per encoding
   vs the same layer with `none` (plain SDPA) and vs `rpb`, at the compact width (D 128,
   4 heads) and the ViT-S width (D 384, 6 heads), T = 65 tokens (CLS + 8x8 patches), batch 1
   and 128 (`bench_attention`);
7. attention as a researcher calls it in their own model: `sape2_attention` / `cope_attention`
   against SDPA with an additive mask (`rpb`'s bias, or `sape2_bias` / `cope_bias`), compact
   shapes (`bench_functional`).
"""
from __future__ import annotations

import gc
import logging
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.timing import Plan, interleaved, ratios
from vitpe_core.encodings import EncodingContext, build_encoding
from vitpe_core.model import Attention

log = logging.getLogger(__name__)

GRID = (8, 8)                                  # 32x32 images, patch 4: T = 1 + 64 tokens
WIDTHS = {"compact": (128, 4), "vit-s": (384, 6)}
BATCHES = (1, 128)
FUNCTIONAL_BATCH = 128                         # section 7's batch (the training batch)
FUNCTIONAL_BASE = "SDPA + `rpb` mask"


# ----------------------------------------------------------------------------- 1. attention layer
def attention_step(encoding: str, dim: int, heads: int, batch: int, grid: tuple[int, int] = GRID
                   ) -> Callable[[], None]:
    """Forward + backward of one `Attention` layer with `encoding` (all its gradients)."""
    torch.manual_seed(0)
    attn = Attention(dim, heads)
    pos = build_encoding(encoding, EncodingContext(dim, heads, 1, grid, 1))
    T = 1 + grid[0] * grid[1]
    x = torch.randn(batch, T, dim, requires_grad=True)                        # (B, T, D)
    grad_out = torch.randn(batch, T, dim)                                     # (B, T, D)
    params = [*attn.parameters(), *pos.parameters(), x]

    def step() -> None:
        for p in params:
            p.grad = None
        attn(x, pos, grid, layer=0).backward(grad_out)
    return step


def bench_attention(plan: Plan, encodings: list[str]) -> list[dict]:
    """One row per (width, batch, encoding): median / min ms and the ratios vs `none` and `rpb`."""
    rows = []
    for width, (dim, heads) in WIDTHS.items():
        for batch in BATCHES:
            log.info("attention layer: %s (D %d, %d heads), batch %d", width, dim, heads, batch)
            fns = {e: attention_step(e, dim, heads, batch) for e in encodings}
            s = interleaved(fns, rounds=plan.attn_rounds, warmup=plan.warmup, min_sample_s=plan.attn_min_sample_s)
            for e in encodings:
                rows.append({"width": width, "dim": dim, "heads": heads, "tokens": 1 + GRID[0] * GRID[1],
                             "batch": batch, "encoding": e, "median_ms": 1e3 * float(np.median(s[e])),
                             "min_ms": 1e3 * min(s[e]), **ratios(s, e, "none", "vs_none"),
                             **ratios(s, e, "rpb", "vs_rpb"), "samples_ms": [1e3 * t for t in s[e]]})
            del fns
            gc.collect()
    return rows


# ----------------------------------------------------------------------------- 7. functional attention
def functional_steps(batch: int = FUNCTIONAL_BATCH, dim: int = 128, heads: int = 4, grid: tuple[int, int] = GRID
                     ) -> dict[str, Callable[[], None]]:
    """Forward + backward of attention as a researcher calls it in their own model, compact shapes:
    `q, k, v: (B, h, 1 + H·W, d)` leaves; every variant's gradients flow into q, k, v and its tables."""
    from vitpe_core.encodings import cope_bias, sape2_bias
    from vitpe_core.encodings.functional import cope_attention, sape2_attention
    torch.manual_seed(0)
    d, P, T = dim // heads, 1, 1 + grid[0] * grid[1]
    q, k, v = (torch.randn(batch, heads, T, d, requires_grad=True) for _ in range(3))
    e_x, e_y, e = (torch.empty(d, 10).normal_(std=0.02).requires_grad_() for _ in range(3))
    rpb = build_encoding("rpb", EncodingContext(dim, heads, 1, grid, P))
    grad = torch.randn(batch, heads, T, d)
    leaves = [q, k, v, e_x, e_y, e, *rpb.parameters()]

    def step(fn: Callable[[], Tensor]) -> Callable[[], None]:
        def run() -> None:
            for t in leaves:
                t.grad = None
            fn().backward(grad)
        return run

    sdpa = F.scaled_dot_product_attention
    return {
        "SDPA (no bias)": step(lambda: sdpa(q, k, v)),
        FUNCTIONAL_BASE: step(lambda: sdpa(q, k, v, attn_mask=rpb.bias(q, k, grid=grid, layer=0))),
        "`sape2_attention`": step(lambda: sape2_attention(q, k, v, e_x, e_y, grid, num_prefix=P)),
        "SDPA + `sape2_bias` mask": step(lambda: sdpa(q, k, v, attn_mask=sape2_bias(
            q[:, :, P:], k[:, :, P:], e_x, e_y, grid, num_prefix=P))),
        "`cope_attention`": step(lambda: cope_attention(q, k, v, e)),
        "SDPA + `cope_bias` mask": step(lambda: sdpa(q, k, v, attn_mask=cope_bias(q, k, e))),
    }


def bench_functional(plan: Plan) -> list[dict]:
    """One row per variant of `functional_steps`: median / min ms and the ratio vs FUNCTIONAL_BASE."""
    log.info("functional attention: %d variants, batch %d", 6, FUNCTIONAL_BATCH)
    fns = functional_steps()
    s = interleaved(fns, rounds=plan.functional_rounds, warmup=plan.warmup, min_sample_s=plan.attn_min_sample_s)
    return [{"variant": name, "median_ms": 1e3 * float(np.median(s[name])), "min_ms": 1e3 * min(s[name]),
             **ratios(s, name, FUNCTIONAL_BASE, "vs_base"), "samples_ms": [1e3 * t for t in s[name]]}
            for name in fns]
