"""The fused SaPE² / CoPE attention as `torch.library` custom ops, so that `torch.compile` keeps
the fused C++ kernel instead of tracing around it.

`sape2_attention` / `cope_attention` (functional.py) run an `autograd.Function` whose forward
writes into its own buffers in place and calls the C++ kernel of `_kernels.py`: Dynamo cannot
trace that. Under `torch.compile` (`torch.compiler.is_compiling()`) they call these ops
instead, which inductor treats as opaque calls:

* `vitpe::sape2_attend` / `vitpe::cope_attend`: the forward of the kernel path (the same code
  as functional.py's kernel branch), returning the output and what the backward needs;
* `vitpe::sape2_attend_backward` / `vitpe::cope_attend_backward`: the backward, returning the
  gradients of q, k, v and the read-out tables;
* each with a fake (meta) implementation giving the outputs' shapes for tracing, and
  `register_autograd` linking forward and backward.

Deviations from the eager `autograd.Function`: no packed-qkv gradient buffer (the compiled graph
stacks the three gradients itself), and k, v are saved as given and made contiguous again in the
backward (a custom op may not return an input's memory). Only the kernel path is an op: where the
kernel does not apply (no compiler, `VITPE_NO_CPP=1`, other devices or dtypes), model.py keeps
its compiled bias path (`fused_under_compile`). tests/test_cope_sape2.py checks compiled forward
and gradients against eager and that the compiled graph calls these ops.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import _kernels

__all__ = ["fused_under_compile", "sape2_attend", "cope_attend"]


@torch.compiler.assume_constant_result
def _kernel_ready() -> bool:
    return _kernels.kernels() is not None


def fused_under_compile(q: Tensor) -> bool:
    """Whether the fused attention can run inside a compiled graph for `q`: the C++ kernel is
    built and `q` is a CPU float32/float64 tensor."""
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and _kernel_ready()


def _readout_tables(e_x: Tensor, e_y: Tensor, dtype: torch.dtype, mul: float) -> Tensor:
    tab = torch.cat((e_x, e_y), dim=1).to(dtype)
    return tab * mul if mul != 1.0 else tab


# ----------------------------------------------------------------------------- SaPE²
@torch.library.custom_op("vitpe::sape2_attend", mutates_args=())
def _sape2_fwd(q: Tensor, k: Tensor, v: Tensor, e_x: Tensor, e_y: Tensor, H: int, W: int, scale: float, P: int,
               npos_max: int, readout: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    kern = _kernels.kernels()
    q_s = torch.mul(q, scale, out=torch.empty(q.shape, dtype=q.dtype, device=q.device))   # (B, h, T, d)
    k, v = k.contiguous(), v.contiguous()
    src, tab = (q_s, _readout_tables(e_x, e_y, q.dtype, 1.0 / scale)) if readout == "query" \
        else (k, _readout_tables(e_x, e_y, q.dtype, 1.0))
    z = torch.matmul(src, tab)                                                # (B, h, T, 2 npos_max)
    out, attn, sx, sy, gx, gy = kern.sape2_attend_fwd(q_s, k, v, z, P, H, W, npos_max)
    return out, q_s, attn, z, sx, sy, gx, gy


@_sape2_fwd.register_fake
def _(q, k, v, e_x, e_y, H, W, scale, P, npos_max, readout):
    B, h, T, _ = q.shape
    N = H * W
    new = lambda *shape: q.new_empty(shape)
    return (q.new_empty((B, h, T, v.shape[-1])), new(B, h, T, q.shape[-1]), new(B, h, T, T), new(B, h, T, 2 * npos_max),
            new(B, h, N, W), new(B, h, N, H), new(B, h, N, W), new(B, h, N, H))


@torch.library.custom_op("vitpe::sape2_attend_backward", mutates_args=())
def _sape2_bwd(grad_out: Tensor, q_s: Tensor, k: Tensor, v: Tensor, attn: Tensor, e_x: Tensor, e_y: Tensor,
               z: Tensor, sx: Tensor, sy: Tensor, gx: Tensor, gy: Tensor, H: int, W: int, scale: float, P: int,
               npos_max: int, readout: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    kern = _kernels.kernels()
    k, v, grad_out = k.contiguous(), v.contiguous(), grad_out.contiguous()
    grad_q, grad_k, grad_v = torch.empty_like(q_s), torch.empty_like(k), torch.empty_like(v)
    grad_z = kern.sape2_attend_bwd(grad_out, q_s, k, v, attn, z, sx, sy, gx, gy, grad_q, grad_k, grad_v,
                                   scale, P, H, W, npos_max)                  # (B, h, T, 2 npos_max)
    src, s = (q_s, 1.0 / scale) if readout == "query" else (k, 1.0)
    tab = _readout_tables(e_x, e_y, q_s.dtype, 1.0)
    (grad_q if readout == "query" else grad_k).view(-1, tab.shape[0]).addmm_(
        grad_z.view(-1, grad_z.shape[-1]), tab.transpose(0, 1))
    grad_tab = torch.mm(src.reshape(-1, src.shape[-1]).transpose(0, 1), grad_z.view(-1, grad_z.shape[-1]))
    grad_ex, grad_ey = (g * s if s != 1.0 else g.clone() for g in grad_tab.split(npos_max, dim=1))
    return grad_q, grad_k, grad_v, grad_ex.to(e_x.dtype), grad_ey.to(e_y.dtype)


@_sape2_bwd.register_fake
def _(grad_out, q_s, k, v, attn, e_x, e_y, z, sx, sy, gx, gy, H, W, scale, P, npos_max, readout):
    return (q_s.new_empty(q_s.shape), q_s.new_empty(k.shape), q_s.new_empty(v.shape), e_x.new_empty(e_x.shape),
            e_y.new_empty(e_y.shape))


def _sape2_setup(ctx, inputs, output) -> None:
    q, k, v, e_x, e_y, H, W, scale, P, npos_max, readout = inputs
    _, q_s, attn, z, sx, sy, gx, gy = output
    ctx.save_for_backward(q_s, k, v, attn, e_x, e_y, z, sx, sy, gx, gy)
    ctx.args = (H, W, scale, P, npos_max, readout)


def _sape2_backward(ctx, grad_out, *_):
    grads = _sape2_bwd(grad_out, *ctx.saved_tensors, *ctx.args)
    return (*grads, None, None, None, None, None, None)


_sape2_fwd.register_autograd(_sape2_backward, setup_context=_sape2_setup)


def sape2_attend(q: Tensor, k: Tensor, v: Tensor, e_x: Tensor, e_y: Tensor, grid: tuple[int, int], scale: float,
                 num_prefix: int, npos_max: int, readout: str) -> Tensor:
    """`sape2_attention`'s kernel path as one custom op (its arguments checked there)."""
    return _sape2_fwd(q, k, v, e_x, e_y, grid[0], grid[1], scale, num_prefix, npos_max, readout)[0]


