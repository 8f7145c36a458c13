"""The pieces SaPE²'s and CoPE's hand-written attention (functional.py) share: the in-place
softmax and its backward, q·scale written contiguous, packed q/k/v and the one buffer their
gradients are written into, the dtype they are computed in with autocast off (docs/encodings.md,
"Mixed precision"), the fused C++ kernel for a call, and the Euclidean distances with their
gradient."""
from __future__ import annotations

import functools

import torch
from torch import Tensor

from . import _kernels
from ._interp import compute_dtype, full_precision


def _softmax_(x: Tensor) -> Tensor:
    """Softmax over the last axis, in place on CPU (ATen's CPU kernel reads each row before it
    writes it; one `(B, h, T, T)` allocation less per layer), else a new tensor."""
    if x.device.type == "cpu":
        return torch.ops.aten._softmax.out(x, -1, False, out=x)
    return torch.softmax(x, dim=-1)


def _softmax_backward_(grad_attn: Tensor, attn: Tensor) -> Tensor:
    """`attn · (grad − Σ grad·attn)`, in place over `grad_attn` on CPU (as `_softmax_`)."""
    if grad_attn.device.type == "cpu":
        return torch.ops.aten._softmax_backward_data.out(grad_attn, attn, -1, attn.dtype, grad_input=grad_attn)
    return torch._softmax_backward_data(grad_attn, attn, -1, attn.dtype)


def _scaled_contiguous(x: Tensor, scale: float) -> Tensor:
    """`x · scale` in a new contiguous tensor, in one pass (`x * scale` keeps the strides of a
    permuted `x`, e.g. q sliced from a packed qkv, and every matmul would then copy it again)."""
    return torch.mul(x, scale, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))


