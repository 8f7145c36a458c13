"""vitpe_core.positional on cases with known answers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vitpe_core import ViTConfig, build_model
from vitpe_core import positional as Pos
from vitpe_core.encodings.grid import grid_coords

GRID = (4, 5)


def _model(encoding: str, depth: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ViTConfig(img_size=(16, 20), patch_size=4, dim=32, depth=depth, heads=2, mlp_dim=32,
                                 encoding=encoding)).eval()


def _images(n: int = 3) -> torch.Tensor:
    return torch.randn(n, 3, 16, 20, generator=torch.Generator().manual_seed(1))


def test_rpb_kernel_is_its_table_and_purely_relative():
    model = _model("rpb")
    k = Pos.position_kernels(model, _images())
    assert k.kind == "bias" and k.kernel.shape == (2, 2, 20, 20) and np.allclose(k.spread, 0)
    np.testing.assert_allclose(Pos.offset_map(k.kernel, GRID), model.pos_enc.rel_tables.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(Pos.relative_score(k.kernel, GRID), 1.0, atol=1e-6)


def test_rope_kernel_depends_only_on_the_offset():
    for enc in ("rope_axial", "rope_mixed"):
        k = Pos.position_kernels(_model(enc), _images())
        assert k.kind == "rotation"
        np.testing.assert_allclose(Pos.relative_score(k.kernel, GRID), 1.0, atol=1e-5)


def test_rope_kernel_is_the_rotated_mean_logit():
    """Against a direct computation: rotate the mean q and k to two patches and take q.k/sqrt d."""
    model = _model("rope_axial", depth=1)
    x = _images()
    rec = []
    with torch.no_grad():
        model(x, trace=rec)
    ang = model.pos_enc.angles(GRID, 0)                                          # (1, N, d/2)
    q = Pos._unrotate(rec[0]["q"][:, :, 1:], ang).mean((0, 2))                    # (h, d)
    k = Pos._unrotate(rec[0]["k"][:, :, 1:], ang).mean((0, 2))
    from vitpe_core.encodings.base import rotate_patches
    N = 20
    qr = rotate_patches(q[None, :, None].expand(1, 2, N, -1).clone(), ang, 0)[0]    # (h, N, d): mean q everywhere
    kr = rotate_patches(k[None, :, None].expand(1, 2, N, -1).clone(), ang, 0)[0]
    direct = (qr @ kr.transpose(-1, -2)) * q.shape[-1] ** -0.5
    np.testing.assert_allclose(Pos.position_kernels(model, x).kernel[0], direct.numpy(), atol=1e-5)


def test_a_random_table_scores_near_zero_and_a_2d_table_higher():
    model = _model("ape", depth=1)
    with torch.no_grad():
        model.pos_enc.pos_embed.normal_(0, 1.0)
    k = Pos.position_kernels(model, _images())
    assert k.kind == "table" and k.kernel.shape == (1, 2, 20, 20)
    assert Pos.relative_score(k.kernel, GRID).max() < 0.35       # 39 offsets for 400 pairs: chance is ~0.1
    sin = _model("sincos2d", depth=1)
    assert Pos.relative_score(Pos.position_kernels(sin, _images()).kernel, GRID).mean() > \
        Pos.relative_score(k.kernel, GRID).mean()


def test_relative_score_and_query_fit_differ_only_by_a_constant_per_query():
    """One offset fit: `relative_score` (the stored measure) counts a per-query constant against
    the kernel, `query_fit` (the per-query view) does not, because softmax ignores it."""
    from vitpe_core.encodings.grid import relative_index
    rng = np.random.default_rng(0)
    H, W = GRID
    idx = relative_index(GRID).numpy()
    relative = rng.normal(size=(2, (2 * H - 1) * (2 * W - 1)))[..., idx]          # (h, N, N), offsets only
    np.testing.assert_allclose(Pos.offset_fit(relative, GRID), relative, atol=1e-12)
    np.testing.assert_allclose(Pos.relative_score(relative, GRID), 1.0, atol=1e-12)
    shifted = relative + rng.normal(size=(2, H * W, 1)) * 5                       # + a constant per query
    np.testing.assert_allclose(Pos.offset_fit(shifted, GRID, per_query=True), shifted, atol=1e-8)
    assert Pos.relative_score(shifted, GRID).max() < 0.9
    assert all(Pos.query_fit(shifted[h], GRID, i) == pytest.approx(1.0, abs=1e-8) for h in (0, 1) for i in (0, 7, 19))
    np.testing.assert_allclose(Pos.offset_fit(shifted, GRID, per_query=True)[1],     # batched = one at a time
                               Pos.offset_fit(shifted[1], GRID, per_query=True), atol=1e-8)


def _negative_fit_kernel() -> tuple[np.ndarray, int]:
    """An `(N, N)` kernel whose query 7 gets a negative `query_fit`: every other row the same
    offset pattern, row 7 almost flat (issue 31: "fit -2.02" under a text that said "share")."""
    from vitpe_core.encodings.grid import relative_index
    rng = np.random.default_rng(1)
    H, W = GRID
    kernel = rng.normal(size=(2 * H - 1) * (2 * W - 1))[relative_index(GRID).numpy()]     # (N, N)
    kernel[7] = 0.01 * rng.normal(size=H * W)
    return kernel, 7


def test_query_fit_is_the_r2_of_the_shared_offset_fit_on_one_row_and_may_be_negative():
    """query_fit's documented meaning: `1 − SSres/SStot` on the query's row, the fit being the
    whole kernel's offset fit with a constant per query; at most 1, negative (not clipped) where
    the shared pattern fits the row worse than the row's mean does."""
    kernel, q = _negative_fit_kernel()
    fit = Pos.offset_fit(kernel, GRID, per_query=True)[q]
    row = kernel[q]
    r2 = 1 - ((row - fit) ** 2).sum() / ((row - row.mean()) ** 2).sum()
    assert Pos.query_fit(kernel, GRID, q) == pytest.approx(r2) and r2 < -1
    assert abs((row - fit).mean()) < 1e-8                               # the constant: the row's residual mean is 0
    rng = np.random.default_rng(2)
    noisy = kernel + rng.normal(size=kernel.shape)
    assert all(Pos.query_fit(noisy, GRID, i) <= 1 for i in range(0, 20, 3))
    assert "(−∞, 1]" in Pos.query_fit.__doc__ and "Not clipped" in Pos.query_fit.__doc__


