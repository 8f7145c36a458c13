"""Fused CoPE attention for GPUs in Triton, forward and backward, FlashAttention-2 style: no
`T x T` tensor is ever written to memory (the backward recomputes the tiles).

`cope_flash_attention(q, k, v, z, scale, npos_max)` returns `softmax(q·kᵀ·scale + b) @ v` with
CoPE's non-causal bias (cope.py, docs/encodings.md) for read-outs `z = q·e` the caller formed:
`g_ij = σ(q_i·k_j·scale)`, `p_ij = min(Σ_{t>=j} g_it, M)` (`M = npos_max − 1`), `b_ij = z_i[lo] +
f·(z_i[lo+1] − z_i[lo])` with `lo = ⌊p_ij⌋`, `f = p_ij − lo`, the step 0 at `lo = M`. Gradients
for q, k, v (in their dtype) and z (float32). Checked against float64 eager PyTorch in
tests/test_triton_cope.py (under TRITON_INTERPRET=1 on CPU where no GPU is present).

How (per (batch, head)):
* Forward, one program per query block: the key blocks run from the LAST to the FIRST, so that
  each row's suffix sum of the gates is a running carry; inside a tile it is the carry plus a
  reverse cumsum along the keys, clamped at M. The read-outs `z[lo]`, `z[lo+1]` are selected by a
  loop over `t = 0..M` (`npos_max` is a compile-time constant). Online softmax as
  FlashAttention-2; saved: out, the row log-sum-exp, and each row's carry at every key block
  (`(B, h, T, ⌈T/BLOCK_N⌉)`, so the backward recomputes the positions bit for bit).
* Backward, two kernels and no atomics (deterministic): `dS = P ∘ (dP − D)`, `D_i = Σ dO_i ∘ O_i`
  is the gradient of both the logits and the bias; `∂p = dS · step`; the gate gradient is the
  PREFIX sum of ∂p along the keys (the adjoint of the suffix sum), `dL = dS + ∂g·g(1−g)`.
  1. per query block, key blocks first to last with a running carry of ∂p: dq, dz and D, and
     the carry at every key block (same shape as the forward's);
  2. per key block, over all query blocks: dk = dLᵀ·q·scale and dv = Pᵀ·dO, the prefix sums
     resumed from the carries of pass 1. Each pass recomputes the tile (FA2's dq / dk-dv
     split; atomics in one pass would save that recompute but make dk, dv order-dependent).

Precision: q·kᵀ (and every other product) accumulates in float32. float32 inputs: every
`tl.dot` runs with `input_precision="ieee"` (TF32 would silently change a float32 model).
bf16 / fp16 inputs: the native tensor-core dot with float32 accumulation; gates, positions,
bias, softmax statistics (max, sum, log-sum-exp) and all gradient accumulators (dq, dk, dv, dz,
the ∂p carries) are float32. Only the second operand of a product is rounded to the input
dtype, and only for half inputs: P for P@V and Pᵀ@dO, dL for dL@k and dLᵀ@q (as FlashAttention-2
does with dS). z and dz are float32; out, dq, dk, dv are written in the input dtype.

Triton is imported lazily (`available()`; the kernels are built by `_kernels()` on first use),
so this module imports where Triton is missing, and `triton.jit` sees TRITON_INTERPRET as set at
the first call (it decides at decoration time whether the kernels run in the interpreter).
"""
from __future__ import annotations

import functools
import importlib.util
import math

import torch
from torch import Tensor

from ._interp import check_npos_max

__all__ = ["available", "cope_flash_attention"]

BLOCK_M = 64     # query rows per program: defaults for an H100 / H200 (tests use 16)
BLOCK_N = 64     # keys per tile
NUM_WARPS = 4    # the same for all three kernels: equal tiles and layouts give equal recomputed positions
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def available() -> bool:
    """Whether Triton is installed (the kernels also need a CUDA device, or TRITON_INTERPRET=1)."""
    return importlib.util.find_spec("triton") is not None


