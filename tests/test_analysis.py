"""Analysis API: similarity, 2D-structure score, per-patch maps, attention statistics."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vitpe_core import ViTConfig, build_model
from vitpe_core import analysis as A
from vitpe_core.encodings.absolute import sincos_2d_table
from vitpe_core.encodings.grid import grid_coords


def test_spearman_matches_definition():
    a = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert A.spearman(a, a) == pytest.approx(1.0)
    assert A.spearman(a, -a) == pytest.approx(-1.0)
    assert A.spearman(a, np.array([1.0, 1.0, 2.0, 2.0, 3.0])) == pytest.approx(0.9486833, abs=1e-6)  # with ties


def test_structure_score_separates_2d_from_random():
    grid = (4, 6)
    structured = A.structure_score(A.cosine_similarity(sincos_2d_table(grid, 64)), grid)
    rand = A.structure_score(A.cosine_similarity(torch.randn(24, 64)), grid)
    assert structured["spearman"] > 0.8 and abs(rand["spearman"]) < 0.3
    assert structured["neighbour"] > structured["other"]


def test_similarity_grid_layout_is_row_major_on_non_square_grids():
    grid = (3, 5)
    t = sincos_2d_table(grid, 32)
    sim = A.cosine_similarity(t)
    g = A.similarity_grid(sim, grid)
    assert g.shape == (3, 5, 3, 5)
    assert g[1, 3, 1, 3] == pytest.approx(1.0, abs=1e-6)
    assert g[1, 3, 2, 4] == pytest.approx(sim[1 * 5 + 3, 2 * 5 + 4])


@pytest.mark.parametrize("encoding", ["sape2+ape", "rpb", "rope_mixed", "ape", "none", "cope"])
def test_patch_maps_and_stats(encoding):
    cfg = ViTConfig(img_size=(12, 20), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=48, encoding=encoding)
    model = build_model(cfg)
    tr = A.trace_image(model, torch.randn(3, 12, 20))
    maps = A.patch_maps(tr, (2, 4))
    assert maps["attn"].shape == (2, 2, 3, 5)
    assert np.all(maps["attn"] >= 0) and np.all(maps["attn"].sum((-2, -1)) <= 1 + 1e-5)
    if "sape2" in encoding:
        assert {"bias", "sape2.x", "sape2.y"} <= set(maps)
        np.testing.assert_allclose(maps["sape2.x"][:, :, 2, 4], 0, atol=1e-6)  # zero distance to itself
    stats = A.attention_stats(tr)
    assert stats["mean_distance"].shape == (2, 2) and np.all(stats["mean_distance"] >= 0)
    assert np.all(stats["entropy"] <= np.log(16) + 1e-5)
    comp = A.positional_component(model, tr, (2, 4))
    assert (comp is None) == (encoding == "none")
    if comp is not None:
        assert comp[1].shape == (2, 2, 3, 5)
    with pytest.raises(ValueError, match="outside"):
        A.patch_maps(tr, (3, 0))


def test_attention_distance_of_a_one_hot_attention():
    tr = A.Trace(grid=(1, 4), num_prefix=1, logits=np.zeros(2), attn=np.zeros((1, 1, 5, 5)), bias=None)
    tr.attn[0, 0, 1:, 4] = 1.0  # every patch attends to the last one
    assert A.attention_stats(tr)["mean_distance"][0, 0] == pytest.approx((3 + 2 + 1 + 0) / 4)
    assert A.attention_stats(tr)["entropy"][0, 0] == pytest.approx(0.0, abs=1e-6)


def test_normalize01_range():
    m = np.random.randn(2, 3, 4, 5)
    n = A.normalize01(m)
    assert n.min() == 0 and n.max() == 1 and np.allclose(n.max(axis=(-2, -1)), 1)


def test_rope_kernel_is_one_at_the_query_patch():
    cfg = ViTConfig(img_size=(12, 20), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=48, encoding="rope_axial")
    k = A.rope_kernel(build_model(cfg), (3, 5), 0, (1, 2))
    assert k.shape == (2, 3, 5) and k[:, 1, 2] == pytest.approx(1.0)


def test_history_snapshot_changes_the_table():
    cfg = ViTConfig(img_size=(12, 20), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=48, encoding="ape")
    model = build_model(cfg)
    params = {"pos_embed": torch.zeros_like(model.pos_enc.pos_embed)}
    assert A.position_table(model, params=params).abs().max() == 0
    assert A.position_table(model).abs().max() > 0


def test_encoding_scale_measures_the_bias_against_the_logits():
    torch.manual_seed(0)
    model = build_model(ViTConfig(img_size=(16, 16), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=32,
                                  encoding="sape2")).eval()
    x = torch.randn(3, 3, 16, 16)
    base = A.encoding_scale(model, x)
    assert set(base) == {f"enc_{k}_L{i}" for k in ("bias_ratio", "ex_norm", "ey_norm") for i in (0, 1)}
    with torch.no_grad():
        model.pos_enc.sape_x.mul_(3)
        model.pos_enc.sape_y.mul_(3)
    louder = A.encoding_scale(model, x)
    assert louder["enc_ex_norm_L0"] == pytest.approx(3 * base["enc_ex_norm_L0"], rel=1e-4)
    # layer 0 sees the same q, k: its bias scales exactly with the read-out tables
    assert louder["enc_bias_ratio_L0"] == pytest.approx(3 * base["enc_bias_ratio_L0"], rel=1e-3)
    rpb = build_model(ViTConfig(img_size=(16, 16), patch_size=4, dim=32, depth=1, heads=2, mlp_dim=32, encoding="rpb"))
    with torch.no_grad():
        for p in rpb.pos_enc.parameters():
            p.zero_()
    assert A.encoding_scale(rpb, x) == {"enc_bias_ratio_L0": 0.0}
    assert A.encoding_scale(build_model(ViTConfig(img_size=(16, 16), patch_size=4, dim=32, depth=1, heads=2,
                                                  mlp_dim=32, encoding="ape")), x) == {}


@pytest.mark.parametrize("encoding", ["sape2+ape", "rpb", "ape", "cope+ape"])
def test_a_trace_compacted_as_it_is_gathered_equals_the_full_trace_compacted(encoding, monkeypatch):
    """`trace_image(compact=True)` (what the app caches: each layer's float32 record let go as it is
    converted, issue 47's memory) holds exactly `compact_trace(trace_image(...))`: float16 above the
    threshold, float32 below it, bias parts included."""
    torch.manual_seed(0)
    cfg = ViTConfig(img_size=(64, 64), patch_size=8, dim=32, depth=3, heads=4, mlp_dim=64, encoding=encoding)
    model = build_model(cfg).eval()
    x = torch.randn(3, 64, 64)
    full = A.trace_image(model, x)
    for above in (0, A.trace_bytes(full)):               # compacted, and kept as it is
        want = A.compact_trace(full, above=above)
        monkeypatch.setattr(A, "COMPACT_ABOVE", above)
        got = A.trace_image(model, x, compact=True)
        assert got.attn.dtype == want.attn.dtype == (np.float16 if above == 0 else np.float32)
        assert set(got.parts) == set(want.parts) and (got.bias is None) == (want.bias is None)
        pairs = [(got.attn, want.attn), (got.bias, want.bias), *((got.parts[k], want.parts[k]) for k in want.parts)]
        for a, b in pairs:
            if b is not None:
                assert a.dtype == b.dtype and a.shape == b.shape
                np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(got.logits, want.logits)


@pytest.mark.parametrize("encoding", ["sape2+ape", "sape2", "rpb", "ape", "cope+ape", "rope_mixed", "none"])
def test_trace_room_covers_the_float32_record_and_the_kept_maps(encoding):
    """`trace_room`, the budget room the app makes before tracing a big model, bounds what the trace
    holds in float32 while it is made (its record, then the maps kept: twice the full trace)."""
    cfg = ViTConfig(img_size=(48, 64), patch_size=8, dim=32, depth=2, heads=4, mlp_dim=64, encoding=encoding)
    model = build_model(cfg).eval()
    full = A.trace_image(model, torch.randn(3, 48, 64))
    assert 2 * A.trace_bytes(full) <= A.trace_room(model, (48, 64)) <= 8 * A.trace_bytes(full)


@pytest.mark.parametrize("encoding", ["sape2+ape", "ape"])
def test_attention_stats_layer_by_layer_equal_the_whole_trace_formulas(encoding):
    """`attention_stats` goes one layer at a time (issue 47's memory); its values are the formulas'
    over the whole trace, for float32 and float16 (compact) traces."""
    cfg = ViTConfig(img_size=(32, 40), patch_size=8, dim=32, depth=3, heads=2, mlp_dim=48, encoding=encoding)
    full = A.trace_image(build_model(cfg).eval(), torch.randn(3, 32, 40))
    for tr in (full, A.compact_trace(full, above=0)):
        P, attn = tr.num_prefix, np.asarray(tr.attn, dtype=np.float32)
        r, c = (x.numpy() for x in grid_coords(tr.grid))
        dist = np.sqrt((r[:, None] - r[None]) ** 2 + (c[:, None] - c[None]) ** 2)
        a = attn[:, :, P:, P:] / np.clip(attn[:, :, P:, P:].sum(-1, keepdims=True), 1e-12, None)
        rows = np.clip(attn[:, :, P:, :], 1e-12, None)
        got = A.attention_stats(tr)
        np.testing.assert_allclose(got["mean_distance"], (a * dist).sum(-1).mean(-1), rtol=1e-6)
        np.testing.assert_allclose(got["entropy"], -(rows * np.log(rows)).sum(-1).mean(-1), rtol=1e-6)
        assert got["mean_distance"].shape == got["entropy"].shape == (3, 2)