def test_content_biases_are_averaged_with_their_spread():
    k = Pos.position_kernels(_model("sape2"), _images(4))
    assert k.kind == "bias" and k.spread is not None and k.spread.max() > 0
    assert k.kernel.shape == (2, 2, 20, 20) and (k.kernel >= 0).all()


@pytest.mark.parametrize("encoding", ["sape2", "cope+ape", "rope_mixed"])
def test_kernels_are_the_same_whatever_the_chunk(encoding):
    """The one pass accumulates over chunks of images: any chunking gives the one-batch kernels,
    and a content bias's mean and spread are those over the images of the traced bias."""
    model, x = _model(encoding), _images(5)
    whole = Pos.position_kernels(model, x, chunk=5)
    for chunk in (1, 2, 4):
        k = Pos.position_kernels(model, x, chunk=chunk)
        np.testing.assert_allclose(k.kernel, whole.kernel, atol=1e-5)
        if whole.spread is not None:
            np.testing.assert_allclose(k.spread, whole.spread, atol=1e-5)
    if whole.kind == "bias":
        rec = []
        with torch.no_grad():
            model(x, trace=rec)
        b = torch.stack([t["bias"][..., 1:, 1:].expand(5, -1, -1, -1) for t in rec])   # (L, B, h, N, N)
        np.testing.assert_allclose(whole.kernel, b.mean(1).numpy(), atol=1e-5)
        np.testing.assert_allclose(whole.spread, b.std(1, unbiased=False).numpy(), atol=1e-5)


def test_analyze_traces_each_image_once(monkeypatch):
    """`analyze` takes the kernels and the attention statistics from one forward pass."""
    from vitpe_core.checkpoint import Checkpoint
    model = build_model(ViTConfig(img_size=(32, 32), patch_size=8, dim=32, depth=1, heads=2, mlp_dim=32,
                                  encoding="sape2")).eval()
    seen, real = [], Pos._traces
    monkeypatch.setattr(Pos, "_traces", lambda m, x: seen.append(len(x)) or real(m, x))
    ckpt = Checkpoint(model=model, config=model.cfg, name="t")
    summary, _ = Pos.analyze(ckpt)
    assert sum(seen) == summary["images"] == len(Pos.image_set(ckpt)) and max(seen) <= 8