@functools.cache
def _kernels():
    """The three Triton kernels and whether they run in the interpreter: `(fwd, bwd_dq, bwd_dkdv,
    interpreted)`, built once on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def _dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
        if UPCAST:                                           # interpreter, bf16 (see _meta)
            c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        elif IEEE:
            c = tl.dot(a, b, input_precision="ieee")        # float32: no TF32
        else:
            c = tl.dot(a, b)                                 # bf16 / fp16: native, float32 accumulation
        return c

    @triton.jit
    def _tile(q, k, carry, z_row, offs_m, mask_m, mask_n, scale, NPOS: tl.constexpr, IEEE: tl.constexpr,
              UPCAST: tl.constexpr):
        """One (BLOCK_M, BLOCK_N) tile of logits + bias: `(logits, g, lo, f, step)`, all float32
        (lo int32). `carry`: (BLOCK_M,) sum of the gates of the key blocks after this one.
        Masked keys get gate 0 and logit −inf."""
        M: tl.constexpr = NPOS - 1
        s = _dot(q, tl.trans(k), IEEE, UPCAST) * scale               # (BM, BN) q·kᵀ·scale
        g = tl.where(mask_n[None, :], tl.sigmoid(s), 0.0)            # gates, 0 beyond T
        pos = carry[:, None] + tl.cumsum(g, axis=1, reverse=True)    # Σ_{t>=j} g_it
        pos = tl.minimum(pos, M * 1.0)
        lo_f = tl.floor(pos)
        f = pos - lo_f                                               # interpolation weight
        lo = lo_f.to(tl.int32)
        z_lo = tl.zeros_like(s)
        z_hi = tl.zeros_like(s)
        for t in tl.static_range(NPOS):                              # select z[lo], z[lo+1]
            z_t = tl.load(z_row + t, mask=mask_m, other=0.0)[:, None]    # (BM, 1)
            z_lo = tl.where(lo == t, z_t, z_lo)
            z_hi = tl.where(lo + 1 == t, z_t, z_hi)
        step = tl.where(lo < M, z_hi - z_lo, 0.0)                    # z[lo+1] − z[lo], 0 at the cap
        logits = tl.where(mask_n[None, :], s + z_lo + f * step, float("-inf"))
        return logits, g, lo, f, step

    # Triton resolves a callee by name in the caller's module globals (the interpreter too; not
    # in a closure), so the helpers are published there before any kernel is launched.
    globals().update(_dot=_dot, _tile=_tile)

    @triton.jit
    def fwd(Q, K, V, Z, OUT, LSE, CARRY, T, NB, scale, D: tl.constexpr, DV: tl.constexpr, NPOS: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
            IEEE: tl.constexpr, UPCAST: tl.constexpr):
        pid_m, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
        mask_m = offs_m < T
        q = tl.load(Q + bh * T * D + offs_m[:, None] * D + offs_d[None, :],
                    mask=mask_m[:, None] & (offs_d[None, :] < D), other=0.0)         # (BM, BD)
        z_row = Z + bh * T * NPOS + offs_m * NPOS                                  # (BM,) pointers
        carry = tl.zeros([BLOCK_M], dtype=tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        for it in range(0, NB):
            jb = NB - 1 - it                                                       # last key block first
            tl.store(CARRY + bh * T * NB + offs_m * NB + jb, carry, mask=mask_m)
            offs_n = jb * BLOCK_N + tl.arange(0, BLOCK_N)
            mask_n = offs_n < T
            k = tl.load(K + bh * T * D + offs_n[:, None] * D + offs_d[None, :],
                        mask=mask_n[:, None] & (offs_d[None, :] < D), other=0.0)     # (BN, BD)
            v = tl.load(V + bh * T * DV + offs_n[:, None] * DV + offs_dv[None, :],
                        mask=mask_n[:, None] & (offs_dv[None, :] < DV), other=0.0)   # (BN, BDV)
            logits, g, lo, f, step = _tile(q, k, carry, z_row, offs_m, mask_m, mask_n, scale, NPOS, IEEE, UPCAST)
            carry += tl.sum(g, axis=1)
            m_new = tl.maximum(m_i, tl.max(logits, axis=1))   # finite: every key block holds a key < T
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(logits - m_new[:, None])                                    # (BM, BN), 0 beyond T
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE, UPCAST)      # P in v's dtype
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(OUT + bh * T * DV + offs_m[:, None] * DV + offs_dv[None, :], out.to(OUT.dtype.element_ty),
                 mask=mask_m[:, None] & (offs_dv[None, :] < DV))
        tl.store(LSE + bh * T + offs_m, m_i + tl.log(l_i), mask=mask_m)

    @triton.jit
    def bwd_dq(Q, K, V, Z, OUT, DO, LSE, CARRY, GQ, GZ, DELTA, DCARRY, T, NB, scale, D: tl.constexpr,
               DV: tl.constexpr, NPOS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_P: tl.constexpr, IEEE: tl.constexpr,
               UPCAST: tl.constexpr):
        """Pass 1: dq, dz and D of a query block; the carry of ∂p (sum over the earlier key
        blocks) at every key block, for pass 2."""
        pid_m, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d, offs_dv, offs_p = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV), tl.arange(0, BLOCK_P)
        mask_m = offs_m < T
        mask_dv = mask_m[:, None] & (offs_dv[None, :] < DV)
        q = tl.load(Q + bh * T * D + offs_m[:, None] * D + offs_d[None, :],
                    mask=mask_m[:, None] & (offs_d[None, :] < D), other=0.0)         # (BM, BD)
        do = tl.load(DO + bh * T * DV + offs_m[:, None] * DV + offs_dv[None, :], mask=mask_dv, other=0.0)
        o = tl.load(OUT + bh * T * DV + offs_m[:, None] * DV + offs_dv[None, :], mask=mask_dv, other=0.0)
        delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), axis=1)               # (BM,) D_i
        lse = tl.load(LSE + bh * T + offs_m, mask=mask_m, other=0.0)
        z_row = Z + bh * T * NPOS + offs_m * NPOS
        dcarry = tl.zeros([BLOCK_M], dtype=tl.float32)                             # Σ ∂p of earlier keys
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        dz = tl.zeros([BLOCK_M, BLOCK_P], dtype=tl.float32)
        for jb in range(0, NB):
            tl.store(DCARRY + bh * T * NB + offs_m * NB + jb, dcarry, mask=mask_m)
            offs_n = jb * BLOCK_N + tl.arange(0, BLOCK_N)
            mask_n = offs_n < T
            k = tl.load(K + bh * T * D + offs_n[:, None] * D + offs_d[None, :],
                        mask=mask_n[:, None] & (offs_d[None, :] < D), other=0.0)     # (BN, BD)
            v = tl.load(V + bh * T * DV + offs_n[:, None] * DV + offs_dv[None, :],
                        mask=mask_n[:, None] & (offs_dv[None, :] < DV), other=0.0)   # (BN, BDV)
            carry = tl.load(CARRY + bh * T * NB + offs_m * NB + jb, mask=mask_m, other=0.0)
            logits, g, lo, f, step = _tile(q, k, carry, z_row, offs_m, mask_m, mask_n, scale, NPOS, IEEE, UPCAST)
            p = tl.where(mask_m[:, None] & mask_n[None, :], tl.exp(logits - lse[:, None]), 0.0)
            dp = _dot(do, tl.trans(v), IEEE, UPCAST)                               # (BM, BN) dO·vᵀ
            ds = p * (dp - delta[:, None])                                         # ∂ logits = ∂ bias
            dpos = ds * step                                                       # ∂p, 0 at the cap
            dg = dcarry[:, None] + tl.cumsum(dpos, axis=1)                         # Σ_{j<=t} ∂p_ij
            dcarry += tl.sum(dpos, axis=1)
            dl = ds + dg * g * (1.0 - g)                                           # σ′; 0 beyond T
            dq += _dot(dl.to(k.dtype), k, IEEE, UPCAST)
            for t in tl.static_range(NPOS):                  # dz[t] += Σ_j dS·((1−f)[lo=t] + f[lo+1=t]), f 0 at M
                w = tl.where(lo == t, 1.0 - f, 0.0) + tl.where(lo + 1 == t, f, 0.0)
                dz += tl.where(offs_p[None, :] == t, tl.sum(ds * w, axis=1)[:, None], 0.0)
        tl.store(GQ + bh * T * D + offs_m[:, None] * D + offs_d[None, :], (dq * scale).to(GQ.dtype.element_ty),
                 mask=mask_m[:, None] & (offs_d[None, :] < D))
        tl.store(GZ + bh * T * NPOS + offs_m[:, None] * NPOS + offs_p[None, :], dz,
                 mask=mask_m[:, None] & (offs_p[None, :] < NPOS))
        tl.store(DELTA + bh * T + offs_m, delta, mask=mask_m)

    @triton.jit
    def bwd_dkdv(Q, K, V, Z, DO, LSE, CARRY, DELTA, DCARRY, GK, GV, T, NB, scale, D: tl.constexpr,
                 DV: tl.constexpr, NPOS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
        """Pass 2: dk, dv of a key block, over all query blocks; the tiles are computed in the
        same (query, key) orientation as in the forward, so the positions are the same."""
        jb, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
        offs_n = jb * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
        mask_n = offs_n < T
        mask_kd = mask_n[:, None] & (offs_d[None, :] < D)
        mask_kdv = mask_n[:, None] & (offs_dv[None, :] < DV)
        k = tl.load(K + bh * T * D + offs_n[:, None] * D + offs_d[None, :], mask=mask_kd, other=0.0)
        v = tl.load(V + bh * T * DV + offs_n[:, None] * DV + offs_dv[None, :], mask=mask_kdv, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
        for ib in range(0, tl.cdiv(T, BLOCK_M)):
            offs_m = ib * BLOCK_M + tl.arange(0, BLOCK_M)
            mask_m = offs_m < T
            q = tl.load(Q + bh * T * D + offs_m[:, None] * D + offs_d[None, :],
                        mask=mask_m[:, None] & (offs_d[None, :] < D), other=0.0)     # (BM, BD)
            do = tl.load(DO + bh * T * DV + offs_m[:, None] * DV + offs_dv[None, :],
                         mask=mask_m[:, None] & (offs_dv[None, :] < DV), other=0.0)  # (BM, BDV)
            lse = tl.load(LSE + bh * T + offs_m, mask=mask_m, other=0.0)
            delta = tl.load(DELTA + bh * T + offs_m, mask=mask_m, other=0.0)
            carry = tl.load(CARRY + bh * T * NB + offs_m * NB + jb, mask=mask_m, other=0.0)
            dcarry = tl.load(DCARRY + bh * T * NB + offs_m * NB + jb, mask=mask_m, other=0.0)
            z_row = Z + bh * T * NPOS + offs_m * NPOS
            logits, g, lo, f, step = _tile(q, k, carry, z_row, offs_m, mask_m, mask_n, scale, NPOS, IEEE, UPCAST)
            p = tl.where(mask_m[:, None] & mask_n[None, :], tl.exp(logits - lse[:, None]), 0.0)
            dp = _dot(do, tl.trans(v), IEEE, UPCAST)
            ds = p * (dp - delta[:, None])
            dpos = ds * step
            dg = dcarry[:, None] + tl.cumsum(dpos, axis=1)
            dl = ds + dg * g * (1.0 - g)
            dv += _dot(tl.trans(p.to(do.dtype)), do, IEEE, UPCAST)                 # Pᵀ·dO
            dk += _dot(tl.trans(dl.to(q.dtype)), q, IEEE, UPCAST)                  # dLᵀ·q
        tl.store(GK + bh * T * D + offs_n[:, None] * D + offs_d[None, :], (dk * scale).to(GK.dtype.element_ty),
                 mask=mask_kd)
        tl.store(GV + bh * T * DV + offs_n[:, None] * DV + offs_dv[None, :], dv.to(GV.dtype.element_ty),
                 mask=mask_kdv)

    interpreted = type(fwd).__name__ == "InterpretedFunction"     # TRITON_INTERPRET=1 at the first call
    if interpreted and type(tl.zeros).__name__ != "InterpretedFunction":
        raise RuntimeError("TRITON_INTERPRET=1 was set after triton was imported (e.g. by torch._inductor): "
                           "triton.language is then not interpreted; set it before triton's first import")
    return fwd, bwd_dq, bwd_dkdv, interpreted


def _pow2(n: int) -> int:
    """Power of two >= max(n, 16) (tl.dot needs 16 along every axis)."""
    return max(16, 1 << (n - 1).bit_length())


def _meta(q: Tensor, v: Tensor, npos_max: int, block_m: int, block_n: int) -> dict:
    """Compile-time constants shared by the kernels. UPCAST: bf16 in the interpreter, whose
    `tl.dot` is wrong for bf16 (triton 3.9 multiplies the raw bits): the operands, bf16 values,
    go to float32 first, which is exact and gives what the GPU's bf16 dot gives up to summation order."""
    return dict(D=q.shape[-1], DV=v.shape[-1], NPOS=npos_max, BLOCK_M=block_m, BLOCK_N=block_n,
                BLOCK_D=_pow2(q.shape[-1]), BLOCK_DV=_pow2(v.shape[-1]), IEEE=q.dtype == torch.float32,
                UPCAST=_kernels()[3] and q.dtype == torch.bfloat16, num_warps=NUM_WARPS)


