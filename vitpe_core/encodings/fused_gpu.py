"""SaPE² and CoPE attention on a CUDA GPU: flash-attention Triton kernels that never write a
`T x T` tensor (docs/encodings.md, "The fused GPU attention").

Where it runs: `sape2_attention` / `cope_attention` (functional.py) call it for CUDA tensors in
float32, bf16 or fp16 when Triton imports (it comes with CUDA builds of torch), outside
`torch.compile`, unless `VITPE_NO_TRITON=1`; elsewhere the C++ CPU kernel or the eager code runs.
Both paths compute the same function; tests/test_fused_gpu.py checks this one against the eager
code on CPU tensors under Triton's interpreter (`TRITON_INTERPRET=1`), on every machine.

How the work is split, and why:
* SaPE²: the bias between two patches is built from small per-patch descriptors, `b_in =
  ‖S_x[i] − S_x[n]‖ + ‖S_y[i] − S_y[n]‖` with `S_x[i] ∈ R^W`, `S_y[i] ∈ R^H`, and the gates that
  make the descriptors live inside one row or column. So steps 1–4 (gates in lines, positions,
  read-outs: `N·(H+W)` values, not `N²`) stay plain autograd code (sape2_descriptors.py), and
  the kernel (triton_sape2.py) forms each tile's bias from the descriptors beside `q·kᵀ`, as a
  flash attention forms its logits, with the descriptors' gradient in its backward.
* CoPE: the positions are a running sum of the gates along all keys of a query's row, so the
  kernel (triton_cope.py) walks the keys from last to first carrying that sum; the read-outs
  `z = q·e` are a small `(B, h, T, npos_max)` matmul outside it.
* FlashAttention-style `score_mod`s (torch's FlexAttention) were measured 10x slower than a
  masked SDPA for SaPE² on an H200 (issue 43's probe: a score_mod may index a gradient-carrying
  tensor once per use, so each pair re-reads its descriptors element by element).

Precision: as every other path (docs/encodings.md, "Mixed precision"): q, k, v as given, the
products accumulated in float32, gates, positions, descriptors, bias and softmax in float32.
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

from . import triton_cope, triton_sape2
from ._interp import compute_dtype, full_precision
from .sape2_descriptors import descriptors, line_logits

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def applies(*ts: Tensor) -> bool:
    """Whether the fused GPU attention takes these tensors: CUDA, one of `DTYPES`, Triton
    importable, not under `torch.compile` (its graph keeps the bias path) and not switched off
    with `VITPE_NO_TRITON=1`."""
    return (all(t.is_cuda and t.dtype in DTYPES for t in ts) and not torch.compiler.is_compiling()
            and os.environ.get("VITPE_NO_TRITON", "") != "1" and triton_sape2.available())


def _same_dtype(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v in one dtype (the kernels take one): theirs when they share it, else the
    `compute_dtype` of the eager path (float32 here)."""
    dtype = q.dtype if q.dtype == k.dtype == v.dtype else compute_dtype(q, k, v)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def sape2_attention(q: Tensor, k: Tensor, v: Tensor, e_x: Tensor, e_y: Tensor, grid: tuple[int, int],
                    scale: float, num_prefix: int, npos_max: int, readout: str) -> Tensor:
    """`softmax(q·kᵀ·scale + SaPE² bias) v`, `(B, h, T, dv)` in q's dtype (arguments as
    functional.sape2_attention's, already checked there)."""
    P = num_prefix
    with full_precision(q):
        q_p, k_p = q[:, :, P:].float(), k[:, :, P:].float()                    # (B, h, N, d) patches
        row, col = line_logits(q_p, k_p, grid, scale)                          # (B,h,H,W,W), (B,h,W,H,H)
        s_x, s_y = descriptors(row, col, q_p if readout == "query" else k_p, e_x.float(), e_y.float(),
                               grid, npos_max)                                 # (B,h,N,W), (B,h,N,H)
        out = triton_sape2.sape2_flash_attention(*_same_dtype(q, k, v), s_x, s_y, P, scale)
    return out.to(q.dtype)


def cope_attention(q: Tensor, k: Tensor, v: Tensor, e: Tensor, scale: float, npos_max: int) -> Tensor:
    """`softmax(q·kᵀ·scale + CoPE bias) v`, `(B, h, T, dv)` in q's dtype (arguments as
    functional.cope_attention's, already checked there)."""
    with full_precision(q):
        z = q.float() @ e.float()                                              # (B, h, T, npos_max)
        out = triton_cope.cope_flash_attention(*_same_dtype(q, k, v), z, scale, npos_max)
    return out.to(q.dtype)