def test_mean_attention_distance_of_uniform_attention_is_the_mean_pairwise_distance():
    T, P = 21, 1
    uniform = np.full((T, T), 1.0 / T)
    r, c = (x.numpy() for x in grid_coords(GRID))
    pairwise = np.sqrt((r[:, None] - r[None]) ** 2 + (c[:, None] - c[None]) ** 2).mean()
    assert Pos.mean_attention_distance(uniform, GRID, P) == pytest.approx(pairwise)
    local = np.eye(T)                                                             # every patch attends to itself
    assert Pos.mean_attention_distance(local, GRID, P) == pytest.approx(0.0)


def test_rollout_is_the_product_formula_on_a_two_layer_toy():
    rng = np.random.default_rng(0)
    a = rng.random((2, 3, 4, 4))
    a /= a.sum(-1, keepdims=True)
    step = lambda m: (0.5 * m + 0.5 * np.eye(4)) / (0.5 * m + 0.5 * np.eye(4)).sum(-1, keepdims=True)
    expected = step(a[1].mean(0)) @ step(a[0].mean(0))
    np.testing.assert_allclose(Pos.rollout(a, "mean"), expected)
    np.testing.assert_allclose(Pos.rollout(a, "max"), step(a[1].max(0)) @ step(a[0].max(0)))
    np.testing.assert_allclose(Pos.rollout(a).sum(-1), 1.0)
    with pytest.raises(ValueError, match="fusion"):
        Pos.rollout(a, "min")


def test_a_whole_patch_cyclic_shift_moves_an_rpb_bias_exactly():
    model = _model("rpb", depth=1)
    k = Pos.position_kernels(model, _images()).kernel[0, 0].reshape(*GRID, *GRID)    # (H, W, H, W)
    query, shift = (1, 1), (1, 2)
    moved = k[query[0] + shift[0], query[1] + shift[1]]
    rolled = np.roll(k[query], shift, axis=(0, 1))
    # inside the region the shift does not wrap, the map moved with the query
    np.testing.assert_allclose(moved[shift[0]:, shift[1]:], rolled[shift[0]:, shift[1]:], atol=1e-6)


def test_analyze_cli_records_caches_and_invalidates(tmp_path, capsys):
    import json
    import os
    from vitpe_core.__main__ import main
    from vitpe_core.checkpoint import load_checkpoint, save_checkpoint
    path = tmp_path / "rpb.safetensors"
    save_checkpoint(path, build_model(ViTConfig(img_size=(32, 32), patch_size=8, dim=32, depth=1, heads=2, mlp_dim=32,
                                                encoding="rpb")))
    assert main(["analyze", str(path), "--record"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["kind"] == "bias" and line["relative_score"] == pytest.approx(1.0) and line["images"] >= 12
    assert load_checkpoint(path).metrics["position"]["relative_score"] == pytest.approx(1.0)
    cached = Pos.read_cache(path)
    assert cached is not None and cached["kernel"].shape == (1, 2, 16, 16)
    assert cached["offset_kernel"].shape == (1, 2, 7, 7)
    from vitpe_core.gallery import gallery_ids
    from vitpe_core.stored_trace import read_trace, trace_path
    assert line["trace"] == str(trace_path(path))       # the app's first page of it, written after --record's rewrite
    stored = read_trace(path, gallery_ids()[0])
    assert stored is not None and stored.attn.shape == (1, 2, 17, 17) and stored.bias_sources == ("rpb",)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))             # touched, same content: still valid
    assert Pos.read_cache(path) is not None
    save_checkpoint(path, build_model(ViTConfig(img_size=(32, 32), patch_size=8, dim=32, depth=1, heads=2,
                                                mlp_dim=32, encoding="rpb")))   # retrained: another content
    assert Pos.read_cache(path) is None and read_trace(path, gallery_ids()[0]) is None