class _CoPEFlash(torch.autograd.Function):
    """Launches the kernels of `_kernels()`; q, k, v, z contiguous, checked by the caller."""

    @staticmethod
    def forward(ctx, q, k, v, z, scale: float, npos_max: int, block_m: int, block_n: int):
        fwd = _kernels()[0]
        B, h, T, _ = q.shape
        nb = math.ceil(T / block_n)
        out = torch.empty((B, h, T, v.shape[-1]), dtype=q.dtype, device=q.device)   # (B, h, T, dv)
        lse = torch.empty((B, h, T), dtype=torch.float32, device=q.device)          # row log-sum-exp
        carry = torch.empty((B, h, T, nb), dtype=torch.float32, device=q.device)    # gate sums after each key block
        meta = _meta(q, v, npos_max, block_m, block_n)
        fwd[(math.ceil(T / block_m), B * h)](q, k, v, z, out, lse, carry, T, nb, scale, **meta)
        ctx.save_for_backward(q, k, v, z, out, lse, carry)
        ctx.scale, ctx.meta = scale, meta
        return out

    @staticmethod
    def backward(ctx, grad_out):
        _, bwd_dq, bwd_dkdv, _ = _kernels()
        q, k, v, z, out, lse, carry = ctx.saved_tensors
        B, h, T, _ = q.shape
        nb, meta = carry.shape[-1], ctx.meta
        do = grad_out.to(q.dtype).contiguous()                                      # (B, h, T, dv)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dz = torch.empty_like(z)                                                    # (B, h, T, M+1) float32
        delta = torch.empty_like(lse)                                               # D_i = Σ dO_i ∘ O_i
        dcarry = torch.empty_like(carry)                                            # ∂p sums before each key block
        bwd_dq[(math.ceil(T / meta["BLOCK_M"]), B * h)](q, k, v, z, out, do, lse, carry, dq, dz, delta, dcarry,
                                                        T, nb, ctx.scale, BLOCK_P=_pow2(z.shape[-1]), **meta)
        bwd_dkdv[(nb, B * h)](q, k, v, z, do, lse, carry, delta, dcarry, dk, dv, T, nb, ctx.scale, **meta)
        return dq, dk, dv, dz, None, None, None, None


