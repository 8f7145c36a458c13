"""The GPU dispatch of `sape2_attention` / `cope_attention` (fused_gpu.py), run on any machine.

Without a GPU the Triton kernels run on CPU tensors under Triton's interpreter
(`TRITON_INTERPRET=1`, set before any kernel is built: pytest-xdist gives this module its own
worker, tests/conftest.py), and `fused_gpu.applies` is made to accept CPU tensors. Then the
whole path a GPU takes — line logits and descriptors in autograd, the flash kernels, the
casts — is checked against the eager code (`use_kernel=False`), values and every gradient, in
float32 and under CUDA's bf16 autocast mix, and inside a model. On a machine with a GPU the
same checks run on CUDA tensors as they are.
"""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (it comes with CUDA builds of torch; "
                                     "requirements-dev.txt installs it for these interpreter tests)")
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

from vitpe_core.config import preset_config  # noqa: E402
from vitpe_core.encodings import fused_gpu  # noqa: E402
from vitpe_core.encodings.functional import cope_attention, sape2_attention  # noqa: E402
from vitpe_core.model import ViT  # noqa: E402

from cuda_autocast import cuda_autocast  # noqa: E402

DEVICE = torch.device("cuda" if CUDA else "cpu")


@pytest.fixture(autouse=True)
def gpu_path(monkeypatch):
    """`applies` as on a GPU, for these tensors; counts the calls so a test knows it ran."""
    calls = []
    real = fused_gpu.applies

    def applies(*ts):
        ok = real(*ts) if CUDA else (all(t.dtype in fused_gpu.DTYPES for t in ts)
                                     and not torch.compiler.is_compiling())
        calls.append(ok)
        return ok
    monkeypatch.setattr(fused_gpu, "applies", applies)
    monkeypatch.delenv("VITPE_NO_TRITON", raising=False)
    return calls


def _inputs(dtype, *, B=2, h=2, grid=(4, 5), P=1, d=16, npos=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = P + grid[0] * grid[1]
    q, k, v = (torch.randn(B, h, T, d, generator=g).mul_(1.5).to(DEVICE, dtype) for _ in range(3))
    tables = [torch.randn(d, npos, generator=g).to(DEVICE) for _ in range(3)]
    return (q, k, v), tables


def _run(name, qkv, tables, use_kernel, grid=(4, 5), P=1):
    leaves = [t.detach().requires_grad_() for t in (*qkv, *tables)]
    q, k, v, e_x, e_y, e = leaves
    npos = e.shape[1]
    if name == "sape2":
        out = sape2_attention(q, k, v, e_x, e_y, grid, npos_max=npos, num_prefix=P, use_kernel=use_kernel)
    else:
        out = cope_attention(q, k, v, e, npos_max=npos, use_kernel=use_kernel)
    w = ((torch.arange(out.numel(), device=DEVICE) % 7 - 3) / 4).view(out.shape)   # exact in half types
    (out.float() * w).sum().backward()
    return [out] + [t.grad for t in leaves if t.grad is not None]


@pytest.mark.parametrize("name", ["sape2", "cope"])
def test_gpu_path_equals_the_eager_code_in_float32(name, gpu_path):
    qkv, tables = _inputs(torch.float32)
    got = _run(name, qkv, tables, True)
    assert any(gpu_path), "the fused GPU path did not run"
    want = _run(name, qkv, tables, False)
    assert len(got) == len(want) == (6 if name == "sape2" else 5)      # out, q, k, v and the tables used
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=5e-5)   # float32 sums in another order


@pytest.mark.parametrize("name", ["sape2", "cope"])
def test_gpu_path_under_cuda_bf16_autocast_keeps_the_mixed_precision_contract(name, gpu_path):
    """bf16 q, k, v: output and q/k/v gradients in bf16, tables' in float32, and the values those
    of the float32 computation on the same bf16 values (docs/encodings.md, "Mixed precision")."""
    qkv, tables = _inputs(torch.bfloat16)
    with cuda_autocast(torch.bfloat16):
        got = _run(name, qkv, tables, True)
    assert any(gpu_path)
    assert got[0].dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in got[1:4])
    assert all(g.dtype == torch.float32 for g in got[4:])
    want = _run(name, [t.float() for t in qkv], tables, False)
    rel = lambda a, b: float((a.float() - b).norm() / b.norm())
    assert rel(got[0], want[0]) < 2 ** -7                       # the output's own bf16 rounding, and P·v in bf16
    for a, b in zip(got[1:], want[1:]):
        assert rel(a, b) < 2 ** -5, rel(a, b)


@pytest.mark.parametrize("encoding", ["sape2+ape", "cope+ape"])
def test_a_model_trains_through_the_gpu_path_as_through_the_eager_code(encoding, gpu_path, monkeypatch):
    cfg = preset_config("compact", encoding=encoding, num_classes=10, img_size=(16, 12), patch_size=4, dim=32,
                        depth=2, heads=2, mlp_dim=32)
    torch.manual_seed(0)
    model = ViT(cfg).to(DEVICE)
    x = torch.randn(2, 3, 16, 12, device=DEVICE)

    def grads():
        model.zero_grad(set_to_none=True)
        out = model(x)
        out.square().sum().backward()
        return [out] + [p.grad for p in model.parameters()]
    got = grads()
    assert sum(gpu_path) == cfg.depth
    monkeypatch.setenv("VITPE_NO_TRITON", "1")
    monkeypatch.setattr(fused_gpu, "applies", lambda *ts: False)
    want = grads()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