def _unpack(ctx, q: Tensor, k: Tensor | None, v: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """`(q, k, v)`, or the three slices of a packed `qkv: (3, B, h, T, d)` passed as `q` with
    `k = v = None` (then the backward returns one gradient for it: `_grad_buffers`)."""
    ctx.packed = k is None
    return tuple(q.unbind(0)) if ctx.packed else (q, k, v)


def _grad_buffers(ctx, like: Tensor) -> tuple[Tensor | None, list]:
    """Packed input: one `(3, B, h, T, d)` gradient whose slices the matmuls write into
    (`out=`), instead of three tensors that autograd then stacks (a copy of all three)."""
    if not ctx.packed:
        return None, [None, None, None]
    packed_grad = torch.empty((3, *like.shape), dtype=like.dtype, device=like.device)
    return packed_grad, list(packed_grad.unbind(0))


def _kernel_grad_buffers(ctx, q_s: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor | None, list]:
    """`_grad_buffers`, with three new tensors where the input was not packed: the C++
    operators write the gradients of q, k and v into the tensors they are given."""
    packed_grad, outs = _grad_buffers(ctx, q_s)
    if packed_grad is None:
        outs = [torch.empty_like(q_s), torch.empty_like(k), torch.empty_like(v)]
    return packed_grad, outs


def _qkv_grads(packed_grad: Tensor | None, grad_q: Tensor, grad_k: Tensor, grad_v: Tensor) -> tuple:
    """The backward's first three outputs: `(packed_grad, None, None)` for a packed input (the grads
    were written into it), else `(grad_q, grad_k, grad_v)`."""
    return (packed_grad, None, None) if packed_grad is not None else (grad_q, grad_k, grad_v)


def _is_packed(qkv: Tensor | None, q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether `qkv` is given and q, k, v are exactly its three slices (else ValueError)."""
    if qkv is None:
        return False
    parts = qkv.unbind(0) if qkv.dim() == q.dim() + 1 and qkv.shape[0] == 3 else ()
    if len(parts) != 3 or any(a.shape != b.shape or a.stride() != b.stride() or a.data_ptr() != b.data_ptr()
                              for a, b in zip(parts, (q, k, v))):
        raise ValueError("qkv must be the (3, ...) tensor whose slices qkv[0], qkv[1], qkv[2] are q, k, v")
    return True


def _in_compute_dtype(q: Tensor, k: Tensor, v: Tensor, qkv: Tensor | None):
    """`(q, k, v, qkv)` in `compute_dtype` (float32 for bf16 / fp16 inputs; docs/encodings.md,
    "Mixed precision"). A packed `qkv` is cast once and stays packed (its slices are the new q,
    k, v); the casts are autograd ops, so the gradients reach the half inputs in their dtype.
    Under torch.compile q, k, v are cast one by one (dynamo cannot compare data pointers)."""
    dtype = compute_dtype(q, k, v)
    if all(t.dtype == dtype for t in (q, k, v)):
        return q, k, v, qkv
    if not torch.compiler.is_compiling() and _is_packed(qkv, q, k, v):
        qkv = qkv.to(dtype)
        return (*qkv.unbind(0), qkv)
    return q.to(dtype), k.to(dtype), v.to(dtype), None


def _autocast_off(backward):
    """A Function's backward with autocast off, as its forward (a caller may run `.backward()`
    inside an autocast block; the matmuls of a hand-written backward would then run in half)."""
    @functools.wraps(backward)
    def run(ctx, grad_out):
        with full_precision(grad_out):
            return backward(ctx, grad_out)
    return run


def _kernel_for(*ts: Tensor):
    """The fused C++ CPU kernels (`_kernels.py`) when they apply to these tensors (CPU,
    float32/float64) and are built, else None: the eager code below runs."""
    if all(t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64) for t in ts) \
            and len({t.dtype for t in ts}) == 1:
        return _kernels.kernels()
    return None


def _consume(ctx) -> None:
    """The backwards below overwrite saved buffers in place (fewer `T x T` allocations): a
    second backward through the same graph (`retain_graph=True`) is refused, not wrong."""
    if getattr(ctx, "consumed", False):
        raise RuntimeError("sape2_attention / cope_attention: backward through the same graph twice "
                           "is not supported (their backward reuses saved buffers); run the forward again")
    ctx.consumed = True


def _add_distances_(out: Tensor, s: Tensor) -> Tensor:
    """Add the Euclidean distances `‖s_i − s_n‖` of `s: (..., N, m)` to `out: (..., N, N)` (any
    strides) and return `1/distance` (0 where the distance is 0: torch.cdist's gradient
    there) in the one new `(..., N, N)` tensor. Squared distances come from one matmul of
    augmented vectors `[−2s_i, |s_i|², 1]·[s_n, 1, |s_n|²]`; the diagonal is exactly 0."""
    sq = (s * s).sum(-1, keepdim=True)                                        # (..., N, 1)
    one = torch.ones_like(sq)
    left = torch.cat((s * -2.0, sq, one), dim=-1)                             # (..., N, m+2)
    right = torch.cat((s, one, sq), dim=-1)                                   # (..., N, m+2)
    dist = torch.matmul(left, right.transpose(-1, -2))                        # (..., N, N) squared
    dist.diagonal(dim1=-2, dim2=-1).zero_()
    dist.clamp_min_(0.0).sqrt_()
    out += dist
    return dist.reciprocal_().nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)


def _distance_grad_(s: Tensor, inv: Tensor, grad: Tensor) -> Tensor:
    """Gradient of `sum(grad · dist)` w.r.t. `s: (..., N, m)` from `inv = 1/dist` (0 at 0),
    which it overwrites with `w = grad · inv`: `s_i · Σ_n (w + wᵀ)_in − ((w + wᵀ) s)_i`;
    `[s, 1]ᵀ` times `w` and `wᵀ` (narrow outputs, `wᵀ` a view) gives both terms."""
    w = inv.mul_(grad)                                                        # (..., N, N)
    s_t = torch.cat((s, torch.ones_like(s[..., :1])), dim=-1).transpose(-1, -2)  # (..., m+1, N)
    ws_t = torch.matmul(s_t, w.transpose(-1, -2)).add_(torch.matmul(s_t, w))  # (..., m+1, N)
    rows = ws_t[..., -1:, :].transpose(-1, -2)                                # (..., N, 1)
    return s * rows - ws_t[..., :-1, :].transpose(-1, -2)                     # (..., N, m)
