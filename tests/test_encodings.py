"""Contract tests over every registered encoding and composite on a non-square grid, and
one invariant per encoding (docs/encodings.md, STYLE.md)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange

from vitpe_core import ViTConfig, available_encodings, build_encoding, build_model
from vitpe_core.encodings import EncodingContext
from vitpe_core.encodings.absolute import sincos_2d_table
from vitpe_core.encodings.base import rotate_patches
from vitpe_core.model import Attention

COMPOSITES = ["sape2+ape", "cope+ape", "rope_mixed+ape", "rpb+ape2d", "rope_axial+sape2"]
ALL = available_encodings() + COMPOSITES
GRID = (3, 5)  # non-square: H != W


def tiny(encoding: str, **kw) -> torch.nn.Module:
    cfg = ViTConfig(img_size=(GRID[0] * 4, GRID[1] * 4), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=48,
                    encoding=encoding, **kw)
    return build_model(cfg)


def test_registry_lists_the_nine_encodings_and_the_two_of_imported_families():
    assert available_encodings() == ["none", "ape", "ape2d", "sincos2d", "rpb", "rpb_cls", "rope_axial", "rope_mixed",
                                     "rope_dinov3", "cope", "sape2"]


def test_unknown_names_and_options_fail_loudly():
    ctx = EncodingContext(32, 2, 2, GRID)
    with pytest.raises(ValueError, match="valid"):
        build_encoding("sape3", ctx)
    with pytest.raises(ValueError, match="npos_mx"):
        build_encoding("sape2+ape", ctx, npos_mx=5)
    with pytest.raises(ValueError, match="twice"):
        build_encoding("ape+ape", ctx)
    assert build_encoding("sape2+ape", ctx, npos_max=5, readout="key").parts[0].npos_max == 5


@pytest.mark.parametrize("encoding", ALL)
def test_contract_shapes_finite_gradients_and_fast_equals_trace(encoding):
    model = tiny(encoding)
    x = torch.randn(3, 3, GRID[0] * 4, GRID[1] * 4)
    trace: list[dict] = []
    fast = model(x)
    slow = model(x, trace=trace)
    assert fast.shape == (3, 10) and torch.isfinite(fast).all()
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    T = 1 + GRID[0] * GRID[1]
    assert len(trace) == 2
    for rec in trace:
        assert rec["attn"].shape == (3, 2, T, T)
        if rec["bias"] is not None:
            assert rec["bias"].shape[1:] == (2, T, T) and torch.isfinite(rec["bias"]).all()
    model(x).square().mean().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(p.grad).all(), name
    pos_params = list(model.pos_enc.named_parameters())
    for name, p in pos_params:
        assert p.grad.abs().sum() > 0, f"position parameter {name} has an all-zero gradient"


@pytest.mark.parametrize("encoding", ["sape2", "cope", "sape2+ape", "cope+ape"])
def test_gates_from_the_shared_logits_equal_their_own_matmul(encoding):
    """CoPE/SaPE² reuse the attention's logits for their gates; output and every gradient
    must equal the bias computed from q, k on its own and passed to SDPA as a mask."""
    torch.manual_seed(0)
    attn, pos = Attention(32, 2), build_encoding(encoding, EncodingContext(32, 2, 1, GRID, 1))
    assert pos.uses_logits
    with torch.no_grad():
        for p in pos.parameters():
            p.normal_(std=0.5)  # a bias large enough to matter
    x = torch.randn(3, 1 + GRID[0] * GRID[1], 32, requires_grad=True)
    params = [x, *attn.parameters(), *pos.parameters()]

    def reference() -> torch.Tensor:
        q, k, v = rearrange(attn.qkv(x), "b t (three h d) -> three b h t d", three=3, h=2).unbind(0)
        bias = pos.bias(q, k, grid=GRID, layer=0)                           # its own q·k matmul
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return attn.proj(rearrange(out, "b h t d -> b t (h d)"))

    results = []
    for fn in (lambda: attn(x, pos, GRID, layer=0), reference):
        out = fn()
        results.append((out, torch.autograd.grad(out.square().sum(), params, allow_unused=True,
                                                 materialize_grads=True)))  # ape: not in attention
    (a, ga), (b, gb) = results
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for p_a, p_b in zip(ga, gb):
        torch.testing.assert_close(p_a, p_b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("encoding", ALL)
@pytest.mark.parametrize("img", [(8, 8), (16, 28), (20, 12)])
def test_runs_at_other_resolutions(encoding, img):
    model = tiny(encoding).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, *img))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_prefix_tokens_get_zero_bias_for_sape2_and_rpb():
    for enc in ("sape2", "rpb"):
        model = tiny(enc)
        trace: list[dict] = []
        model(torch.randn(2, 3, 12, 20), trace=trace)
        b = trace[0]["bias"]
        assert b[..., 0, :].abs().max() == 0 and b[..., :, 0].abs().max() == 0


def test_sape2_trace_records_x_and_y_parts_that_sum_to_the_bias():
    model = tiny("sape2+rpb")
    trace: list[dict] = []
    model(torch.randn(2, 3, 12, 20), trace=trace)
    parts = trace[1]["parts"]
    assert set(parts) == {"sape2.x", "sape2.y"}
    sape = model.pos_enc.parts[0]
    rpb = model.pos_enc.parts[1]
    rec = trace[1]
    rpb_bias = rpb.bias(None, None, grid=GRID, layer=1)
    torch.testing.assert_close(rec["bias"][..., 1:, 1:] - rpb_bias[..., 1:, 1:], parts["sape2.x"] + parts["sape2.y"])
    assert sape.readout == "query"


@pytest.mark.parametrize("encoding", ["rpb", "rpb_cls"])
def test_rpb_depends_only_on_the_offset(encoding):
    model = tiny(encoding)
    bias = model.pos_enc.bias(None, None, grid=GRID, layer=1)[0, :, 1:, 1:]   # (h, N, N)
    H, W = GRID
    seen: dict[tuple, torch.Tensor] = {}
    for i in range(H * W):
        for j in range(H * W):
            off = (i // W - j // W, i % W - j % W)
            if off in seen:
                assert torch.equal(bias[:, i, j], seen[off])
            seen[off] = bias[:, i, j]
    assert len(seen) == (2 * H - 1) * (2 * W - 1)


def test_rpb_cls_has_beits_three_prefix_entries_per_layer_or_shared():
    """CLS->patch, patch->CLS and CLS->CLS are one learned value each per head (zero in `rpb`);
    `shared=True` gives every layer the same bias."""
    for shared in (False, True):
        model = tiny("rpb_cls", encoding_options={"shared": shared})
        cls = model.pos_enc.cls_bias.detach()                                     # (L|1, h, 3)
        assert cls.shape == (1 if shared else 2, 2, 3)
        biases = [model.pos_enc.bias(None, None, grid=GRID, layer=i)[0].detach() for i in (0, 1)]   # (h, T, T)
        for i, bias in enumerate(biases):
            c = cls[0 if shared else i]
            assert torch.equal(bias[:, 0, 1:], c[:, 0, None].expand(-1, GRID[0] * GRID[1]))
            assert torch.equal(bias[:, 1:, 0], c[:, 1, None].expand(-1, GRID[0] * GRID[1]))
            assert torch.equal(bias[:, 0, 0], c[:, 2])
        assert torch.equal(biases[0], biases[1]) == shared


def test_rope_dinov3_angles_follow_the_spec():
    """DINOv3: pair k turns by 2π·y·f_k, pair d/4 + k by 2π·x·f_k, on patch centres in [-1, 1]."""
    enc = build_encoding("rope_dinov3", EncodingContext(32, 2, 1, GRID), theta=50.0)
    ang = enc.angles(GRID, 0)[0]                                        # (N, d/2) with d = 16
    f = [50.0 ** (-4 * k / 16) for k in range(4)]
    r, c = 2, 3
    y, x = 2 * (r + 0.5) / GRID[0] - 1, 2 * (c + 0.5) / GRID[1] - 1
    expected = torch.tensor([2 * math.pi * y * fk for fk in f] + [2 * math.pi * x * fk for fk in f])
    torch.testing.assert_close(ang[r * GRID[1] + c], expected)


@pytest.mark.parametrize("encoding", ["rope_axial", "rope_mixed", "rope_dinov3"])
def test_rope_scores_invariant_to_global_shift_and_norm_preserving(encoding):
    big = (7, 9)
    ctx = EncodingContext(32, 2, 2, big)
    enc = build_encoding(encoding, ctx)
    ang = enc.angles(big, 1)                                            # (h|1, N, d/2)
    q = torch.randn(1, 2, 1 + 63, 16)
    k = torch.randn(1, 2, 1 + 63, 16)
    # put the same content at every position, so only positions differ
    q[:, :, 1:] = q[:, :, 1:2]
    k[:, :, 1:] = k[:, :, 1:2]
    qr, kr = rotate_patches(q, ang, 1), rotate_patches(k, ang, 1)
    torch.testing.assert_close(qr.norm(dim=-1), q.norm(dim=-1))
    assert torch.equal(qr[:, :, 0], q[:, :, 0]), "prefix tokens are not rotated"
    scores = (qr[:, :, 1:] @ kr[:, :, 1:].transpose(-1, -2))[0]         # (h, N, N)
    W = big[1]
    n = lambda r, c: r * W + c
    for (r1, c1), (r2, c2) in [((0, 0), (2, 3)), ((1, 4), (5, 1)), ((3, 3), (3, 8))]:
        for dr, dc in [(1, 0), (0, 1), (1, 1), (-1, 2)]:
            if all(0 <= v < lim for v, lim in [(r1 + dr, 7), (r2 + dr, 7), (c1 + dc, 9), (c2 + dc, 9)]):
                torch.testing.assert_close(scores[:, n(r1, c1), n(r2, c2)],
                                           scores[:, n(r1 + dr, c1 + dc), n(r2 + dr, c2 + dc)], atol=1e-4, rtol=1e-4)


def test_rope_axial_angles_follow_the_spec():
    enc = build_encoding("rope_axial", EncodingContext(32, 2, 1, (3, 5)))
    ang = enc.angles((3, 5), 0)[0]                                      # (N, d/2) with d = 16
    theta = [100 ** (-k / 4) for k in range(4)]
    r, c = 2, 3
    row = ang[r * 5 + c]
    torch.testing.assert_close(row, torch.tensor([c * t for t in theta] + [r * t for t in theta]))


def test_none_is_permutation_equivariant():
    model = tiny("none").eval()
    x = torch.randn(2, 3, 12, 20)
    patches = rearrange(x, "b c (y p) (x q) -> b (y x) c p q", p=4, q=4)
    perm = torch.randperm(patches.shape[1])
    shuffled = rearrange(patches[:, perm], "b (y x) c p q -> b c (y p) (x q)", y=3)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(shuffled), atol=1e-5, rtol=1e-5)
        # with a position encoding the same shuffle changes the output
        ape = tiny("sincos2d").eval()
        assert not torch.allclose(ape(x), ape(shuffled), atol=1e-4)


def test_sincos2d_pinned_against_reference():
    H, W, D = 3, 5, 16
    table = sincos_2d_table((H, W), D)
    for r in range(H):
        for c in range(W):
            ref = []
            for pos in (r, c):
                omegas = [10000 ** (-k / (D / 4)) for k in range(D // 4)]
                ref += [math.sin(pos * w) for w in omegas] + [math.cos(pos * w) for w in omegas]
            torch.testing.assert_close(table[r * W + c], torch.tensor(ref), atol=1e-6, rtol=1e-6)
    model = tiny("sincos2d")
    assert "pos_enc.pos_table" not in model.state_dict(), "fixed table is a non-persistent buffer"
    assert model.pos_enc.table(GRID)[0].abs().max() == 0, "CLS row is zero"


def test_ape2d_is_row_plus_column():
    enc = build_encoding("ape2d", EncodingContext(32, 2, 1, GRID))
    t = enc.table(GRID)
    torch.testing.assert_close(t[1 + 2 * 5 + 3], enc.row_embed[2] + enc.col_embed[3])
    assert enc.table((6, 10)).shape == (61, 32)


def test_ape_resample_keeps_prefix_and_identity_at_same_grid():
    enc = build_encoding("ape", EncodingContext(32, 2, 1, GRID))
    assert torch.equal(enc.table(GRID), enc.pos_embed[0])
    t = enc.table((6, 10))
    assert t.shape == (61, 32) and torch.equal(t[0], enc.pos_embed[0, 0])
    # a constant table resamples to the same constant
    with torch.no_grad():
        enc.pos_embed[:, 1:] = 0.5
    torch.testing.assert_close(enc.table((4, 7))[1:], torch.full((28, 32), 0.5))


def test_cope_uses_the_whole_sequence_including_cls():
    model = tiny("cope")
    trace: list[dict] = []
    model(torch.randn(1, 3, 12, 20), trace=trace)
    assert trace[0]["bias"][..., 0, :].abs().sum() > 0
