"""SaPE² and CoPE against naive per-equation implementations written here (docs/encodings.md)."""
from __future__ import annotations

import math
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from vitpe_core.encodings import cope_bias, sape2_bias


def _interp(r_i: torch.Tensor, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """z_i[p] = (p - floor p) z_i[ceil p] + (1 - p + floor p) z_i[floor p], z_i[t] = r_i . e[:, t]."""
    lo, hi = int(math.floor(p.item())), int(math.ceil(p.item()))
    w = p - lo
    return w * (r_i @ e[:, hi]) + (1 - w) * (r_i @ e[:, lo])


def naive_sape2(q, k, e_x, e_y, grid, readout, npos_max):
    """One equation at a time, float64, Python loops (the oracle)."""
    H, W = grid
    B, h, N, d = q.shape
    M = npos_max - 1
    r = q if readout == "query" else k
    bias_x = torch.zeros(B, h, N, N, dtype=torch.float64)
    bias_y = torch.zeros(B, h, N, N, dtype=torch.float64)
    for b in range(B):
        for hh in range(h):
            s_x, s_y = [None] * N, [None] * N
            for i in range(N):
                ri, ci = divmod(i, W)
                g_x = [torch.sigmoid(q[b, hh, i] @ k[b, hh, ri * W + c] / math.sqrt(d)) for c in range(W)]
                g_y = [torch.sigmoid(q[b, hh, i] @ k[b, hh, rr * W + ci] / math.sqrt(d)) for rr in range(H)]
                row = []
                for m in range(W):  # position of column m in i's row: sum of gates at columns >= m
                    p = torch.clamp(sum(g_x[c] for c in range(W) if c >= m), max=M)
                    row.append(_interp(r[b, hh, i], e_x, p))
                col = []
                for m in range(H):
                    p = torch.clamp(sum(g_y[rr] for rr in range(H) if rr >= m), max=M)
                    col.append(_interp(r[b, hh, i], e_y, p))
                s_x[i], s_y[i] = torch.stack(row), torch.stack(col)
            for i in range(N):
                for n in range(N):
                    if i != n:
                        bias_x[b, hh, i, n] = torch.linalg.norm(s_x[i] - s_x[n])
                        bias_y[b, hh, i, n] = torch.linalg.norm(s_y[i] - s_y[n])
    return bias_x + bias_y, bias_x, bias_y


def naive_cope(q, k, e, npos_max):
    B, h, T, d = q.shape
    out = torch.zeros(B, h, T, T, dtype=torch.float64)
    for b in range(B):
        for hh in range(h):
            for i in range(T):
                g = [torch.sigmoid(q[b, hh, i] @ k[b, hh, j] / math.sqrt(d)) for j in range(T)]
                for j in range(T):
                    p = torch.clamp(sum(g[t] for t in range(j, T)), max=npos_max - 1)
                    out[b, hh, i, j] = _interp(q[b, hh, i], e, p)
    return out


def _inputs(grid, d=8, B=2, h=2, scale=1.0, npos_max=10, seed=0):  # grid (1, T) for T tokens
    g = torch.Generator().manual_seed(seed)
    N = grid[0] * grid[1]
    q = torch.randn(B, h, N, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(B, h, N, d, generator=g, dtype=torch.float64) * scale
    e_x = torch.randn(d, npos_max, generator=g, dtype=torch.float64)
    e_y = torch.randn(d, npos_max, generator=g, dtype=torch.float64)
    return q, k, e_x, e_y


@pytest.mark.parametrize("grid", [(2, 3), (3, 5), (4, 4), (1, 6), (5, 2)])
@pytest.mark.parametrize("readout", ["query", "key"])
def test_sape2_matches_naive(grid, readout):
    q, k, e_x, e_y = _inputs(grid)
    got, got_x, got_y = sape2_bias(q, k, e_x, e_y, grid, readout=readout, return_parts=True)
    want, want_x, want_y = naive_sape2(q, k, e_x, e_y, grid, readout, 10)
    assert got.shape == (2, 2, grid[0] * grid[1], grid[0] * grid[1]) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(got_x.double(), want_x, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(got_y.double(), want_y, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("readout", ["query", "key"])
def test_sape2_clamps_positions_on_wide_grids(readout):
    """npos_max 4 on a 3x7 grid: rows of 7 gates sum past M = 3, so the clamp is exercised."""
    grid = (3, 7)
    q, k, e_x, e_y = _inputs(grid, npos_max=4, scale=2.0)
    rows_q, rows_k = q.reshape(2, 2, 3, 7, 8), k.reshape(2, 2, 3, 7, 8)
    row_gate_sums = torch.sigmoid(rows_q @ rows_k.transpose(-1, -2) / math.sqrt(8)).sum(-1)
    assert (row_gate_sums > 3).any(), "the clamp at M = 3 must be exercised"
    got = sape2_bias(q, k, e_x, e_y, grid, readout=readout, npos_max=4)
    want, _, _ = naive_sape2(q, k, e_x, e_y, grid, readout, 4)
    torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("readout", ["query", "key"])
def test_sape2_reads_out_at_m_when_positions_saturate(readout):
    """Every gate open (q.k/sqrt d > 30): column m of a row sits at min(W - m, M), so on a 3x7
    grid with M = 3 columns 0-4 read r.e_x[:, M], columns 5, 6 r.e_x[:, 2], r.e_x[:, 1]; the
    rows of a column read r.e_y[:, M], [:, 2], [:, 1]. The bias is the descriptors' distances."""
    grid, M = (3, 7), 3
    q, k, e_x, e_y = _inputs(grid, npos_max=M + 1)
    q, k = 4 + 0.5 * q, 4 + 0.5 * k                                  # distinct tokens, all q.k > 0
    assert (q @ k.transpose(-1, -2) / math.sqrt(8)).min() > 30
    r = q if readout == "query" else k
    z_x, z_y = r @ e_x, r @ e_y                                      # (B, h, N, M+1)
    s_x = torch.cat((z_x[..., [M]].expand(-1, -1, -1, 5), z_x[..., [2, 1]]), dim=-1)  # (B, h, N, W)
    s_y = z_y[..., [M, 2, 1]]                                        # (B, h, N, H)
    got, got_x, got_y = sape2_bias(q, k, e_x, e_y, grid, readout=readout, npos_max=M + 1, return_parts=True)
    torch.testing.assert_close(got_x.double(), torch.cdist(s_x, s_x), atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(got_y.double(), torch.cdist(s_y, s_y), atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(got.double(), torch.cdist(s_x, s_x) + torch.cdist(s_y, s_y), atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("grid", [(2, 3), (4, 5)])
def test_sape2_diagonal_zero_and_gradients_finite(grid):
    q, k, e_x, e_y = (t.float().requires_grad_() for t in _inputs(grid))
    bias = sape2_bias(q, k, e_x, e_y, grid)
    assert torch.equal(bias.diagonal(dim1=-2, dim2=-1), torch.zeros_like(bias.diagonal(dim1=-2, dim2=-1)))
    assert (bias >= 0).all() and torch.allclose(bias, bias.transpose(-1, -2), atol=1e-5)
    bias.sum().backward()
    for t in (q, k, e_x, e_y):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


def test_sape2_gradients_match_naive():
    grid = (2, 3)
    q, k, e_x, e_y = _inputs(grid, d=4, B=1, h=1, npos_max=10)
    leaves = [t.clone().requires_grad_() for t in (q, k, e_x, e_y)]
    naive_sape2(*leaves, grid, "query", 10)[0].sum().backward()
    fast = [t.clone().requires_grad_() for t in (q, k, e_x, e_y)]
    sape2_bias(*fast, grid).sum().backward()
    for a, b in zip(fast, leaves):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=5e-4, rtol=1e-3)


def test_sape2_gradient_finite_when_descriptors_coincide():
    """Identical tokens give identical descriptors: off-diagonal zero distances too."""
    grid = (2, 2)
    q = torch.ones(1, 1, 4, 8, requires_grad=True)
    e = torch.randn(8, 10, requires_grad=True)
    bias = sape2_bias(q, q, e, e, grid)
    assert bias.abs().max() < 1e-5
    bias.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(e.grad).all()


def test_sape2_rejects_bad_shapes():
    q, k, e_x, e_y = _inputs((2, 3))
    with pytest.raises(ValueError, match="grid"):
        sape2_bias(q, k, e_x, e_y, (3, 3))
    with pytest.raises(ValueError, match="readout"):
        sape2_bias(q, k, e_x, e_y, (2, 3), readout="value")
    with pytest.raises(ValueError, match="npos_max"):
        sape2_bias(q, k, e_x[:, :5], e_y, (2, 3))


@pytest.mark.parametrize("T", [3, 7, 13])
def test_cope_matches_naive(T):
    g = torch.Generator().manual_seed(T)
    q = torch.randn(2, 2, T, 8, generator=g, dtype=torch.float64) * 2
    k = torch.randn(2, 2, T, 8, generator=g, dtype=torch.float64) * 2
    e = torch.randn(8, 5, generator=g, dtype=torch.float64)
    got = cope_bias(q, k, e, npos_max=5)
    torch.testing.assert_close(got.double(), naive_cope(q, k, e, 5), atol=2e-4, rtol=1e-4)


def test_cope_gradients_finite():
    q = torch.randn(2, 2, 9, 8, requires_grad=True)
    k = torch.randn(2, 2, 9, 8, requires_grad=True)
    e = torch.randn(8, 10, requires_grad=True)
    cope_bias(q, k, e).sum().backward()
    for t in (q, k, e):
        assert torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


def test_positions_never_negative_when_the_last_gates_vanish():
    """Regression: a trained model drove the last gates of a line to ~0, `total - cumsum`
    rounded to -1e-6, and the read-out indexed position -1 (crash in training)."""
    from vitpe_core.encodings._interp import reverse_cumsum
    for width in (8, 40):  # both branches: matmul (short lines) and flip-cumsum-flip
        g = torch.sigmoid(torch.randn(100_000 // width * 8, width, generator=torch.Generator().manual_seed(0)) * 3)
        g[:, -1] = torch.sigmoid(torch.tensor(-80.0))
        p = reverse_cumsum(g)
        assert p.min() >= 0
        torch.testing.assert_close(p, g.double().flip(-1).cumsum(-1).flip(-1).float())
    q = torch.randn(4, 2, 16, 8) * 4
    k = q.clone()
    k[:, :, 3::4] = -q[:, :, 3::4] * 50          # the last column's keys repel every query
    e = torch.randn(8, 10)
    assert torch.isfinite(sape2_bias(q, k, e, e, (4, 4))).all()
    assert torch.isfinite(cope_bias(q, k, e)).all()


# ----------------------------------------------------------------------------- fused attention
from vitpe_core.encodings.functional import cope_attention, sape2_attention  # noqa: E402


def _attention_oracle(q, k, v, bias):
    d = q.shape[-1]
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d) + bias, dim=-1) @ v


def _with_grads(fn, tensors, grad_out_seed=0):
    leaves = [t.clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_out_seed), dtype=out.dtype))
    return out.detach(), [t.grad for t in leaves]


KERNEL = [pytest.param(True, id="cpp"), pytest.param(False, id="eager")]
KERNEL_THREADS = 2


@pytest.fixture(autouse=True)
def _kernel_threads():
    """The fused kernel splits its rows over torch's threads (`at::parallel_for`): its tests run on
    two, whatever the suite's workers use (tests/conftest.py keeps them to one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(KERNEL_THREADS)
    yield
    torch.set_num_threads(before)


def test_the_kernel_tests_run_on_more_than_one_thread():
    assert torch.get_num_threads() == KERNEL_THREADS


@pytest.mark.parametrize("use_kernel", KERNEL)
@pytest.mark.parametrize("grid, P", [((2, 3), 1), ((3, 5), 0), ((4, 4), 2), ((1, 6), 1)])
@pytest.mark.parametrize("readout", ["query", "key"])
def test_sape2_attention_matches_naive_bias_attention(grid, P, readout, use_kernel):
    """The fused function (hand-written backward) against softmax(logits + naive bias) v, float64,
    values and every gradient (q, k, v, e_x, e_y); the C++ kernel and the eager code."""
    H, W = grid
    q, k, e_x, e_y = _inputs((1, P + H * W), scale=1.5)
    v = torch.randn(q.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def oracle(q, k, v, e_x, e_y):
        bias = naive_sape2(q[:, :, P:], k[:, :, P:], e_x, e_y, grid, readout, 10)[0]
        return _attention_oracle(q, k, v, torch.nn.functional.pad(bias, (P, 0, P, 0)))

    def fused(q, k, v, e_x, e_y):
        return sape2_attention(q, k, v, e_x, e_y, grid, readout, num_prefix=P, use_kernel=use_kernel)

    want, want_g = _with_grads(oracle, (q, k, v, e_x, e_y))
    got, got_g = _with_grads(fused, (q, k, v, e_x, e_y))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("use_kernel", KERNEL)
@pytest.mark.parametrize("T", [5, 13, pytest.param(40, marks=pytest.mark.slow)])   # 40: the oracle's ~10 s
def test_cope_attention_matches_naive_bias_attention(T, use_kernel):
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, 2, T, 8, generator=g, dtype=torch.float64) * 2 for _ in range(3))
    e = torch.randn(8, 5, generator=g, dtype=torch.float64)
    want, want_g = _with_grads(lambda q, k, v, e: _attention_oracle(q, k, v, naive_cope(q, k, e, 5)), (q, k, v, e))
    got, got_g = _with_grads(lambda q, k, v, e: cope_attention(q, k, v, e, npos_max=5, use_kernel=use_kernel),
                                 (q, k, v, e))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    for a, b in zip(got_g, want_g):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_fused_attention_float32_matches_bias_functions_and_second_backward():
    """float32 at the model's shapes (CLS + 8 x 8) against the bias functions the trace path uses."""
    grid, P = (8, 8), 1
    q, k, v = (torch.randn(3, 4, 65, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    e_x, e_y = torch.randn(16, 10), torch.randn(16, 10)
    logits = q @ k.transpose(-1, -2) / 4
    want = torch.softmax(logits + sape2_bias(q[:, :, P:], k[:, :, P:], e_x, e_y, grid, num_prefix=P), -1) @ v
    torch.testing.assert_close(sape2_attention(q, k, v, e_x, e_y, grid, num_prefix=P), want, atol=1e-5, rtol=1e-5)
    want = torch.softmax(logits + cope_bias(q, k, e_x), -1) @ v
    torch.testing.assert_close(cope_attention(q, k, v, e_x), want, atol=1e-5, rtol=1e-5)
    out = sape2_attention(q.requires_grad_(), k, v, e_x, e_y, grid, num_prefix=P)
    out.sum().backward(retain_graph=True)       # its backward reuses saved buffers: a second one is refused
    with pytest.raises(RuntimeError, match="twice"):
        out.sum().backward()
    q.grad = None
    out = cope_attention(q, k, v, e_x)          # CoPE's backward leaves its saved tensors intact
    out.sum().backward(retain_graph=True)
    first, q.grad = q.grad, None
    out.sum().backward()
    torch.testing.assert_close(q.grad, first, atol=0, rtol=0)


@pytest.mark.parametrize("use_kernel", KERNEL)
@pytest.mark.parametrize("which", ["sape2", "cope"])
def test_packed_qkv_gives_the_same_values_and_gradients(which, use_kernel):
    """q, k, v as slices of one packed projection (the model's fast path passes `qkv`): the
    backward writes one gradient; it equals the gradients of three separate tensors."""
    B, h, d, grid, P = 2, 3, 8, (3, 4), 1
    T = P + grid[0] * grid[1]
    g = torch.Generator().manual_seed(7)
    proj = torch.randn(B, T, 3, h, d, generator=g, dtype=torch.float64)   # (B, T, 3, h, d) as a Linear gives
    e_x, e_y = (torch.randn(d, 10, generator=g, dtype=torch.float64) for _ in range(2))
    grad = torch.randn(B, h, T, d, generator=g, dtype=torch.float64)

    def run(packed: bool):
        leaf = proj.clone().requires_grad_()
        qkv = leaf.permute(2, 0, 3, 1, 4)                                   # (3, B, h, T, d) view
        q, k, v = qkv.unbind(0)
        kw = {"qkv": qkv} if packed else {}
        out = (sape2_attention(q, k, v, e_x, e_y, grid, num_prefix=P, use_kernel=use_kernel, **kw)
               if which == "sape2" else cope_attention(q, k, v, e_x, use_kernel=use_kernel, **kw))
        out.backward(grad)
        return out.detach(), leaf.grad

    (a, ga), (b, gb) = run(True), run(False)
    torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(ga, gb, atol=1e-12, rtol=1e-12)


def test_packed_qkv_must_hold_q_k_v():
    q, k, e_x, e_y = _inputs((2, 3))
    other = torch.stack((q, k, q))                                           # a copy: not q, k, v themselves
    for fn in (lambda: sape2_attention(q, k, q, e_x, e_y, (2, 3), qkv=other),
               lambda: cope_attention(q, k, q, e_x, qkv=other), lambda: cope_attention(q, k, q, e_x, qkv=q)):
        with pytest.raises(ValueError, match="qkv"):
            fn()


def test_fused_attention_rejects_bad_shapes():
    q, k, e_x, e_y = _inputs((2, 3))
    with pytest.raises(ValueError, match="grid"):
        sape2_attention(q, k, q, e_x, e_y, (3, 3))
    with pytest.raises(ValueError, match="readout"):
        sape2_attention(q, k, q, e_x, e_y, (2, 3), readout="value")
    with pytest.raises(ValueError, match="e_x"):
        sape2_attention(q, k, q, e_x[:, :5], e_y, (2, 3))
    with pytest.raises(ValueError, match="e must"):
        cope_attention(q, k, q, e_x[:, :5])


# ----------------------------------------------------------------------------- C++ kernel vs eager
from vitpe_core.encodings import _kernels  # noqa: E402
from vitpe_core.encodings import functional  # noqa: E402

needs_kernel = pytest.mark.skipif(os.environ.get("VITPE_NO_CPP", "") not in ("", "0") or shutil.which("c++") is None,
                                  reason="C++ kernel disabled (VITPE_NO_CPP) or no compiler")


@needs_kernel
def test_kernel_builds_and_the_fused_functions_use_it(monkeypatch):
    """With a compiler the kernel is built (once per process, cached on disk) and both fused
    functions take it by default."""
    assert _kernels.available()
    used = []
    real = functional._kernel_for
    monkeypatch.setattr(functional, "_kernel_for", lambda *ts: used.append(real(*ts)) or used[-1])
    q, k, e_x, e_y = _inputs((1, 7), d=8)
    sape2_attention(q, k, q, e_x, e_y, (2, 3), num_prefix=1)
    cope_attention(q, k, q, e_x)
    assert len(used) == 2 and all(u is _kernels.kernels() for u in used)


def _both(fn, tensors, seed=0):
    """(values, grads) of `fn(*tensors, use_kernel=...)` with the kernel and with the eager code."""
    return [_with_grads(lambda *ts: fn(*ts, use_kernel=u), tensors, seed) for u in (True, False)]


@needs_kernel
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("grid, P, readout, npos_max, scale", [
    ((8, 8), 1, "query", 10, 1.0), ((3, 7), 0, "key", 4, 2.5), ((5, 2), 2, "query", 3, 3.0),
    ((1, 9), 1, "key", 10, 1.0), ((16, 16), 1, "key", 10, 1.0)])
def test_sape2_kernel_matches_eager(grid, P, readout, npos_max, scale, dtype, tol):
    """Values and every gradient, including capped positions (small npos_max, large logits), v
    narrower than q and k. 16 x 16 patches: a (batch, head) pair's 257 x 257 block is more than
    the kernel's chunk budget, so each thread runs several one-pair chunks."""
    H, W = grid
    g = torch.Generator().manual_seed(H * 10 + W)
    q, k, v = (torch.randn(3, 2, P + H * W, dim, generator=g, dtype=torch.float64).mul(scale).to(dtype)
               for dim in (8, 8, 5))
    e_x, e_y = (torch.randn(8, npos_max, generator=g, dtype=dtype) for _ in range(2))
    (a, ga), (b, gb) = _both(lambda q, k, v, ex, ey, use_kernel: sape2_attention(
        q, k, v, ex, ey, grid, readout, npos_max, num_prefix=P, use_kernel=use_kernel), (q, k, v, e_x, e_y))
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=10 * tol, rtol=10 * tol)


@needs_kernel
@pytest.mark.parametrize("mode", [torch.inference_mode, torch.no_grad])
def test_kernel_runs_under_inference_mode_and_no_grad(mode):
    """The operators run ATen ops in torch's worker threads, which do not inherit the caller's
    inference mode: under `torch.inference_mode()` (its tensors may not be written outside it)
    and `torch.no_grad()` both fused functions still give the eager values."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(4, 2, 17, 8, generator=g) for _ in range(3))
    e_x, e_y = (torch.randn(8, 10, generator=g) for _ in range(2))
    want = (sape2_attention(q, k, v, e_x, e_y, (4, 4), num_prefix=1, use_kernel=False),
            cope_attention(q, k, v, e_x, use_kernel=False))
    with mode():
        got = (sape2_attention(q, k, v, e_x, e_y, (4, 4), num_prefix=1), cope_attention(q, k, v, e_x))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5)


@needs_kernel
def test_the_operators_refuse_mismatched_tensors():
    """Called directly (not through functional.py, which checks first), the C++ operators say
    which rule a tensor breaks instead of reading past it: another batch size, a non-contiguous
    tensor, a grid that does not match the tokens."""
    kern = _kernels.kernels()
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    z = torch.randn(2, 2, 5, 20)
    with pytest.raises(RuntimeError, match=r"\(B, h, \., \.\) of one dtype"):
        kern.sape2_attend_fwd(q, k, v[:1].contiguous(), z, 1, 2, 2, 10)
    with pytest.raises(RuntimeError, match="contiguous"):
        kern.sape2_attend_fwd(q, k.transpose(-1, -2), v, z, 1, 2, 2, 10)
    with pytest.raises(RuntimeError, match="mismatch"):
        kern.sape2_attend_fwd(q, k, v, z, 1, 3, 2, 10)
    with pytest.raises(RuntimeError, match=r"\(B, h, \., \.\) of one dtype"):
        kern.cope_attend_fwd(q, k, v.double(), z[..., :10].contiguous(), 10)


@needs_kernel
def test_sape2_kernel_coincident_descriptors():
    """Identical tokens: every distance is 0, whose gradient is 0 (as torch.cdist's), finite."""
    q = torch.ones(2, 2, 5, 8, dtype=torch.float64)
    e = torch.randn(8, 10, dtype=torch.float64)
    (a, ga), (b, gb) = _both(lambda q, k, v, e, use_kernel: sape2_attention(
        q, k, v, e, e, (2, 2), num_prefix=1, use_kernel=use_kernel), (q, q, q, e))
    torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    for x, y in zip(ga, gb):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y, atol=1e-10, rtol=1e-10)


@needs_kernel
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("T, npos_max, scale", [(65, 10, 1.0), (17, 4, 3.0), (40, 64, 1.0), (257, 10, 1.0)])
def test_cope_kernel_matches_eager(T, npos_max, scale, dtype, tol):
    """Values and every gradient; v narrower than q and k; 257 tokens: one-pair chunks, several
    per thread (as test_sape2_kernel_matches_eager's 16 x 16 grid)."""
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(3, 2, T, dim, generator=g, dtype=torch.float64).mul(scale).to(dtype) for dim in (8, 8, 5))
    e = torch.randn(8, npos_max, generator=g, dtype=dtype)
    (a, ga), (b, gb) = _both(lambda q, k, v, e, use_kernel: cope_attention(
        q, k, v, e, npos_max, use_kernel=use_kernel), (q, k, v, e))
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=10 * tol, rtol=10 * tol)


def test_no_cpp_env_forces_eager(monkeypatch):
    """VITPE_NO_CPP=1: no kernel, no build, no warning; the eager code gives the naive result."""
    monkeypatch.setenv("VITPE_NO_CPP", "1")
    monkeypatch.setattr(_kernels, "_build", lambda: pytest.fail("must not build"))
    assert _kernels.kernels() is None and functional._kernel_for(torch.zeros(1)) is None
    test_sape2_attention_matches_naive_bias_attention((2, 3), 1, "query", True)
    test_cope_attention_matches_naive_bias_attention(5, True)


def test_failed_build_warns_once_and_runs_eager(monkeypatch):
    """No compiler (the build raises): one warning naming the fix, then the eager path."""
    monkeypatch.delenv("VITPE_NO_CPP", raising=False)
    monkeypatch.setattr(_kernels, "_state", {})

    def broken():
        raise RuntimeError("Error building extension: c++: command not found")
    monkeypatch.setattr(_kernels, "_build", broken)
    with pytest.warns(UserWarning, match="eager PyTorch path is used.*g\\+\\+") as rec:
        assert _kernels.kernels() is None
    assert len(rec) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # warned once: not again
        assert _kernels.kernels() is None
        test_sape2_attention_matches_naive_bias_attention((2, 3), 1, "key", True)
        test_cope_attention_matches_naive_bias_attention(5, True)


def test_a_stale_build_lock_is_removed_and_a_fresh_one_waited_for(tmp_path, monkeypatch):
    """torch waits forever on the lock of a killed build: an old lock is removed (with a
    warning), a young one (another process building) is waited for until it goes."""
    import os
    import threading
    import time
    import warnings

    from vitpe_core.encodings import _kernels
    monkeypatch.setattr(_kernels, "build_directory", lambda name: str(tmp_path))
    lock = tmp_path / "lock"
    lock.write_text("")
    old = time.time() - 2 * _kernels.STALE_LOCK_S
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="stale build lock"):
        _kernels._clear_stale_lock("x")
    assert not lock.exists()
    lock.write_text("")                                     # young: another build holds it
    threading.Timer(1.5, lock.unlink).start()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _kernels._clear_stale_lock("x")
    assert time.perf_counter() - t0 >= 1.0 and not lock.exists()


def test_the_build_lock_dies_with_its_holder_and_clears_torchs_stale_lock(tmp_path, monkeypatch):
    """`_held_by_this_process`: a process killed while loading leaves torch's `lock` file, which
    the next load removes at once (it holds the OS lock, so nobody else is loading); a live
    holder of the OS lock is waited for; a killed one releases it."""
    import subprocess
    import sys
    import time

    from vitpe_core.encodings import _kernels
    monkeypatch.setattr(_kernels, "build_directory", lambda name: str(tmp_path))
    (tmp_path / "lock").write_text("")                         # left by a load killed a moment ago
    with _kernels._held_by_this_process("x") as held:
        assert held and not (tmp_path / "lock").exists()
    hold = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(float(sys.argv[2]))")
    for seconds, kill in ((1.5, False), (60, True)):
        proc = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "vitpe.flock"), str(seconds)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "held"
        if kill:
            proc.kill()                                        # dies holding it: the OS releases it
            proc.wait(30)
        t0 = time.perf_counter()
        with _kernels._held_by_this_process("x") as held:
            waited = time.perf_counter() - t0
        proc.wait(30)
        assert held and (waited < 30 if kill else waited >= 1.0), (kill, waited)


def test_each_torch_install_builds_the_kernel_in_its_own_folder(monkeypatch):
    import torch

    from vitpe_core.encodings import _kernels
    here = _kernels.extension_name()
    assert here.startswith("vitpe_attend_") and here.isidentifier()
    assert _kernels.extension_name() == here
    monkeypatch.setattr(torch, "__file__", "/elsewhere/venv/lib/python3.11/site-packages/torch/__init__.py")
    assert _kernels.extension_name() != here


def test_an_edited_source_is_a_new_build_in_the_extensions_dir(tmp_path, monkeypatch):
    """The name hashes the C++ source: an edited one is built afresh, never a stale build
    loaded. The build folder is `$TORCH_EXTENSIONS_DIR/<name>` when that is set, as torch's."""
    from vitpe_core.encodings import _kernels
    assert _kernels.SOURCE.is_file()
    here = _kernels.extension_name()
    edited = tmp_path / "attend.cpp"
    edited.write_bytes(_kernels.SOURCE.read_bytes() + b"\n// edited\n")
    monkeypatch.setattr(_kernels, "SOURCE", edited)
    assert _kernels.extension_name() != here
    # the kernels' header beside the source counts too: a header added or edited, another name
    before = _kernels.extension_name()
    header = Path(_kernels.__file__).with_name("csrc") / "attend_kernels.h"
    (tmp_path / header.name).write_bytes(header.read_bytes() + b"\n// edited\n")
    assert _kernels.extension_name() != before
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    folder = _kernels.build_directory("vitpe_attend_x")
    assert folder == str(tmp_path / "ext" / "vitpe_attend_x") and (tmp_path / "ext" / "vitpe_attend_x").is_dir()


# ----------------------------------------------------------------------------- under torch.compile
class _CountingKernels:
    """The C++ module with every call counted (by function name)."""

    def __init__(self, real) -> None:
        self.real, self.calls = real, {}

    def __getattr__(self, name):
        fn = getattr(self.real, name)

        def call(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args)
        return call


@pytest.mark.slow
@needs_kernel
@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile's CPU backend needs a C++ compiler (g++)")
# both custom ops, captured with aot_eager: the same dynamo + AOTAutograd capture as inductor, which
# is where a custom op is kept or lost, without inductor's C++ code generation (30-60 s a model on 2
# busy cores). Inductor itself runs SaPE²'s op in tests/test_train.py's compiled training; both ops
# are registered alike (compiled_ops.py), and `python -m benchmarks.compiled_ab` runs CoPE under it.
@pytest.mark.parametrize("encoding, options, backend", [("sape2", {"readout": "query"}, "aot_eager"),
                                                        ("cope", {}, "aot_eager")])
def test_compiled_model_keeps_the_fused_kernel_and_matches_eager(encoding, options, backend, monkeypatch):
    """Under torch.compile a tiny SaPE² / CoPE model's forward and every parameter's gradient
    equal eager's, the graph has no break and calls the fused attention's custom op
    (`vitpe::*_attend`, compiled_ops.py) in every layer, and the compiled backward runs the C++
    kernel's backward (before, the compiled model fell back to the unfused bias path)."""
    from types import SimpleNamespace

    from vitpe_core.config import preset_config
    from vitpe_core.encodings import compiled_ops
    from vitpe_core.model import build_model

    cfg = preset_config("compact", encoding=encoding, encoding_options=options, img_size=(16, 12), patch_size=4,
                        dim=32, depth=2, heads=2, mlp_dim=64)
    model = build_model(cfg)
    x = torch.randn(3, 3, 16, 12)
    want = model(x)
    want.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0
    op = "vitpe.cope_attend" if encoding.startswith("cope") else "vitpe.sape2_attend"
    called = [str(n.target) for g in explained.graphs for n in g.graph.nodes if str(n.target).startswith(op)]
    assert len(called) == cfg.depth, called
    counting = _CountingKernels(_kernels.kernels())
    monkeypatch.setattr(compiled_ops, "_kernels", SimpleNamespace(kernels=lambda: counting))
    torch._dynamo.reset()
    got = torch.compile(model, backend=backend)(x)
    got.square().sum().backward()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], atol=1e-5, rtol=1e-4, msg=name)
    kind = "cope" if encoding.startswith("cope") else "sape2"
    fwd, bwd = f"{kind}_attend_fwd", f"{kind}_attend_bwd"
    assert counting.calls.get(fwd) == cfg.depth and counting.calls.get(bwd) == cfg.depth


def test_the_custom_ops_stay_out_of_the_start_up_path():
    """compiled_ops.py imports torch._dynamo (about a second): importing the model must not."""
    import subprocess
    import sys
    code = ("import sys, vitpe_core.model, vitpe_core.encodings.functional; "
            "print('vitpe_core.encodings.compiled_ops' in sys.modules, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