def cope_flash_attention(q: Tensor, k: Tensor, v: Tensor, z: Tensor, scale: float, npos_max: int, *,
                         block_m: int = BLOCK_M, block_n: int = BLOCK_N) -> Tensor:
    """Non-causal CoPE attention `softmax(q·kᵀ·scale + b) @ v`, `(B, h, T, dv)` in q's dtype, by
    the fused Triton kernels (module docstring). `q, k: (B, h, T, d)`, `v: (B, h, T, dv)`, one
    dtype of float32 / bfloat16 / float16; `z: (B, h, T, npos_max)` float32, the read-outs `q·e`
    (it gets a float32 gradient). `block_m`, `block_n`: tile sizes, powers of two >= 16. Runs
    on CUDA tensors, or on CPU ones under TRITON_INTERPRET=1."""
    if not available():
        raise RuntimeError("cope_flash_attention needs Triton (pip install triton)")
    check_npos_max(npos_max)
    for name, t in (("q", q), ("k", k), ("v", v), ("z", z)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (B, h, T, ·), got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    B, h, T, d = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != (B, h, T) or v.shape[-1] < 1:
        raise ValueError(f"v must have shape (B, h, T, dv) = {(B, h, T)} + (dv,), got {tuple(v.shape)}")
    if z.shape != (B, h, T, npos_max):
        raise ValueError(f"z must have shape (B, h, T, npos_max) = {(B, h, T, npos_max)}, got {tuple(z.shape)}")
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype of float32 / bfloat16 / float16, got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    if z.dtype != torch.float32:
        raise ValueError(f"z must be float32, got {z.dtype}")
    if q.numel() == 0:
        raise ValueError(f"q must not be empty, got {tuple(q.shape)}")
    if B * h > 65535:                        # the grid's second axis (CUDA's limit): split the batch
        raise ValueError(f"B·h must be at most 65535, got {B}·{h}")
    if len({t.device for t in (q, k, v, z)}) != 1:
        raise ValueError(f"q, k, v, z must be on one device, got {[str(t.device) for t in (q, k, v, z)]}")
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if not isinstance(b, int) or b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {b!r}")
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    if q.device.type != "cuda" and not _kernels()[3]:
        raise ValueError(f"the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 set before the first "
                         f"call, for CPU ones), got {q.device}")
    q, k, v, z = (t.contiguous() for t in (q, k, v, z))
    return _CoPEFlash.apply(q, k, v, z, float(scale), npos_max, block_m, block_n)
