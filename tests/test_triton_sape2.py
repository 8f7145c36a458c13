"""The Triton SaPE² flash attention (vitpe_core/encodings/triton_sape2.py) against a float64
eager oracle: forward and every gradient (q, k, v, s_x, s_y), float32 / bfloat16 / float16,
prefix tokens or none, ragged last blocks, zero off-diagonal distances; and its argument checks.

Without a GPU the kernels run in Triton's interpreter on CPU tensors: TRITON_INTERPRET must be
set before triton is first imported (`triton.jit` reads it at definition, and triton.language's
own helpers are jitted at that import): tests/conftest.py sets it, and so does this module when
run without that conftest (if triton was imported earlier in this process without it, the module
skips and says why). Shapes stay tiny: the interpreter runs each program in numpy."""
from __future__ import annotations

import os
import sys

import pytest
import torch

GPU = torch.cuda.is_available()
if not GPU and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"     # before triton's import: its own tl.zeros, tl.sum... are jitted then
tl = pytest.importorskip("triton.language", reason="triton is not installed: the Triton SaPE² kernel cannot run")
if not GPU and type(tl.zeros).__name__ != "InterpretedFunction":
    pytest.skip("no GPU, and triton was imported before TRITON_INTERPRET=1 was set (tests/conftest.py sets it): "
                "run this module alone", allow_module_level=True)

from vitpe_core.encodings.triton_sape2 import sape2_flash_attention  # noqa: E402  (after TRITON_INTERPRET)

DEVICE = "cuda" if GPU else "cpu"
# (atol, rtol) against float64 on the same (rounded) inputs: float32 is exact up to rounding;
# half inputs round the probabilities and dS to their dtype before the products (as FlashAttention)
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (3e-3, 3e-3)}


def oracle(q, k, v, s_x, s_y, P: int, scale: float):
    """`softmax(q·kᵀ·scale + bias) v` in eager PyTorch, explicit distances (gradient 0 at 0)."""
    def dist(s):                                                              # (B, h, N, N)
        diff = s[..., :, None, :] - s[..., None, :, :]                        # (B, h, N, N, m)
        d2 = (diff * diff).sum(-1)
        pos = d2 > 0
        return torch.where(pos, torch.where(pos, d2, 1.0).sqrt(), 0.0)       # safe sqrt: no NaN grad at 0

    B, h, T, _ = q.shape
    bias = q.new_zeros(B, h, T, T)
    bias[..., P:, P:] = dist(s_x) + dist(s_y)
    logits = q @ k.transpose(-1, -2) * scale + bias                          # (B, h, T, T)
    return torch.softmax(logits, -1) @ v


def _inputs(B, h, grid, P, d, dv, dtype, seed, equal_pair=False):
    g = torch.Generator().manual_seed(seed)
    Hg, Wg = grid
    T, N = P + Hg * Wg, Hg * Wg
    q, k = (torch.randn(B, h, T, d, generator=g) for _ in range(2))
    v = torch.randn(B, h, T, dv, generator=g)
    s_x = torch.randn(B, h, N, Wg, generator=g)
    s_y = torch.randn(B, h, N, Hg, generator=g)
    if equal_pair:
        # quarter-integers: every product and sum is exact in float32, so tokens 2 and 5 sit at
        # distance exactly 0 in the kernel too (and token 1 equals token 5 along y only)
        s_x, s_y = (torch.round(s * 4) / 4 for s in (s_x, s_y))
        s_x[:, :, 5], s_y[:, :, 5] = s_x[:, :, 2], s_y[:, :, 2]
        s_y[:, :, 1] = s_y[:, :, 5]
    q, k, v = (t.to(dtype) for t in (q, k, v))                                # rounded once, shared
    return [t.to(DEVICE) for t in (q, k, v, s_x, s_y)]


def _check(B, h, grid, P, d, dv, dtype, seed=0, equal_pair=False, blocks=(16, 16)):
    scale = d ** -0.5
    ins = _inputs(B, h, grid, P, d, dv, dtype, seed, equal_pair)
    mine = [t.clone().requires_grad_() for t in ins]
    ref = [t.detach().double().requires_grad_() for t in ins]
    out = sape2_flash_attention(*mine, P, scale, block_m=blocks[0], block_n=blocks[1])
    want = oracle(*ref, P, scale)
    assert out.dtype == dtype and out.shape == want.shape
    # what the backward keeps: inputs, out and the (B, h, T) log-sum-exp, never a T x T tensor
    T = want.shape[2]
    assert max(t.numel() for t in out.grad_fn.saved_tensors) <= B * h * T * max(d, dv)
    grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    out.backward(grad.to(DEVICE))
    want.backward(grad.double())
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.double(), want, atol=atol, rtol=rtol, msg=lambda m: f"out: {m}")
    for name, a, b in zip(("q", "k", "v", "s_x", "s_y"), mine, ref):
        assert a.grad.dtype == a.dtype, name
        # gradients are sums over T terms: scale the tolerance with their size
        scale_ = b.grad.abs().max().item()
        torch.testing.assert_close(a.grad.double(), b.grad, atol=atol * max(1.0, scale_), rtol=rtol,
                                   msg=lambda m: f"grad {name}: {m}")
    return mine, ref


