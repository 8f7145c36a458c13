"""CoPE and SaPE² (and every encoding in the model) under mixed precision, on any machine.

A CUDA GPU trains under bf16 autocast (train.py). Two things differ from CPU there: CUDA
autocast runs `cumsum`, `sum`, `softmax`, ... in float32 while matmuls run in bf16 (reproduced
here by `tests/cuda_autocast.py`), and the fused attention takes its non-CPU branches (the
`gpu_branches` fixture forces them on CPU). Both together reproduce the two crashes of issue 43
on the code before the fix ("expected m1 and m2 to have the same dtype" for SaPE², "Expected out
tensor to have dtype BFloat16" for CoPE). The contract (docs/encodings.md, "Mixed precision"):
half q, k, v are taken as the values they are, everything after them is computed in float32
(gates, positions, read-outs, distances, softmax, `· v`), the output comes back in q's dtype and
the parameters' gradients in theirs.
"""
from __future__ import annotations

import pytest
import torch

import vitpe_core.encodings.functional as fn
from vitpe_core.config import preset_config
from vitpe_core.encodings import cope_bias, sape2_bias
from vitpe_core.encodings.functional import cope_attention, sape2_attention
from vitpe_core.model import ViT

from cuda_autocast import cuda_autocast

HALF = (torch.bfloat16, torch.float16)
EPS = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}      # unit roundoff of each half type
ENCODINGS = ("none", "ape", "ape2d", "sincos2d", "rpb", "rope_axial", "rope_mixed", "cope+ape", "sape2", "sape2+ape")


@pytest.fixture(params=["cpu-branches", "gpu-branches"])
def gpu_branches(request, monkeypatch):
    """The fused attention's device branches: as on CPU, or forced to what runs on a GPU (a new
    softmax tensor, not the in-place CPU one, and no C++ kernel)."""
    if request.param == "gpu-branches":
        monkeypatch.setattr(fn, "_softmax_", lambda x: torch.softmax(x, dim=-1))
        monkeypatch.setattr(fn, "_softmax_backward_", lambda g, a: torch._softmax_backward_data(g, a, -1, a.dtype))
        monkeypatch.setattr(fn, "_kernel_for", lambda *ts: None)
    return request.param


