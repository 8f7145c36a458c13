"""SaPE² attention as one fused Triton kernel (forward and backward), for GPUs.

`sape2_flash_attention(q, k, v, s_x, s_y, num_prefix, scale)` returns
`softmax(q·kᵀ·scale + bias) v` with the SaPE² bias of the descriptors (sape2.py, step 5):
`bias_in = ‖s_x[i−P] − s_x[n−P]‖ + ‖s_y[i−P] − s_y[n−P]‖` between patch tokens `i ≠ n`, 0 on the
diagonal and for every pair with one of the `P = num_prefix` prefix tokens (which come first).
It is FlashAttention-2 with the bias recomputed tile by tile: no `T x T` tensor is ever written
to memory, in the forward or the backward.
* Forward: one program per block of queries loops over the key blocks with an online softmax;
  it writes only the output and the row log-sum-exp `(B, h, T)` (float32), which is all the
  backward keeps (with the inputs).
* Backward: `D_i = Σ dO_i ∘ O_i` (torch), then one kernel per key block (loop over query blocks)
  for dk, dv and the key side of the descriptor gradients, and one per query block (loop over
  key blocks) for dq and the query side: every program owns its outputs, no atomics. With
  `G = P ∘ (dP − D)` (the logits' gradient, which is also the bias's) and, per axis,
  `w_in = G_in / dist(i, n)` (0 where the distance is 0, as torch.cdist's gradient), token t's
  descriptor gets `s_t Σ w − Σ w s_other` from each side; the two sides are added.
* Distances are `sqrt(max(|a|² + |b|² − 2 a·b, 0))`, `a·b` one `tl.dot` over the descriptor width
  zero-padded to a power of two >= 16 (zero columns change no distance); the diagonal is exactly 0.
  As in the eager code (functional.py), equal descriptors can leave a rounding residue of
  `|a|² + |b|² − 2 a·b` above 0: their distance is then ~sqrt(eps)·|a|, not exactly 0.

Precision: q·kᵀ accumulates in float32; for float32 inputs every `tl.dot` uses
`input_precision="ieee"` (tf32 would silently change a float32 model), for bfloat16/float16 the
native tensor-core dot with float32 accumulation. The bias, the softmax statistics (running max,
sum, log-sum-exp) and every gradient accumulator are float32; the descriptor dots are float32
with ieee precision. The probabilities (and the logits' gradient) are cast to the inputs' dtype
for their products with v, dO, q and k only when that dtype is half, as FlashAttention does;
for float32 inputs those products are ieee float32. Outputs: out, dq, dk, dv in q's dtype;
the descriptor gradients in float32.

Triton is imported lazily: this module imports where triton is not installed (`available()`
says whether it is). The kernels are built on first use (`_kernels()`, cached); `triton.jit`
decides then whether they run in Triton's interpreter (`TRITON_INTERPRET=1`, how
tests/test_triton_sape2.py runs them on CPU tensors). Set that variable before triton is first
imported at all: triton.language's own jitted functions (`tl.zeros`, `tl.sum`, ...) are decided
at that import, and interpreted kernels cannot call compiled ones.
"""
from __future__ import annotations

import functools
import importlib.util
import math

import torch
from torch import Tensor