def test_float32_prefix_ragged_blocks():
    """4x5 grid and one prefix token: T = 21 over blocks of 16 (two blocks, the last ragged)."""
    _check(2, 2, (4, 5), P=1, d=8, dv=8, dtype=torch.float32)


def test_float32_wider_heads_no_prefix():
    """d = 16, dv = 32, a 3x7 grid (W = 7, H = 3: different descriptor widths), no prefix;
    query blocks of 32 and key blocks of 16 (different tilings of the two backward kernels)."""
    _check(1, 2, (3, 7), P=0, d=16, dv=32, dtype=torch.float32, seed=1, blocks=(32, 16))


def test_float32_equal_descriptors_zero_distance():
    """Two tokens with equal descriptors (distance 0 off the diagonal): gradient 0 there, as
    torch.cdist; the rest matches. Two prefix tokens, one block for all queries (block 32)."""
    mine, ref = _check(1, 2, (3, 4), P=2, d=8, dv=8, dtype=torch.float32, seed=2, equal_pair=True, blocks=(32, 32))
    assert torch.isfinite(mine[3].grad).all() and torch.isfinite(mine[4].grad).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs(dtype):
    _check(1, 2, (4, 5), P=1, d=16, dv=16, dtype=dtype, seed=3)


def test_default_blocks():
    """The default tiles (module's DEFAULTS: larger than T here, one ragged block)."""
    q, k, v, s_x, s_y = _inputs(1, 1, (3, 3), P=1, d=8, dv=8, dtype=torch.float16, seed=5)
    want = oracle(*(t.double() for t in (q, k, v, s_x, s_y)), 1, 0.3)
    got = sape2_flash_attention(q, k, v, s_x, s_y, 1, 0.3)
    torch.testing.assert_close(got.double(), want, atol=3e-3, rtol=3e-3)


def test_only_prefix_tokens_and_strided_inputs():
    """N = 0 patch tokens (bias 0 everywhere: plain attention); q, k, v non-contiguous slices."""
    g = torch.Generator().manual_seed(4)
    qkv = torch.randn(1, 5, 3, 2, 8, generator=g).permute(2, 0, 3, 1, 4).to(DEVICE)  # (3, B, h, T, d) strided
    mine = [t.requires_grad_() for t in qkv.clone().unbind(0)]
    assert not mine[0].is_contiguous()
    ref = [t.detach().double().requires_grad_() for t in mine]
    empty_x, empty_y = torch.zeros(1, 2, 0, 3, device=DEVICE), torch.zeros(1, 2, 0, 2, device=DEVICE)
    out = sape2_flash_attention(*mine, empty_x, empty_y, 5, 0.5, block_m=16, block_n=16)
    want = torch.softmax(ref[0] @ ref[1].transpose(-1, -2) * 0.5, -1) @ ref[2]
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    out.sum().backward()
    want.sum().backward()
    for a, b in zip(mine, ref):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-5, rtol=1e-5)


def test_rejects_bad_arguments():
    q, k, v, s_x, s_y = _inputs(1, 1, (2, 3), P=1, d=8, dv=8, dtype=torch.float32, seed=0)
    bad = [
        ((q[0], k, v, s_x, s_y, 1), "4-d"),
        ((q.double(), k.double(), v.double(), s_x, s_y, 1), "float32, bfloat16 or float16"),
        ((q, k.half(), v, s_x, s_y, 1), "one dtype"),
        ((q, k, v, s_x.double(), s_y, 1), "s_x and s_y must be float32"),
        ((q, k[..., :4], v, s_x, s_y, 1), "k .* must have q's shape"),
        ((q, k, v[:, :, :3], s_x, s_y, 1), "v .* must be"),
        ((q, k, v, s_x, s_y, 2), r"s_x .* N = T - num_prefix"),
        ((q, k, v, s_x, s_y[:, :, :3], 1), r"s_y .* must be"),
        ((q, k, v, s_x, s_y, -1), "num_prefix"),
        ((q, k, v, s_x, s_y, 1.0), "num_prefix"),
    ]
    for args, match in bad:
        with pytest.raises(ValueError, match=match):
            sape2_flash_attention(*args, 0.5)
    for kwargs, match in [(dict(block_m=24), "block_m"), (dict(block_n=8), "block_n"),
                          (dict(num_warps=3), "num_warps")]:
        with pytest.raises(ValueError, match=match):
            sape2_flash_attention(q, k, v, s_x, s_y, 1, 0.5, **kwargs)
    with pytest.raises(ValueError, match="scale"):
        sape2_flash_attention(q, k, v, s_x, s_y, 1, float("nan"))
