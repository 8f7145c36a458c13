"""Whole-attention functions for SaPE² and CoPE, for researchers with their own models.

`sape2_attention(q, k, v, e_x, e_y, grid)` and `cope_attention(q, k, v, e)` return
`softmax(q·kᵀ/sqrt d + bias) v` with the bias of docs/encodings.md, computed with the logits
shared: `q·kᵀ` is formed once, the bias is added to it in place and the softmax, `@ v` and
the whole backward are hand-written (`torch.autograd.Function`), so no `(B, h, T, T)` tensor
is allocated that the attention itself does not need. The modules (`SaPE2`, `CoPE`) call them
on the model's fast path; `sape2_bias` / `cope_bias` stay for the trace path and for using
the bias alone (e.g. as an SDPA mask). Exact against those (tests/test_cope_sape2.py).

Why it is built this way (docs/encodings.md "Performance notes"; BENCHMARKS.md sections 1,
7 and 8): on CPU the time goes into memory passes over `T x T`-sized tensors and into fresh
allocations of them, not into multiply-adds, so both functions minimise those.
* SaPE²: the gate logits are strided views of the attention's own logits (a small batched
  matmul per axis on the `(H, W, d)` views was measured slower: thousands of tiny products),
  and their gradient is added into the logits' gradient in place. Line sums, read-outs and
  interpolation run by hand on `(B, h, L, A, A)`-sized tensors; read-outs and their steps come
  from one matmul with `[E, ΔE]`. The distances are one matmul of augmented vectors per axis,
  added into the logits; the same buffer then becomes `1/distance` (0 at zero distance, as
  torch.cdist's gradient) for the backward, which is one multiply and two narrow matmuls per
  axis. The `(B, h, N, N)` bias is never stored; softmax and its backward run in place (CPU).
* CoPE: the eager code runs in *reversed key order* (k and v flipped along the tokens, which
  changes no softmax): the reverse cumulative sum of the gates is then a plain contiguous
  `cumsum`. The interpolation `z[⌊p⌋] + f·(z[⌊p⌋+1] − z[⌊p⌋])` needs one integer index per
  pair (kept for the backward); the gate gradient is `σ'` times the suffix sum of `∂/∂p` (in
  reversed order, a flip–cumsum–flip). The C++ kernel keeps the keys in their own order (its
  loops run backwards), so it needs no flipped copies of k, v and their gradients.
* On CPU (float32/64) both hand that middle part (SaPE²: lines, read-outs and distances,
  forward and backward; CoPE: cumsum, interpolation and their backward) to the fused C++
  kernel of `_kernels.py` (built once, cached; docs/encodings.md), which keeps every `N x N`
  intermediate in cache and recomputes the distances in the backward. The eager code below
  is the fallback (`VITPE_NO_CPP=1`, no compiler, other devices and dtypes) and the reference
  the kernel is tested against. Under `torch.compile` the kernel path runs as `torch.library`
  custom ops (compiled_ops.py), which inductor keeps as opaque calls.
* Given `qkv=` (q, k, v as slices of one packed projection, the model's case), the backward
  writes the three gradients into one tensor with `matmul(..., out=)`, instead of returning
  three that autograd then stacks; `q·scale` is written contiguous in one pass (a plain
  `q * scale` keeps the packed strides and every matmul would copy it again).
"""
from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor

from . import fused_gpu
from ._attend import (_add_distances_, _autocast_off, _consume, _distance_grad_, _grad_buffers, _in_compute_dtype,
                      _is_packed, _kernel_for, _kernel_grad_buffers, _qkv_grads, _scaled_contiguous, _softmax_,
                      _softmax_backward_, _unpack)   # what SaPE² and CoPE share
from ._interp import check_npos_max, full_precision, reverse_cumsum

__all__ = ["sape2_attention", "cope_attention"]