# ----------------------------------------------------------------------------- CoPE
@torch.library.custom_op("vitpe::cope_attend", mutates_args=())
def _cope_fwd(q: Tensor, k: Tensor, v: Tensor, e: Tensor, scale: float, npos_max: int
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    kern = _kernels.kernels()
    q_s = torch.mul(q, scale, out=torch.empty(q.shape, dtype=q.dtype, device=q.device))   # (B, h, T, d)
    z = torch.matmul(q_s, e.to(q.dtype) / scale)                              # q·e (B, h, T, M+1)
    k, v = k.contiguous(), v.contiguous()
    out, attn, gates = kern.cope_attend_fwd(q_s, k, v, z, npos_max)
    return out, q_s, attn, gates, z


@_cope_fwd.register_fake
def _(q, k, v, e, scale, npos_max):
    B, h, T, d = q.shape
    new = lambda *shape: q.new_empty(shape)
    return new(B, h, T, v.shape[-1]), new(B, h, T, d), new(B, h, T, T), new(B, h, T, T), new(B, h, T, npos_max)


@torch.library.custom_op("vitpe::cope_attend_backward", mutates_args=())
def _cope_bwd(grad_out: Tensor, q_s: Tensor, k: Tensor, v: Tensor, attn: Tensor, gates: Tensor, z: Tensor,
              e: Tensor, scale: float, npos_max: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    kern = _kernels.kernels()
    k, v, grad_out = k.contiguous(), v.contiguous(), grad_out.contiguous()
    e_q = e.to(q_s.dtype)
    grad_q, grad_k, grad_v = torch.empty_like(q_s), torch.empty_like(k), torch.empty_like(v)
    grad_z = kern.cope_attend_bwd(grad_out, q_s, k, v, attn, gates, z, grad_q, grad_k, grad_v, scale, npos_max)
    grad_q.view(-1, grad_q.shape[-1]).addmm_(grad_z.view(-1, npos_max), e_q.transpose(0, 1))   # z = q·e
    grad_e = torch.mm(q_s.reshape(-1, q_s.shape[-1]).transpose(0, 1), grad_z.view(-1, npos_max)).div_(scale)
    return grad_q, grad_k, grad_v, grad_e.to(e.dtype)


@_cope_bwd.register_fake
def _(grad_out, q_s, k, v, attn, gates, z, e, scale, npos_max):
    return q_s.new_empty(q_s.shape), q_s.new_empty(k.shape), q_s.new_empty(v.shape), e.new_empty(e.shape)


def _cope_setup(ctx, inputs, output) -> None:
    q, k, v, e, scale, npos_max = inputs
    _, q_s, attn, gates, z = output
    ctx.save_for_backward(q_s, k, v, attn, gates, z, e)
    ctx.args = (scale, npos_max)


def _cope_backward(ctx, grad_out, *_):
    return (*_cope_bwd(grad_out, *ctx.saved_tensors, *ctx.args), None, None)


_cope_fwd.register_autograd(_cope_backward, setup_context=_cope_setup)


def cope_attend(q: Tensor, k: Tensor, v: Tensor, e: Tensor, scale: float, npos_max: int) -> Tensor:
    """`cope_attention`'s kernel path as one custom op (its arguments checked there)."""
    return _cope_fwd(q, k, v, e, scale, npos_max)[0]