__all__ = ["available", "sape2_flash_attention"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# (block_m, block_n, num_warps) by "q is float32", for an H100/H200 and d <= 128. Chosen without
# timing (no GPU at hand) by the register spills of ptxas for sm_90 (Triton 3.9, three stages):
# half inputs with (64, 32, 8) spill 0 bytes a thread in the forward and <= 300 in the backward
# (d = 64 and 128), with (64, 64, 4) up to 1.6 KB; float32's ieee dots run on the FMA units and
# need smaller tiles ((32, 32, 4): <= 240 bytes at d = 64, up to 2.4 KB at d = 128).
DEFAULTS = {False: (64, 32, 8), True: (32, 32, 4)}


def available() -> bool:
    """Whether triton is installed (the kernels still need a GPU, or `TRITON_INTERPRET=1`)."""
    return importlib.util.find_spec("triton") is not None


def _pad(n: int) -> int:
    """Smallest power of two >= max(n, 16): `tl.dot` needs every dimension >= 16."""
    return max(16, 1 << max(0, n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------- kernels
# Plain functions here; `_kernels()` binds `tl` and wraps them with `triton.jit` on first use. They
# live at module level because Triton's interpreter runs a kernel's source against the module's
# globals (closures are lost there, and it needs `triton.language` among them), and the names the
# kernels call must then be the jitted helpers.
tl = None  # triton.language, bound by _kernels()
_HELPERS = ("_mm", "_load_rows", "_load_cols", "_store_rows", "_dist", "_inv_weight")


def _mm(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """`a @ b`, float32 out: ieee float32, or `a` cast to `b`'s (half) dtype for tensor cores.
    UPCAST (bf16 in the interpreter, whose bf16 `tl.dot` multiplies the raw bits in triton 3.9):
    the bf16 values go to float32 first, exact, as the GPU's products are."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    elif UPCAST:
        return tl.dot(a.to(b.dtype).to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a.to(b.dtype), b)


def _load_rows(X, base, rows, n_rows, n_cols, COLS: tl.constexpr):
    """Rows `rows` of a contiguous `(n_rows, n_cols)` matrix at `X + base`, zero-padded to
    `COLS` columns and zero outside `0 <= row < n_rows`."""
    cols = tl.arange(0, COLS)
    mask = ((rows >= 0) & (rows < n_rows))[:, None] & (cols < n_cols)[None, :]
    return tl.load(X + base + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0)


def _load_cols(X, base, rows, n_rows, n_cols, COLS: tl.constexpr):
    """`_load_rows(...)` transposed, `(COLS, len(rows))`, read so from memory."""
    cols = tl.arange(0, COLS)
    mask = (cols < n_cols)[:, None] & ((rows >= 0) & (rows < n_rows))[None, :]
    return tl.load(X + base + rows[None, :] * n_cols + cols[:, None], mask=mask, other=0.0)


def _store_rows(X, base, rows, n_rows, n_cols, val, COLS: tl.constexpr):
    cols = tl.arange(0, COLS)
    mask = ((rows >= 0) & (rows < n_rows))[:, None] & (cols < n_cols)[None, :]
    tl.store(X + base + rows[:, None] * n_cols + cols[None, :], val.to(X.dtype.element_ty), mask=mask)


def _dist(a, b, pair):
    """Distances `(BM, BN)` between the rows of `a (BM, C)` and `b (BN, C)` (float32), 0
    where `pair` is false."""
    na = tl.sum(a * a, axis=1)
    nb = tl.sum(b * b, axis=1)
    d2 = na[:, None] + nb[None, :] - 2.0 * tl.dot(a, tl.trans(b), input_precision="ieee")
    return tl.where(pair, tl.sqrt_rn(tl.maximum(d2, 0.0)), 0.0)


def _inv_weight(g, dist):
    """`g / dist`, 0 where `dist` is 0 (torch.cdist's gradient at zero distance)."""
    nz = dist > 0.0
    return tl.where(nz, g / tl.where(nz, dist, 1.0), 0.0)


def _fwd(Q, K, V, SX, SY, OUT, LSE, T, N, P, D, DV, W, H, scale,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr,
         WP: tl.constexpr, HP: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _load_rows(Q, bh * T * D, offs_m, T, D, DP)                            # (BM, DP)
    qx = _load_rows(SX, bh * N * W, offs_m - P, N, W, WP)                      # (BM, WP), 0 for prefix
    qy = _load_rows(SY, bh * N * H, offs_m - P, N, H, HP)                      # (BM, HP)
    q_patch = (offs_m >= P) & (offs_m < T)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DVP], tl.float32)
    for start_n in range(0, T, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(K, bh * T * D, offs_n, T, D, DP)                        # (BN, DP)
        v = _load_rows(V, bh * T * DV, offs_n, T, DV, DVP)                     # (BN, DVP)
        kx = _load_rows(SX, bh * N * W, offs_n - P, N, W, WP)
        ky = _load_rows(SY, bh * N * H, offs_n - P, N, H, HP)
        pair = q_patch[:, None] & ((offs_n >= P) & (offs_n < T))[None, :] & (offs_m[:, None] != offs_n[None, :])
        s = _mm(q, tl.trans(k), IEEE, UPCAST) * scale + _dist(qx, kx, pair) + _dist(qy, ky, pair)
        s = tl.where((offs_n < T)[None, :], s, float("-inf"))                  # (BM, BN)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))                             # finite: a block has a key
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + _mm(p, v, IEEE, UPCAST)
        m_i = m_new
    _store_rows(OUT, bh * T * DV, offs_m, T, DV, acc / l_i[:, None], DVP)
    tl.store(LSE + bh * T + offs_m, m_i + tl.log(l_i), mask=offs_m < T)


def _bwd_kv(Q, K, V, SX, SY, DO, LSE, DELTA, DK, DVAL, DSX, DSY, T, N, P, D, DV, W, H, scale,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr,
            WP: tl.constexpr, HP: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """One key block: dk, dv and the key side of the descriptor gradients."""
    bh = tl.program_id(1).to(tl.int64)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = _load_rows(K, bh * T * D, offs_n, T, D, DP)                            # (BN, DP)
    v = _load_rows(V, bh * T * DV, offs_n, T, DV, DVP)                         # (BN, DVP)
    kx = _load_rows(SX, bh * N * W, offs_n - P, N, W, WP)                      # (BN, WP)
    ky = _load_rows(SY, bh * N * H, offs_n - P, N, H, HP)                      # (BN, HP)
    k_patch = (offs_n >= P) & (offs_n < T)
    dk = tl.zeros([BLOCK_N, DP], tl.float32)
    dv = tl.zeros([BLOCK_N, DVP], tl.float32)
    dkx = tl.zeros([BLOCK_N, WP], tl.float32)                                  # −Σ_i w_in s_x[i]
    dky = tl.zeros([BLOCK_N, HP], tl.float32)
    wsx = tl.zeros([BLOCK_N], tl.float32)                                      # Σ_i w_in
    wsy = tl.zeros([BLOCK_N], tl.float32)
    for start_m in range(0, T, BLOCK_M):
        # the tiles are transposed, (keys, queries): no register tile needs a transpose
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < T
        q = _load_rows(Q, bh * T * D, offs_m, T, D, DP)                        # (BM, DP)
        q_t = _load_cols(Q, bh * T * D, offs_m, T, D, DP)                      # (DP, BM)
        do = _load_rows(DO, bh * T * DV, offs_m, T, DV, DVP)                   # (BM, DVP)
        do_t = _load_cols(DO, bh * T * DV, offs_m, T, DV, DVP)                 # (DVP, BM)
        lse = tl.load(LSE + bh * T + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + bh * T + offs_m, mask=row_ok, other=0.0)
        qx = _load_rows(SX, bh * N * W, offs_m - P, N, W, WP)                  # (BM, WP)
        qy = _load_rows(SY, bh * N * H, offs_m - P, N, H, HP)                  # (BM, HP)
        pair = k_patch[:, None] & ((offs_m >= P) & row_ok)[None, :] & (offs_n[:, None] != offs_m[None, :])
        dist_x = _dist(kx, qx, pair)                                           # (BN, BM)
        dist_y = _dist(ky, qy, pair)
        s = _mm(k, q_t, IEEE, UPCAST) * scale + dist_x + dist_y
        p = tl.where((offs_n < T)[:, None] & row_ok[None, :], tl.exp(s - lse[None, :]), 0.0)
        dv += _mm(p, do, IEEE, UPCAST)
        g = p * (_mm(v, do_t, IEEE, UPCAST) - delta[None, :])                  # dSᵀ: (BN, BM)
        dk += _mm(g, q, IEEE, UPCAST)
        w_x = _inv_weight(g, dist_x)
        w_y = _inv_weight(g, dist_y)
        wsx += tl.sum(w_x, axis=1)
        wsy += tl.sum(w_y, axis=1)
        dkx -= tl.dot(w_x, qx, input_precision="ieee")
        dky -= tl.dot(w_y, qy, input_precision="ieee")
    _store_rows(DK, bh * T * D, offs_n, T, D, dk * scale, DP)
    _store_rows(DVAL, bh * T * DV, offs_n, T, DV, dv, DVP)
    _store_rows(DSX, bh * N * W, offs_n - P, N, W, dkx + kx * wsx[:, None], WP)
    _store_rows(DSY, bh * N * H, offs_n - P, N, H, dky + ky * wsy[:, None], HP)


def _bwd_q(Q, K, V, SX, SY, DO, LSE, DELTA, DQ, DSX, DSY, T, N, P, D, DV, W, H, scale,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr,
           WP: tl.constexpr, HP: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """One query block: dq and the query side of the descriptor gradients."""
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < T
    q = _load_rows(Q, bh * T * D, offs_m, T, D, DP)                            # (BM, DP)
    do = _load_rows(DO, bh * T * DV, offs_m, T, DV, DVP)                       # (BM, DVP)
    lse = tl.load(LSE + bh * T + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * T + offs_m, mask=row_ok, other=0.0)
    qx = _load_rows(SX, bh * N * W, offs_m - P, N, W, WP)                      # (BM, WP)
    qy = _load_rows(SY, bh * N * H, offs_m - P, N, H, HP)                      # (BM, HP)
    q_patch = (offs_m >= P) & row_ok
    dq = tl.zeros([BLOCK_M, DP], tl.float32)
    dqx = tl.zeros([BLOCK_M, WP], tl.float32)                                  # −Σ_n w_in s_x[n]
    dqy = tl.zeros([BLOCK_M, HP], tl.float32)
    wsx = tl.zeros([BLOCK_M], tl.float32)                                      # Σ_n w_in
    wsy = tl.zeros([BLOCK_M], tl.float32)
    for start_n in range(0, T, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(K, bh * T * D, offs_n, T, D, DP)                        # (BN, DP)
        v = _load_rows(V, bh * T * DV, offs_n, T, DV, DVP)                     # (BN, DVP)
        kx = _load_rows(SX, bh * N * W, offs_n - P, N, W, WP)
        ky = _load_rows(SY, bh * N * H, offs_n - P, N, H, HP)
        pair = q_patch[:, None] & ((offs_n >= P) & (offs_n < T))[None, :] & (offs_m[:, None] != offs_n[None, :])
        dist_x = _dist(qx, kx, pair)                                           # (BM, BN)
        dist_y = _dist(qy, ky, pair)
        s = _mm(q, tl.trans(k), IEEE, UPCAST) * scale + dist_x + dist_y
        p = tl.where(row_ok[:, None] & (offs_n < T)[None, :], tl.exp(s - lse[:, None]), 0.0)
        g = p * (_mm(do, tl.trans(v), IEEE, UPCAST) - delta[:, None])          # dS: (BM, BN)
        dq += _mm(g, k, IEEE, UPCAST)
        w_x = _inv_weight(g, dist_x)
        w_y = _inv_weight(g, dist_y)
        wsx += tl.sum(w_x, axis=1)
        wsy += tl.sum(w_y, axis=1)
        dqx -= tl.dot(w_x, kx, input_precision="ieee")
        dqy -= tl.dot(w_y, ky, input_precision="ieee")
    _store_rows(DQ, bh * T * D, offs_m, T, D, dq * scale, DP)
    _store_rows(DSX, bh * N * W, offs_m - P, N, W, dqx + qx * wsx[:, None], WP)
    _store_rows(DSY, bh * N * H, offs_m - P, N, H, dqy + qy * wsy[:, None], HP)


@functools.cache
def _kernels():
    """Jit the kernels and their helpers (after the env is set: see the module docstring) and
    return `(forward, backward per key block, backward per query block, interpreted)`."""
    import triton
    import triton.language

    g = globals()
    g["tl"] = triton.language
    for name in _HELPERS:
        g[name] = triton.jit(g[name])
    fwd = triton.jit(_fwd)
    interpreted = type(fwd).__name__ == "InterpretedFunction"               # TRITON_INTERPRET=1 when built
    if interpreted and type(triton.language.zeros).__name__ != "InterpretedFunction":
        raise RuntimeError("TRITON_INTERPRET=1 was set after triton was imported: triton.language is then not "
                           "interpreted and the kernels cannot run; set it before triton's first import")
    return fwd, triton.jit(_bwd_kv), triton.jit(_bwd_q), interpreted


def _meta(q: Tensor, v: Tensor, s_x: Tensor, s_y: Tensor, block_m: int, block_n: int) -> dict:
    """The kernels' constexpr arguments."""
    return dict(BLOCK_M=block_m, BLOCK_N=block_n, DP=_pad(q.shape[-1]), DVP=_pad(v.shape[-1]),
                WP=_pad(s_x.shape[-1]), HP=_pad(s_y.shape[-1]), IEEE=q.dtype == torch.float32,
                UPCAST=_kernels()[3] and q.dtype == torch.bfloat16)


class _SaPE2Flash(torch.autograd.Function):
    """Forward keeps out and the row log-sum-exp; the backward recomputes every tile."""

    @staticmethod
    def forward(ctx, q, k, v, s_x, s_y, num_prefix, scale, block_m, block_n, num_warps):
        fwd = _kernels()[0]
        q, k, v, s_x, s_y = (t.contiguous() for t in (q, k, v, s_x, s_y))
        B, h, T, D = q.shape
        N, W, H, DV = s_x.shape[2], s_x.shape[3], s_y.shape[3], v.shape[3]
        out = torch.empty_like(v)                                              # (B, h, T, dv)
        lse = torch.empty(B, h, T, device=q.device, dtype=torch.float32)       # (B, h, T)
        fwd[(_cdiv(T, block_m), B * h)](
            q, k, v, s_x, s_y, out, lse, T, N, num_prefix, D, DV, W, H, scale,
            **_meta(q, v, s_x, s_y, block_m, block_n), num_warps=num_warps)
        ctx.save_for_backward(q, k, v, s_x, s_y, out, lse)
        ctx.args = (num_prefix, scale, block_m, block_n, num_warps)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        _, bwd_kv, bwd_q, _ = _kernels()
        q, k, v, s_x, s_y, out, lse = ctx.saved_tensors
        P, scale, block_m, block_n, num_warps = ctx.args
        B, h, T, D = q.shape
        N, W, H, DV = s_x.shape[2], s_x.shape[3], s_y.shape[3], v.shape[3]
        do = grad_out.to(out.dtype).contiguous()                               # (B, h, T, dv)
        delta = (do.float() * out.float()).sum(-1)                             # (B, h, T) D_i = Σ dO∘O
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dsx_k, dsx_q = torch.empty_like(s_x), torch.empty_like(s_x)            # (B, h, N, W) key/query side
        dsy_k, dsy_q = torch.empty_like(s_y), torch.empty_like(s_y)            # (B, h, N, H)
        meta = _meta(q, v, s_x, s_y, block_m, block_n)
        bwd_kv[(_cdiv(T, block_n), B * h)](
            q, k, v, s_x, s_y, do, lse, delta, dk, dv, dsx_k, dsy_k, T, N, P, D, DV, W, H, scale,
            **meta, num_warps=num_warps)
        bwd_q[(_cdiv(T, block_m), B * h)](
            q, k, v, s_x, s_y, do, lse, delta, dq, dsx_q, dsy_q, T, N, P, D, DV, W, H, scale,
            **meta, num_warps=num_warps)
        return dq, dk, dv, dsx_k.add_(dsx_q), dsy_k.add_(dsy_q), None, None, None, None, None


def _check(q: Tensor, k: Tensor, v: Tensor, s_x: Tensor, s_y: Tensor, num_prefix: int, scale: float,
           block_m: int, block_n: int, num_warps: int) -> None:
    """ValueError with what is wrong, before any kernel sees the tensors."""
    name = "sape2_flash_attention"
    for t, what in ((q, "q"), (k, "k"), (v, "v"), (s_x, "s_x"), (s_y, "s_y")):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: {what} must be a 4-d tensor (B, h, tokens, features), got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    if q.dtype not in _DTYPES:
        raise ValueError(f"{name}: q must be float32, bfloat16 or float16, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"{name}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if s_x.dtype != torch.float32 or s_y.dtype != torch.float32:
        raise ValueError(f"{name}: s_x and s_y must be float32, got {s_x.dtype}, {s_y.dtype}")
    if len({t.device for t in (q, k, v, s_x, s_y)}) != 1:
        raise ValueError(f"{name}: all tensors must be on one device")
    B, h, T, D = q.shape
    if k.shape != q.shape:
        raise ValueError(f"{name}: k {tuple(k.shape)} must have q's shape {tuple(q.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"{name}: v {tuple(v.shape)} must be (B, h, T, dv) = ({B}, {h}, {T}, dv)")
    if min(B, h, T, D, v.shape[3]) < 1:
        raise ValueError(f"{name}: empty q or v: {tuple(q.shape)}, {tuple(v.shape)}")
    if isinstance(num_prefix, bool) or not isinstance(num_prefix, int) or not 0 <= num_prefix <= T:
        raise ValueError(f"{name}: num_prefix must be an int in [0, T={T}], got {num_prefix!r}")
    N = T - num_prefix
    for t, what in ((s_x, "s_x"), (s_y, "s_y")):
        if t.shape[:3] != (B, h, N) or t.shape[3] < 1:
            raise ValueError(f"{name}: {what} {tuple(t.shape)} must be (B, h, N, width) = ({B}, {h}, {N}, >=1): "
                             f"N = T - num_prefix patch tokens")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{name}: scale must be a finite number, got {scale!r}")
    for b, what, least in ((block_m, "block_m", 16), (block_n, "block_n", 16), (num_warps, "num_warps", 1)):
        if isinstance(b, bool) or not isinstance(b, int) or b < least or b & (b - 1):
            raise ValueError(f"{name}: {what} must be a power of two >= {least}, got {b!r}")


def sape2_flash_attention(q: Tensor, k: Tensor, v: Tensor, s_x: Tensor, s_y: Tensor, num_prefix: int,
                          scale: float, *, block_m: int | None = None, block_n: int | None = None,
                          num_warps: int | None = None) -> Tensor:
    """`softmax(q·kᵀ·scale + bias) @ v` with the SaPE² bias of the descriptors, fused (module docstring).

    `q, k: (B, h, T, d)`, `v: (B, h, T, dv)` in one of float32 / bfloat16 / float16, any strides;
    `T = num_prefix + N`, prefix tokens first. `s_x: (B, h, N, W)`, `s_y: (B, h, N, H)` float32
    descriptors of the N patch tokens. Returns `(B, h, T, dv)` in q's dtype; differentiable in
    q, k, v, s_x and s_y. `block_m`/`block_n` (query/key tile rows, powers of two >= 16) and
    `num_warps` tune the kernels; left None they are `DEFAULTS[q.dtype == torch.float32]`."""
    if not available():
        raise RuntimeError("sape2_flash_attention needs triton (pip install triton), and a GPU or TRITON_INTERPRET=1")
    default = DEFAULTS[isinstance(q, Tensor) and q.dtype == torch.float32]
    block_m, block_n, num_warps = (d if x is None else x for d, x in zip(default, (block_m, block_n, num_warps)))
    _check(q, k, v, s_x, s_y, num_prefix, scale, block_m, block_n, num_warps)
    if q.device.type != "cuda" and not _kernels()[3]:
        raise ValueError(f"sape2_flash_attention: the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1 set "
                         f"before triton is imported, for CPU ones), got {q.device}")
    return _SaPE2Flash.apply(q, k, v, s_x, s_y, num_prefix, float(scale), block_m, block_n, num_warps)