def fused_under_compile(q: Tensor) -> bool:
    """Whether the fused attention runs inside a `torch.compile` graph for `q` (as the custom
    ops of compiled_ops.py: the C++ kernel built, `q` on CPU in float32/64). Call it only while
    compiling: compiled_ops imports torch._dynamo (a second at start-up, kept out of the app's)."""
    from . import compiled_ops
    return compiled_ops.fused_under_compile(q)


# ----------------------------------------------------------------------------- SaPE²
def _lines(logits: Tensor, grid: tuple[int, int], P: int) -> tuple[Tensor, Tensor]:
    """Views of the patch block of `logits: (B, h, P+N, P+N)`: same-row entries
    `(B, h, H, W, W)` (`[y, x, u]`: patch (y, x) to (y, u)) and same-column entries
    `(B, h, W, H, H)` (`[x, y, v]`: (y, x) to (v, x)), diagonals of its `(H, W, H, W)` view."""
    H, W = grid
    l6 = logits[..., P:, P:].unflatten(-1, (H, W)).unflatten(-3, (H, W))     # (B, h, H, W, H, W)
    return (l6.diagonal(dim1=2, dim2=4).permute(0, 1, 4, 2, 3),
            l6.diagonal(dim1=3, dim2=5).permute(0, 1, 4, 2, 3))


def _steps(z: Tensor) -> Tensor:
    """`z: (..., M+1)` -> `z[t+1] − z[t]` for `t < M`, 0 at `M`."""
    return torch.cat((z[..., 1:] - z[..., :-1], torch.zeros_like(z[..., :1])), dim=-1)


def _line_forward(line: Tensor, z: Tensor, z_step: Tensor, M: int):
    """SaPE² steps 1, 2, 4 on one axis. `line: (B, h, L, A, A)` gate logits, `z, z_step:
    (B, h, L, A, M+1)` read-outs and their steps `z[t+1] − z[t]` -> descriptors
    `(B, h, L, A, A)` and what the backward needs."""
    gates = torch.sigmoid(line)
    pos = reverse_cumsum(gates).clamp_max_(M)                                # Σ_{u >= m} g[u], capped
    lo = pos.floor()
    frac = pos.sub_(lo)
    lo = lo.long()
    step_lo = torch.gather(z_step, -1, lo)                                    # z[lo+1] − z[lo] (0 at M)
    desc = torch.gather(z, -1, lo).addcmul_(step_lo, frac)                    # z[lo] + f (z[lo+1] − z[lo])
    return desc, (gates, frac, lo, step_lo)


def _line_backward(grad: Tensor, saved, M: int) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of the gate logits `(B, h, L, A, A)`, the read-outs and their steps
    (`(B, h, L, A, M+1)` each)."""
    gates, frac, lo, step_lo = saved
    g_frac = grad * frac
    grad_z = grad.new_zeros(*grad.shape[:-1], M + 1).scatter_add_(-1, lo, grad)
    grad_step = torch.zeros_like(grad_z).scatter_add_(-1, lo, g_frac)
    # ∂pos = grad · (z[lo+1] − z[lo]) (0 when capped); the reverse cumsum's adjoint is a cumsum
    grad_gates = g_frac.copy_(step_lo).mul_(grad).cumsum(-1)
    return torch.ops.aten.sigmoid_backward(grad_gates, gates), grad_z, grad_step


def _tables(e_x: Tensor, e_y: Tensor, dtype: torch.dtype) -> Tensor:
    """`[E_x, ΔE_x, E_y, ΔE_y]: (d, 4(M+1))` with `ΔE[:, t] = E[:, t+1] − E[:, t]` (0 at M): one
    matmul with it gives every read-out and every step between neighbouring read-outs."""
    return torch.cat([t for e in (e_x, e_y) for t in (e, _steps(e))], dim=1).to(dtype)


def _readout_tables(e_x: Tensor, e_y: Tensor, dtype: torch.dtype, mul: float) -> Tensor:
    """`[E_x, E_y] · mul: (d, 2(M+1))` for the C++ kernel, which forms the steps itself."""
    tab = torch.cat((e_x, e_y), dim=1).to(dtype)
    return tab * mul if mul != 1.0 else tab


def _tables_grad(grad: Tensor, npos_max: int) -> tuple[Tensor, Tensor]:
    """Gradient w.r.t. `(E_x, E_y)` from the gradient of `_tables`' output `(d, 4(M+1))`."""
    out = []
    parts = grad.split(npos_max, dim=1)                                       # E_x, ΔE_x, E_y, ΔE_y
    for g, g_step in ((parts[0], parts[1]), (parts[2], parts[3])):
        g = g.clone()
        g[:, 1:] += g_step[:, :-1]
        g[:, :-1] -= g_step[:, :-1]
        out.append(g)
    return out[0], out[1]