def test_kernel_views_and_figures_from_the_analysis():
    from vitpe_core import figures, views
    from vitpe_core.checkpoint import Checkpoint
    model = _model("rpb")
    ckpt = Checkpoint(model, model.cfg, {}, {}, "rpb")
    _, arrays = Pos.analyze(ckpt)
    off, score = views.kernel_view(arrays, layer=5, head=None)                 # clamped to the last layer
    np.testing.assert_allclose(off, model.pos_enc.rel_tables[1].detach().numpy().mean(0), atol=1e-5)
    assert score == pytest.approx(1.0)
    assert views.kernel_view(arrays, 0, 1)[0].shape == (7, 9)
    assert list(views.relative_scores_by_layer(arrays)) == ["L0", "L1"]
    fig = figures.kernels_fig({"rpb": off, "other": off[:5, :7]}, {"rpb": score, "other": None}, title="kernels")
    assert [a.text for a in fig.layout.annotations][:2] == ["rpb · rel 1.00", "other"]
    fig = figures.distance_by_depth_fig({"rpb": arrays["mean_distance"]}, title="distance")
    assert len(fig.data) == 2 and len(fig.data[1].y) == 2                      # heads as dots, the mean as a line
    none = _model("none")
    _, arrays = Pos.analyze(Checkpoint(none, none.cfg, {}, {}, "none"))
    assert views.kernel_view(arrays, 0, None) is None and views.relative_scores_by_layer(arrays) == {}


@pytest.mark.parametrize("cfg, names", [({}, ["CLS"]), ({"class_token": False, "pool": "avg"}, []),
                                        ({"dist_token": True, "reg_tokens": 2}, ["CLS", "dist", "reg 0", "reg 1"])])
def test_rollout_maps_for_any_prefix_on_a_non_square_grid(cfg, names):
    """The bias explorer's rollout: row `token` of `rollout` over the patch columns, for the query
    patch and every prefix token; the map and the prefix share together carry all the flow."""
    from vitpe_core import analysis
    torch.manual_seed(0)
    model = build_model(ViTConfig(img_size=(16, 20), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=32,
                                  encoding="rpb", **cfg)).eval()
    tr = analysis.trace_image(model, _images(1)[0])
    P = len(names)
    assert Pos.rollout_sources(model.num_prefix, tr.prefix) == ["patch", *names]
    full = Pos.rollout(tr.attn, "max")
    for token in [P + 7, *range(P)]:
        m, prefix = Pos.rollout_map(tr.attn, GRID, P, token, "max")
        assert m.shape == GRID
        np.testing.assert_allclose(m.ravel(), full[token, P:])
        assert m.sum() + prefix == pytest.approx(1.0)
        assert (prefix == 0.0) == (P == 0)
        np.testing.assert_array_equal(Pos.rollout_row(full, GRID, P, token)[0], m)


@pytest.mark.parametrize("encoding", ["sape2+ape", "ape"])
def test_analyze_takes_its_attention_statistics_layer_by_layer_as_from_all_layers_at_once(encoding):
    """`analyze`'s mean distance and entropy, computed one layer at a time (issue 47: a ViT-B/16's
    whole-trace temporaries were the big memory walk's peak), equal the whole-trace formulas."""
    from vitpe_core.checkpoint import Checkpoint
    model = build_model(ViTConfig(img_size=(32, 40), patch_size=8, dim=32, depth=3, heads=2, mlp_dim=32,
                                  encoding=encoding)).eval()
    ckpt = Checkpoint(model=model, config=model.cfg, name="t")
    _, arrays = Pos.analyze(ckpt)
    images, grid, P = Pos.image_set(ckpt), model.grid_for((32, 40)), model.num_prefix
    with torch.no_grad():
        rec: list[dict] = []
        model(images, trace=rec)
    attn = np.stack([t["attn"].float().numpy() for t in rec], 1)                # (b, L, h, T, T)
    rows = np.clip(attn[..., P:, :], 1e-12, None)
    np.testing.assert_allclose(arrays["mean_distance"], Pos.mean_attention_distance(attn, grid, P).mean(0),
                               rtol=1e-6)
    np.testing.assert_allclose(arrays["entropy"], (-(rows * np.log(rows)).sum(-1).mean(-1)).mean(0), rtol=1e-6)
