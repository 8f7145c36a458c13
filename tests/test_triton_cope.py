"""The fused Triton CoPE attention (vitpe_core/encodings/triton_cope.py) against float64 eager
PyTorch written here from the formulas (gates, suffix sums by flip–cumsum–flip, clamp at M,
interpolated read-outs by gather; softmax; @ v; autograd for every gradient): the forward and
the gradients of q, k, v and z. Without a CUDA device the kernels run in Triton's interpreter
on CPU tensors (TRITON_INTERPRET=1, set below before the kernels are first built). Tiny shapes
with blocks of 16: several key blocks, a ragged last one, positions both clamped and not."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

INTERPRET = not torch.cuda.is_available()
if INTERPRET:    # before triton's first import: triton.jit reads it when it decorates (triton.language too)
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton", reason="the fused CoPE kernels are written in Triton, which is not installed")
import triton.language as tl  # noqa: E402

from vitpe_core.encodings.triton_cope import available, cope_flash_attention  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
# Under pytest-xdist a worker runs several modules: one that compiled a model imported triton
# (torch._inductor does) before this module could set TRITON_INTERPRET, and triton.language then
# does not run in the interpreter. test_in_fresh_process then runs this file in a new process.
READY = not INTERPRET or type(tl.zeros).__name__ == "InterpretedFunction"
needs_ready = pytest.mark.skipif(not READY, reason="triton was imported before TRITON_INTERPRET=1 was set; "
                                                   "test_in_fresh_process runs these tests in a new process")
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}   # max error / max |reference|


def reference(q, k, v, z, scale: float, npos_max: int):
    """`(out, suffix sums)` of CoPE attention in the inputs' dtype (float64 here), eager; the
    suffix sums before the clamp at M."""
    M = npos_max - 1
    s = q @ k.transpose(-1, -2) * scale                                  # (B, h, T, T)
    sums = torch.sigmoid(s).flip(-1).cumsum(-1).flip(-1)                 # Σ_{t>=j} g_it
    pos = sums.clamp(max=M)
    lo = pos.detach().floor().long()
    f = pos - lo                                                         # gradient through f only
    z_lo = torch.gather(z, -1, lo)
    z_hi = torch.gather(z, -1, (lo + 1).clamp(max=M))
    bias = z_lo + f * torch.where(lo < M, z_hi - z_lo, 0.0)             # step 0 at the cap
    return torch.softmax(s + bias, dim=-1) @ v, sums.detach()


def _inputs(dtype, T: int, d: int, dv: int, npos_max: int):
    """q, k, v rounded to `dtype`, z float32, and an upstream gradient in `dtype`."""
    B, h = 2, 2
    q, k = (torch.randn(B, h, T, d) * 1.5).to(dtype), (torch.randn(B, h, T, d) * 1.5).to(dtype)
    v = torch.randn(B, h, T, dv).to(dtype)
    z = torch.randn(B, h, T, npos_max)
    grad = torch.randn(B, h, T, dv).to(dtype)
    return [t.to(DEVICE) for t in (q, k, v, z, grad)]


def _rel_err(got, want) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


@needs_ready
@pytest.mark.parametrize("dtype, T, d, dv, npos_max, block_m, block_n", [
    (torch.float32, 21, 8, 8, 4, 16, 16),
    (torch.float32, 37, 16, 32, 10, 16, 16),
    (torch.float32, 37, 8, 8, 10, 32, 16),        # query and key blocks of different sizes
    (torch.bfloat16, 37, 16, 8, 10, 16, 16),
    (torch.float16, 21, 8, 32, 4, 16, 16),
])
def test_matches_float64_reference(dtype, T, d, dv, npos_max, block_m, block_n):
    q, k, v, z, grad = _inputs(dtype, T, d, dv, npos_max)
    scale = d ** -0.5
    ins = [t.clone().requires_grad_() for t in (q, k, v, z)]
    out = cope_flash_attention(*ins, scale, npos_max, block_m=block_m, block_n=block_n)
    out.backward(grad)
    ref_ins = [t.double().requires_grad_() for t in (q, k, v, z)]    # the same rounded values
    ref, sums = reference(*ref_ins, scale, npos_max)
    ref.backward(grad.double())
    M = npos_max - 1
    assert (sums > M).any() and (sums < M - 1).any(), "the case must hit clamped and free positions"
    assert out.dtype == dtype and out.shape == ref.shape
    assert [t.grad.dtype for t in ins] == [dtype, dtype, dtype, torch.float32]
    errs = {name: _rel_err(got, want) for name, got, want in
            [("out", out, ref), *((n, a.grad, b.grad) for n, a, b in zip("qkvz", ins, ref_ins))]}
    assert all(e <= TOL[dtype] for e in errs.values()), errs


@needs_ready
def test_saves_no_t_by_t_tensor():
    """The backward recomputes the tiles: what the forward keeps is at most (B, h, T, wider of d,
    dv, npos_max and the number of key blocks) per tensor."""
    q, k, v, z, _ = _inputs(torch.float32, 37, 8, 8, 4)
    out = cope_flash_attention(q, k, v, z.requires_grad_(), 8 ** -0.5, 4, block_m=16, block_n=16)
    saved = out.grad_fn.saved_tensors
    assert saved and max(t.numel() for t in saved) <= 2 * 2 * 37 * 8


@needs_ready
@pytest.mark.parametrize("change, match", [
    (dict(k=torch.zeros(2, 2, 5, 4)), "k must have q's shape"),
    (dict(v=torch.zeros(2, 2, 6, 4)), "v must have shape"),
    (dict(z=torch.zeros(2, 2, 5, 3)), "z must have shape"),
    (dict(z=torch.zeros(2, 2, 5, 4, dtype=torch.float64)), "z must be float32"),
    (dict(k=torch.zeros(2, 2, 5, 8, dtype=torch.float16)), "share one dtype"),
    (dict(q=torch.zeros(2, 2, 5, 8, dtype=torch.float64), k=torch.zeros(2, 2, 5, 8, dtype=torch.float64),
          v=torch.zeros(2, 2, 5, 4, dtype=torch.float64)), "share one dtype"),
    (dict(q=torch.zeros(2, 5, 8)), "q must be a 4-D tensor"),
    (dict(q=torch.zeros(2, 2, 0, 8), k=torch.zeros(2, 2, 0, 8), v=torch.zeros(2, 2, 0, 4),
          z=torch.zeros(2, 2, 0, 4)), "q must not be empty"),
    (dict(npos_max=1), "npos_max must be an integer"),
    (dict(block_m=24), "block_m must be a power of two"),
    (dict(block_n=8), "block_n must be a power of two"),
    (dict(scale=float("nan")), "scale must be a finite number"),
])
def test_argument_checks(change, match):
    args = dict(q=torch.zeros(2, 2, 5, 8), k=torch.zeros(2, 2, 5, 8), v=torch.zeros(2, 2, 5, 4),
                z=torch.zeros(2, 2, 5, 4), scale=0.5, npos_max=4, block_m=16, block_n=16)
    args.update(change)
    args = {key: t.to(DEVICE) if isinstance(t, torch.Tensor) else t for key, t in args.items()}
    with pytest.raises(ValueError, match=match):
        cope_flash_attention(**args)


@needs_ready
def test_available():
    assert available()


@pytest.mark.skipif(READY, reason="this process runs the kernels itself")
def test_in_fresh_process():
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", __file__],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" in proc.stdout   # ran the tests, skipped this one only