class _SaPE2Attend(torch.autograd.Function):
    """SaPE² attention, forward and backward by hand (docs/encodings.md steps 1–5, then
    softmax and `@ v`). The gates are read from the attention's own logits (strided views of
    its `T x T` block); their gradient is added into the logits' gradient in place."""

    @staticmethod
    def forward(ctx, q, k, v, e_x, e_y, grid, scale: float, num_prefix: int, npos_max: int, readout: str,
                kern=None):
        q, k, v = _unpack(ctx, q, k, v)
        H, W = grid
        P, M = num_prefix, npos_max - 1
        q_s, k, v = _scaled_contiguous(q, scale), k.contiguous(), v.contiguous()  # each copied once, kept
        ctx.kern = kern
        if kern is not None:                                                  # fused C++ (_kernels.py)
            # read-outs of every token (the prefix rows are not read): from q_s or k as they are,
            # with no copy of the patches' rows; the steps between read-outs come in the kernel
            src, tab = (q_s, _readout_tables(e_x, e_y, q.dtype, 1.0 / scale)) if readout == "query" \
                else (k, _readout_tables(e_x, e_y, q.dtype, 1.0))
            z = torch.matmul(src, tab)                                        # (B, h, T, 2 npos_max)
            out, attn, *lines = kern.sape2_attend_fwd(q_s, k, v, z, P, H, W, npos_max)   # chunk by chunk
            ctx.save_for_backward(q_s, k, v, attn, e_x, e_y, z, *lines)
            ctx.args = grid, scale, P, npos_max, readout
            return out
        logits = torch.matmul(q_s, k.transpose(-1, -2))                       # (B, h, T, T)
        row, col = (t.contiguous() for t in _lines(logits, grid, P))          # (B,h,H,W,W), (B,h,W,H,H)
        r = (q if readout == "query" else k)[:, :, P:].contiguous()           # (B, h, N, d): once, kept
        z = r @ _tables(e_x, e_y, r.dtype)                                    # (B, h, N, 4(M+1))
        z_x, zs_x = (rearrange(t, "b h (y x) t -> b h y x t", y=H) for t in z.split(npos_max, -1)[:2])
        z_y, zs_y = (rearrange(t, "b h (y x) t -> b h x y t", y=H) for t in z.split(npos_max, -1)[2:])
        s_x, saved_x = _line_forward(row, z_x, zs_x, M)                       # (B, h, H, W, W)
        s_y, saved_y = _line_forward(col, z_y, zs_y, M)                       # (B, h, W, H, H)
        s_x = rearrange(s_x, "b h y x m -> b h (y x) m")                     # (B, h, N, W)
        s_y = rearrange(s_y, "b h x y m -> b h (y x) m").contiguous()        # (B, h, N, H)
        patch = logits[..., P:, P:]                                           # (B, h, N, N) view
        inv_x = _add_distances_(patch, s_x)                                   # (B, h, N, N)
        inv_y = _add_distances_(patch, s_y)
        attn = _softmax_(logits)                                              # (B, h, T, T)
        del logits, patch, row, col
        ctx.save_for_backward(q_s, k, v, attn, e_x, e_y, r, s_x, s_y, inv_x, inv_y, *saved_x, *saved_y)
        ctx.args = grid, scale, P, npos_max, readout
        return torch.matmul(attn, v)                                          # (B, h, T, dv)

    @staticmethod
    @_autocast_off
    def backward(ctx, grad_out):
        _consume(ctx)
        if ctx.kern is not None:
            return _SaPE2Attend._backward_kernel(ctx, grad_out)
        q_s, k, v, attn, e_x, e_y, r, s_x, s_y, inv_x, inv_y, *saved = ctx.saved_tensors
        (H, W), scale, P, npos_max, readout = ctx.args
        M = npos_max - 1
        grad_out = grad_out.contiguous()
        packed_grad, (out_q, out_k, out_v) = _grad_buffers(ctx, q_s)
        grad_v = torch.matmul(attn.transpose(-1, -2), grad_out, out=out_v)
        grad_logits = _softmax_backward_(torch.matmul(grad_out, v.transpose(-1, -2)), attn)
        del attn
        g = grad_logits[..., P:, P:]                                          # the bias's gradient
        grad_sx = _distance_grad_(s_x, inv_x, g)                              # (B, h, N, W)
        del inv_x
        grad_sy = _distance_grad_(s_y, inv_y, g)                              # (B, h, N, H)
        del inv_y
        grad_row, gz_x, gzs_x = _line_backward(rearrange(grad_sx, "b h (y x) m -> b h y x m", y=H), saved[:4], M)
        grad_col, gz_y, gzs_y = _line_backward(rearrange(grad_sy, "b h (y x) m -> b h x y m", y=H), saved[4:], M)
        row, col = _lines(grad_logits, (H, W), P)                             # the gates' logits: add in place
        row += grad_row                                                       # (i, i) lies on both: both add
        col += grad_col
        grad_z = torch.cat([rearrange(t, "b h y x t -> b h (y x) t") for t in (gz_x, gzs_x)]
                           + [rearrange(t, "b h x y t -> b h (y x) t") for t in (gz_y, gzs_y)], dim=-1)
        grad_r = grad_z @ _tables(e_x, e_y, r.dtype).transpose(0, 1)          # (B, h, N, d)
        grad_tables = r.view(-1, r.shape[-1]).transpose(0, 1) @ grad_z.view(-1, grad_z.shape[-1])
        grad_ex, grad_ey = _tables_grad(grad_tables, npos_max)                # (d, M+1) each
        grad_q = torch.matmul(grad_logits, k, out=out_q).mul_(scale)
        grad_k = torch.matmul(grad_logits.transpose(-1, -2), q_s, out=out_k)  # logits = q_s·kᵀ
        (grad_q if readout == "query" else grad_k)[:, :, P:] += grad_r
        return (*_qkv_grads(packed_grad, grad_q, grad_k, grad_v), grad_ex.to(e_x.dtype), grad_ey.to(e_y.dtype),
                None, None, None, None, None, None)

    @staticmethod
    def _backward_kernel(ctx, grad_out):
        """The backward with the fused C++ kernel, chunk by chunk of (batch, head) pairs as the
        forward (`sape2_attend_bwd`): softmax backward, distance and line gradients, the gates'
        gradient added into the logits' gradient, the three matmuls into q, k, v's gradients."""
        q_s, k, v, attn, e_x, e_y, z, *lines = ctx.saved_tensors
        (H, W), scale, P, npos_max, readout = ctx.args
        grad_out = grad_out.contiguous()
        packed_grad, (grad_q, grad_k, grad_v) = _kernel_grad_buffers(ctx, q_s, k, v)
        grad_z = ctx.kern.sape2_attend_bwd(grad_out, q_s, k, v, attn, z, *lines, grad_q, grad_k, grad_v,
                                           scale, P, H, W, npos_max)         # (B, h, T, 2 npos_max)
        # z = q·[E_x, E_y] (or k·[E_x, E_y]): q_s = q·scale is what is kept
        src, s = (q_s, 1.0 / scale) if readout == "query" else (k, 1.0)
        tab = _readout_tables(e_x, e_y, q_s.dtype, 1.0)
        (grad_q if readout == "query" else grad_k).view(-1, tab.shape[0]).addmm_(
            grad_z.view(-1, grad_z.shape[-1]), tab.transpose(0, 1))
        grad_tab = torch.mm(src.reshape(-1, src.shape[-1]).transpose(0, 1), grad_z.view(-1, grad_z.shape[-1]))
        grad_ex, grad_ey = (g.mul_(s) if s != 1.0 else g for g in grad_tab.split(npos_max, dim=1))
        return (*_qkv_grads(packed_grad, grad_q, grad_k, grad_v), grad_ex.to(e_x.dtype), grad_ey.to(e_y.dtype),
                None, None, None, None, None, None)