def _inputs(dtype, *, B=2, h=2, grid=(4, 5), P=1, d=8, npos=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = P + grid[0] * grid[1]
    qkv = torch.randn(3, B, h, T, d, generator=g, dtype=torch.float64).mul_(1.5)
    tables = [torch.randn(d, npos, generator=g, dtype=torch.float64) for _ in range(3)]
    return qkv.to(dtype), [t.float() for t in tables]


def _run(name, qkv, tables, *, grid=(4, 5), P=1, use_kernel=True):
    q, k, v = qkv.unbind(0)
    npos = tables[0].shape[1]
    if name == "sape2":
        return sape2_attention(q, k, v, tables[0], tables[1], grid, npos_max=npos, num_prefix=P,
                               use_kernel=use_kernel, qkv=qkv)
    return cope_attention(q, k, v, tables[2], npos_max=npos, use_kernel=use_kernel, qkv=qkv)


def _grads(name, qkv, tables, **kw):
    qkv = qkv.detach().requires_grad_()
    tables = [t.detach().requires_grad_() for t in tables]
    out = _run(name, qkv, tables, **kw)
    w = ((torch.arange(out.numel(), dtype=torch.float64) % 7 - 3) / 4).view(out.shape)  # exact in half types
    (out.double() * w).sum().backward()
    used = tables[:2] if name == "sape2" else tables[2:]
    return out, qkv.grad, [t.grad for t in used]


@pytest.mark.parametrize("name", ["sape2", "cope"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("mode", ["autocast", "half-inputs"])
def test_half_runs_forward_and_backward_in_float32_and_returns_the_input_dtypes(name, dtype, mode, gpu_branches):
    """Under CUDA's autocast mix and with plain half inputs: no crash, the output in q's dtype,
    the gradients of q, k, v in theirs and of the tables in float32; and the values are the
    float32 computation on the half inputs' own values (only the output's rounding differs)."""
    qkv, tables = _inputs(dtype)
    ctx = cuda_autocast(dtype) if mode == "autocast" else torch.autocast("cpu", enabled=False)
    with ctx:
        out, g_qkv, g_tab = _grads(name, qkv, tables)
    assert out.dtype == dtype and g_qkv.dtype == dtype and all(g.dtype == torch.float32 for g in g_tab)
    assert torch.isfinite(out.float()).all() and torch.isfinite(g_qkv.float()).all()
    ref, ref_qkv, ref_tab = _grads(name, qkv.float(), tables)                 # float32 on the same values
    torch.testing.assert_close(out.float(), ref.to(dtype).float(), rtol=2 * EPS[dtype], atol=1e-6)
    torch.testing.assert_close(g_qkv.float(), ref_qkv.to(dtype).float(), rtol=2 * EPS[dtype], atol=1e-5)
    for g, r in zip(g_tab, ref_tab):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["sape2", "cope"])
@pytest.mark.parametrize("dtype", HALF)
def test_half_stays_within_mixed_precision_tolerance_of_float64(name, dtype, gpu_branches):
    """Against the float64 computation on the unrounded inputs: the error is that of rounding q,
    k, v to the half type once (relative norms of a few units of its roundoff), not more."""
    qkv64, tables = _inputs(torch.float64)
    tables64 = [t.double() for t in tables]
    with cuda_autocast(dtype):
        out, g_qkv, g_tab = _grads(name, qkv64.to(dtype), tables)
    ref, ref_qkv, ref_tab = _grads(name, qkv64, tables64)
    # relative error norm, in units of the half type's roundoff
    rel = lambda a, b: float((a.detach().double() - b.detach()).norm() / b.detach().norm()) / EPS[dtype]
    assert rel(out, ref) < 4, rel(out, ref)
    # fp16 gradients lose small values to underflow (why fp16 training scales its loss: train.py)
    assert rel(g_qkv, ref_qkv) < (16 if dtype == torch.bfloat16 else 96), rel(g_qkv, ref_qkv)
    for g, r in zip(g_tab, ref_tab):
        assert rel(g, r) < 8, rel(g, r)


def test_positions_are_not_computed_in_half():
    """The reason for float32: positions summed in bf16 land on other integers (another read-out
    column). Gates summed along a 14-long line in bf16 differ from float32 by whole steps of
    2^-5 near 8, so the floor of some positions moves; our bias under autocast equals float32."""
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 2, 14 * 14, 16, generator=g).bfloat16() for _ in range(2))
    e_x, e_y = (torch.randn(16, 14, generator=g) for _ in range(2))
    gates = torch.sigmoid((q.float() @ k.float().transpose(-1, -2)) / 4)[..., :14]
    moved = (gates.bfloat16().flip(-1).cumsum(-1).float().floor() != gates.flip(-1).cumsum(-1).floor()).any()
    assert moved, "the example should have positions whose bf16 sum lands on another integer"
    with cuda_autocast(torch.bfloat16):
        ours = sape2_bias(q, k, e_x, e_y, (14, 14), npos_max=14)
    torch.testing.assert_close(ours, sape2_bias(q.float(), k.float(), e_x, e_y, (14, 14), npos_max=14))
    with cuda_autocast(torch.bfloat16):
        ours = cope_bias(q, k, e_x, npos_max=14)
    torch.testing.assert_close(ours, cope_bias(q.float(), k.float(), e_x, npos_max=14))


def _step(model, x, y, autocast):
    model.zero_grad(set_to_none=True)
    with autocast:
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_encoding_trains_a_step_under_cuda_autocast_close_to_float32(encoding, gpu_branches):
    """A compact model's training step under CUDA's bf16 autocast mix: finite, its loss within
    mixed-precision tolerance of float32 and every parameter's gradient float32, finite and
    pointing the same way (cosine > 0.99)."""
    torch.manual_seed(0)
    model = ViT(preset_config("compact", encoding=encoding, num_classes=10))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
    loss32, grads32 = _step(model, x, y, torch.autocast("cpu", enabled=False))
    loss16, grads16 = _step(model, x, y, cuda_autocast(torch.bfloat16))
    assert torch.isfinite(loss16) and abs(float(loss16 - loss32)) < 0.02 * float(loss32)
    assert grads16.keys() == grads32.keys()
    for n, g16 in grads16.items():
        assert g16.dtype == torch.float32 and torch.isfinite(g16).all(), n
        cos = torch.nn.functional.cosine_similarity(g16.flatten(), grads32[n].flatten(), dim=0)
        assert cos > 0.99 or grads32[n].norm() < 1e-6, (n, float(cos))