def sape2_attention(q: Tensor, k: Tensor, v: Tensor, e_x: Tensor, e_y: Tensor, grid: tuple[int, int],
                    readout: str = "query", npos_max: int = 10, *, num_prefix: int = 0,
                    scale: float | None = None, use_kernel: bool = True, qkv: Tensor | None = None) -> Tensor:
    """Attention with the SaPE² bias, `(B, h, T, dv)`.

    `q, k: (B, h, T, d)`, `v: (B, h, T, dv)` with `T = num_prefix + H·W` (prefix tokens first,
    patches row-major; prefix tokens take part in the attention but not in SaPE², and get
    zero bias), `e_x, e_y: (d, npos_max)`. `scale` defaults to `d^-1/2`; the gates are
    `σ(q·k·scale)` with the same scale. Equal (to rounding) to
    `softmax(q·kᵀ·scale + sape2_bias(q_p, k_p, e_x, e_y, grid, num_prefix=P)) @ v`.
    On CPU (float32/64) the fused C++ kernel of `_kernels.py` runs unless `use_kernel=False`,
    `VITPE_NO_CPP=1` or it could not be built; on CUDA the Triton kernels of fused_gpu.py
    (unless `use_kernel=False` or `VITPE_NO_TRITON=1`); the eager code gives the same to rounding.
    bf16 / fp16 inputs (autocast or a half model) are computed on in float32 and the output is
    returned in q's dtype (docs/encodings.md, "Mixed precision").
    `qkv`: when q, k, v are `qkv[0], qkv[1], qkv[2]` of one `(3, B, h, T, d)` tensor (a ViT's
    packed projection), pass it as well: the backward then writes the three gradients into one
    tensor, instead of returning three that autograd stacks (a copy of all three per layer).
    """
    H, W = grid
    B, h, T, d = q.shape
    P = num_prefix
    if T != P + H * W:
        raise ValueError(f"q has {T} tokens but num_prefix {P} + grid {grid} make {P + H * W}")
    if readout not in ("query", "key"):
        raise ValueError(f"unknown readout {readout!r}; valid: ('query', 'key')")
    check_npos_max(npos_max)
    for name, e in (("e_x", e_x), ("e_y", e_y)):
        if e.shape != (d, npos_max):
            raise ValueError(f"{name} must have shape (d, npos_max) = {(d, npos_max)}, got {tuple(e.shape)}")
    scale = d ** -0.5 if scale is None else scale
    if use_kernel and fused_gpu.applies(q, k, v):                             # CUDA: Triton, no T x T tensors
        return fused_gpu.sape2_attention(q, k, v, e_x, e_y, (H, W), scale, P, npos_max, readout)
    with full_precision(q):                                                   # float32 inside, autocast or not
        q_in, (q, k, v, qkv) = q, _in_compute_dtype(q, k, v, qkv)
        if torch.compiler.is_compiling() and use_kernel and fused_under_compile(q):
            from . import compiled_ops
            out = compiled_ops.sape2_attend(q, k, v, e_x, e_y, (H, W), scale, P, npos_max, readout)  # a custom op
        else:
            kern = _kernel_for(q, k, v) if use_kernel else None
            args = (qkv, None, None) if _is_packed(qkv, q, k, v) else (q, k, v)
            out = _SaPE2Attend.apply(*args, e_x, e_y, (H, W), scale, P, npos_max, readout, kern)
    return out.to(q_in.dtype)                                                 # (B, h, T, dv) in q's dtype


# ----------------------------------------------------------------------------- CoPE
class _CoPEAttend(torch.autograd.Function):
    """CoPE attention over all T tokens. `z = q·e: (B, h, T, M+1)` is formed here (so that a
    packed qkv gets its whole gradient from this one node). The C++ kernel takes the keys in
    their own order (its loops run backwards); the eager code runs in reversed key order
    (see the module docstring), k and v flipped here."""

    @staticmethod
    def forward(ctx, q, k, v, e, scale: float, npos_max: int, kern=None):
        q, k, v = _unpack(ctx, q, k, v)
        M = npos_max - 1
        q_s = _scaled_contiguous(q, scale)                                    # (B, h, T, d), kept
        e_q = e.to(q.dtype)
        z = torch.matmul(q_s, e_q / scale)                                    # q·e (B, h, T, M+1)
        ctx.kern, ctx.scale, ctx.npos_max, ctx.e_dtype = kern, scale, npos_max, e.dtype
        if kern is not None:                                                  # fused C++ (_kernels.py)
            k, v = k.contiguous(), v.contiguous()
            out, attn, gates = kern.cope_attend_fwd(q_s, k, v, z, npos_max)    # chunk by chunk
            ctx.save_for_backward(q_s, k, v, attn, gates, z, e_q)
            return out
        k_r, v_r = k.flip(2), v.flip(2)                                       # reversed keys
        logits = torch.matmul(q_s, k_r.transpose(-1, -2))                    # (B, h, T, T) reversed keys
        gates = torch.sigmoid(logits)
        frac = gates.cumsum(-1).clamp_max_(M)                                 # positions Σ_{t >= j} g_it
        buf = frac.floor()
        frac -= buf                                                           # the interpolation weight f
        lo = buf.long()                                                       # ⌊p⌋
        z_step = _steps(z)                                                    # (B, h, T, M+1)
        logits += torch.gather(z, -1, lo, out=buf)                            # z[lo] (buf reused)
        step_lo = torch.gather(z_step, -1, lo, out=buf)                       # z[lo+1] − z[lo], 0 at M
        logits.addcmul_(step_lo, frac)
        attn = _softmax_(logits)
        del logits
        ctx.save_for_backward(q_s, k_r, v_r, attn, gates, frac, lo, step_lo, e_q)
        return torch.matmul(attn, v_r)

    @staticmethod
    @_autocast_off
    def backward(ctx, grad_out):
        scale, npos_max = ctx.scale, ctx.npos_max
        grad_out = grad_out.contiguous()
        if ctx.kern is not None:
            q_s, k, v, attn, gates, z, e_q = ctx.saved_tensors
            packed_grad, (grad_q, grad_k, grad_v) = _kernel_grad_buffers(ctx, q_s, k, v)
            grad_z = ctx.kern.cope_attend_bwd(grad_out, q_s, k, v, attn, gates, z, grad_q, grad_k, grad_v,
                                              scale, npos_max)               # (B, h, T, M+1)
        else:
            q_s, k, v_r, attn, gates, frac, lo, step_lo, e_q = ctx.saved_tensors   # k: reversed
            packed_grad, (out_q, out_k, out_v) = _grad_buffers(ctx, q_s)
            grad_v = torch.matmul(attn.transpose(-1, -2), grad_out).flip(2)
            grad_logits = _softmax_backward_(torch.matmul(grad_out, v_r.transpose(-1, -2)), attn)  # = ∂/∂bias
            del attn
            # read-outs: ∂z[lo] += g, ∂z_step[lo] += g f, z_step[t] = z[t+1] − z[t] (t < M)
            buf = grad_logits * frac
            shape = (*grad_logits.shape[:-1], npos_max)
            grad_z = grad_logits.new_zeros(shape).scatter_add_(-1, lo, grad_logits)
            grad_step = grad_logits.new_zeros(shape).scatter_add_(-1, lo, buf)[..., :-1]
            grad_z[..., 1:] += grad_step
            grad_z[..., :-1] -= grad_step
            # positions: ∂p = g · z_step[lo] (0 at the cap); gates: suffix sums (reversed order: a
            # flip, cumsum, flip), then σ′
            grad_gates = torch.mul(step_lo, grad_logits, out=buf).flip(-1).cumsum_(-1).flip(-1)
            grad_logits += torch.ops.aten.sigmoid_backward.grad_input(grad_gates, gates, grad_input=grad_gates)
            grad_k = torch.matmul(grad_logits.transpose(-1, -2), q_s).flip(2)
            if packed_grad is not None:
                out_v.copy_(grad_v)
                out_k.copy_(grad_k)
            grad_q = torch.matmul(grad_logits, k, out=out_q).mul_(scale)
        grad_q.view(-1, grad_q.shape[-1]).addmm_(grad_z.view(-1, npos_max), e_q.transpose(0, 1))  # z = q·e
        grad_e = torch.mm(q_s.view(-1, q_s.shape[-1]).transpose(0, 1), grad_z.view(-1, npos_max)).div_(scale)
        return (*_qkv_grads(packed_grad, grad_q, grad_k, grad_v), grad_e.to(ctx.e_dtype), None, None, None)


def cope_attention(q: Tensor, k: Tensor, v: Tensor, e: Tensor, npos_max: int = 10, *,
                   scale: float | None = None, use_kernel: bool = True, qkv: Tensor | None = None) -> Tensor:
    """Non-causal CoPE attention over all T tokens, `(B, h, T, dv)`: equal (to rounding) to
    `softmax(q·kᵀ·scale + cope_bias(q, k, e)) @ v`. `q, k: (B, h, T, d)`, `v: (B, h, T, dv)`,
    `e: (d, npos_max)`; `scale` defaults to `d^-1/2` (gates `σ(q·k·scale)` with the same).
    On CPU (float32/64) the fused C++ kernel runs unless `use_kernel=False`, on CUDA the Triton
    kernel (fused_gpu.py); half inputs and `qkv` as in `sape2_attention`."""
    d = q.shape[-1]
    check_npos_max(npos_max)
    if e.shape != (d, npos_max):
        raise ValueError(f"e must have shape (d, npos_max) = {(d, npos_max)}, got {tuple(e.shape)}")
    scale = d ** -0.5 if scale is None else scale
    if use_kernel and fused_gpu.applies(q, k, v):                             # CUDA: Triton, no T x T tensors
        return fused_gpu.cope_attention(q, k, v, e, scale, npos_max)
    with full_precision(q):                                                   # float32 inside, autocast or not
        q_in, (q, k, v, qkv) = q, _in_compute_dtype(q, k, v, qkv)
        if torch.compiler.is_compiling() and use_kernel and fused_under_compile(q):
            from . import compiled_ops
            out = compiled_ops.cope_attend(q, k, v, e, scale, npos_max)                           # a custom op
        else:
            kern = _kernel_for(q, k, v) if use_kernel else None
            args = (qkv, None, None) if _is_packed(qkv, q, k, v) else (q, k, v)
            out = _CoPEAttend.apply(*args, e, scale, npos_max, kern)
    return out.to(q_in.dtype)                                                 # (B, h, T, dv) in q's dtype
