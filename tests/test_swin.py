"""Swin and Swin-V2: imported from transformers' own tiny random models (`save_pretrained`), they
reproduce its logits and every block's attention weights within 1e-5 (relative, float32); they
round-trip through a vitpe checkpoint in float32; what cannot be computed is refused by name; the
bias explorer's window view places a patch's window where the mask says it attends."""
from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from safetensors.torch import load_file

from vitpe_core import figures
from vitpe_core.checkpoint import CheckpointError, load_checkpoint, read_config, save_checkpoint
from vitpe_core.swin import SwinConfig, SwinTransformer
from vitpe_core.importers import import_state_dict, is_swin
from vitpe_core.swin.windows import stage_token, window_lines, window_rows

transformers = pytest.importorskip("transformers")

RTOL = 1e-5
TINY = dict(patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], num_labels=3)
CASES = {   # name -> (version, config overrides, other input sizes to check)
    # 8x8 then 4x4 tokens in 2x2 windows: every odd block shifted
    "v1-shift": (1, dict(image_size=32, window_size=2), [(40, 24)]),
    # 10x10 -> padded to 12x12 in 3x3 windows, shifted; stage 2: 5x5 -> 6x6
    # (the blocks' eps is the config's, the embedding's and merging's 1e-5; a non-integer MLP ratio)
    "v1-pad": (1, dict(image_size=40, window_size=3, layer_norm_eps=1e-3, mlp_ratio=2.5), []),
    # non-square 8x12 (padded to 9x12), no qkv bias, an absolute table; stage 2: 4x6, shifted, padded to 6x6
    "v1-rect-ape": (1, dict(image_size=[32, 48], window_size=3, qkv_bias=False, use_absolute_embeddings=True), []),
    # stage 2's 4x4 grid is one 4x4 window, unshifted
    "v1-one-window": (1, dict(image_size=32, window_size=4), []),
    "v2-shift": (2, dict(image_size=32, window_size=2), [(40, 24), (34, 30)]),
    "v2-pad": (2, dict(image_size=40, window_size=3, layer_norm_eps=1e-3, mlp_ratio=2.5), []),
    "v2-rect-pretrained": (2, dict(image_size=[32, 48], window_size=3, pretrained_window_sizes=[4, 2]), []),
    "v2-one-window-nobias": (2, dict(image_size=32, window_size=4, qkv_bias=False), []),
}


def import_swin(sd, config, **kw):
    """The one importer on a Swin state dict, as (model, what `Imported` records)."""
    imp = import_state_dict(sd, family="swin", hf_config=config, **kw)
    return imp.model, {"family": imp.family, "class_names": imp.class_names, "preprocess": imp.preprocess,
                       "notes": imp.notes, "source_dtype": imp.source_dtype}


def hf_model(version: int, headless: bool = False, **overrides):
    cls = {(1, False): "SwinForImageClassification", (2, False): "Swinv2ForImageClassification",
           (1, True): "SwinModel", (2, True): "Swinv2Model"}[(version, headless)]
    config = (transformers.SwinConfig if version == 1 else transformers.Swinv2Config)(**{**TINY, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, cls)(config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():   # transformers starts bias tables at zero and the logit scale at log 10: make them matter
        for name, p in model.named_parameters():
            if "logit_scale" in name:
                p.copy_(2.0 + 0.5 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_((0.3 if p.ndim == 1 else 0.2) * torch.randn(p.shape, generator=gen))
    return model


def saved(model, tmp_path):
    model.save_pretrained(tmp_path)
    return load_file(str(tmp_path / "model.safetensors")), json.loads((tmp_path / "config.json").read_text())


def hf_outputs(model, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits (or pooled features) and every block's attention weights `(B·nW, h, N, N)` (the
    model's `attentions` keep only each stage's last block: hooks catch them all)."""
    attns = []
    mods = [m for m in model.modules() if type(m).__name__ in ("SwinAttention", "Swinv2SelfAttention")]
    hooks = [m.register_forward_hook(lambda m, i, o: attns.append(o[1])) for m in mods]
    try:
        with torch.no_grad():
            out = model(x, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    return (out.logits if hasattr(out, "logits") else out.pooler_output), attns


def ours(model: SwinTransformer, x: torch.Tensor) -> tuple[torch.Tensor, list[dict]]:
    trace = []
    with torch.no_grad():
        return model(x, trace=trace), trace


def assert_rel(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, (what, a.shape, b.shape)
    err = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-12)
    assert err <= RTOL, f"{what}: relative error {err:.2e}"


def assert_same_as_hf(model, hf, x) -> list[dict]:
    ref, attns = hf_outputs(hf, x)
    out, trace = ours(model, x)
    assert_rel(out, ref, "logits")
    assert len(trace) == len(attns) == model.cfg.depth
    for i, (t, a) in enumerate(zip(trace, attns)):
        assert_rel(t["attn"].flatten(0, 1), a, f"block {i} attention")
    return trace


@pytest.mark.parametrize("case", sorted(CASES))
def test_imported_swin_equals_transformers(case, tmp_path):
    version, overrides, other_sizes = CASES[case]
    hf = hf_model(version, **overrides)
    sd, config = saved(hf, tmp_path)
    assert is_swin(config) and is_swin(sd)
    model, info = import_swin(sd, config)
    assert info["family"] == ("hf-swin" if version == 1 else "hf-swinv2") and info["source_dtype"] == torch.float32
    assert info["class_names"] == ["LABEL_0", "LABEL_1", "LABEL_2"]
    H, W = model.cfg.img_size
    x = torch.randn(2, 3, H, W, generator=torch.Generator().manual_seed(2))
    trace = assert_same_as_hf(model, hf, x)
    if "shift" in case:
        assert [t["shift"] for t in trace] == [0, 1, 0, 1]
    if "pad" in case:
        assert [t["padded"] for t in trace] == [(12, 12), (12, 12), (6, 6), (6, 6)]
    if "one-window" in case:
        assert [(t["window"], t["shift"]) for t in trace[2:]] == [(4, 0), (4, 0)] and trace[1]["shift"] == 2
    for size in other_sizes:   # another image size, also one that is not a multiple of the patch
        assert_same_as_hf(model, hf, torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(3)))


@pytest.mark.parametrize("version", [1, 2])
def test_the_shift_and_its_mask_are_what_the_comparison_checks(version, tmp_path, monkeypatch):
    """The parity test above can fail: the same weights without the shift (and so without its mask)
    give other logits and attention weights."""
    hf = hf_model(version, image_size=32, window_size=2)
    model, _ = import_swin(*saved(hf, tmp_path))
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    ref, attns = hf_outputs(hf, x)
    monkeypatch.setattr(SwinConfig, "layout", lambda self, stage, grid: (2, 0))
    out, trace = ours(model, x)
    assert (out - ref).abs().max() > 1e-3 * ref.abs().max()
    assert (trace[1]["attn"].flatten(0, 1) - attns[1]).abs().max() > 1e-2


@pytest.mark.parametrize("version", [1, 2])
def test_headless_models_give_the_pooled_features(version, tmp_path):
    hf = hf_model(version, headless=True, image_size=32, window_size=2)
    sd, config = saved(hf, tmp_path)
    model, info = import_swin(sd, config)
    assert model.cfg.num_classes == 0 and info["class_names"] is None
    assert_same_as_hf(model, hf, torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5)))


def test_transformers_5_in_memory_names_are_read_too():
    hf = hf_model(1, image_size=32, window_size=2)
    sd = hf.state_dict()
    assert any(k.endswith("attention.q_proj.weight") for k in sd)
    model, _ = import_swin(sd, hf.config.to_dict())
    assert_same_as_hf(model, hf, torch.randn(1, 3, 32, 32))


def test_what_cannot_be_computed_is_refused_by_name(tmp_path):
    hf = hf_model(1, image_size=32, window_size=2)
    sd, config = saved(hf, tmp_path)
    with pytest.raises(CheckpointError, match=r"decoder\.0\.weight"):
        import_swin({**sd, "decoder.0.weight": torch.zeros(3, 3)}, config)
    with pytest.raises(CheckpointError, match="hidden_act 'relu'"):
        import_swin(sd, {**config, "hidden_act": "relu"})
    with pytest.raises(CheckpointError, match="config.json"):
        import_swin(sd, None)
    with pytest.raises(CheckpointError, match="swinv2"):
        import_swin(sd, {**config, "model_type": "swinv2"})
    with pytest.raises(CheckpointError, match="depths"):
        import_swin(sd, {**config, "depths": [2, 2, 2], "num_heads": [2, 4, 8]})
    with pytest.raises(CheckpointError, match="relative_position_bias_table"):
        import_swin(sd, {**config, "num_heads": [4, 4]})     # heads contradict the tables: named by load_weights
    v2 = hf_model(2, image_size=32, window_size=2)
    sd2, config2 = saved(v2, tmp_path / "v2")
    with pytest.raises(CheckpointError, match="use_absolute_embeddings"):
        import_swin(sd2, {**config2, "use_absolute_embeddings": True})


def test_mask_token_and_index_buffers_are_left_out_with_a_note(tmp_path):
    config = transformers.SwinConfig(**{**TINY, "image_size": 32, "window_size": 2})
    config._attn_implementation = "eager"
    hf = transformers.SwinModel(config, use_mask_token=True).eval()
    sd, config = saved(hf, tmp_path)
    sd = {**sd, "encoder.layers.0.blocks.0.attention.self.relative_position_index": torch.zeros(16, dtype=torch.long)}
    model, info = import_swin(sd, config)
    notes = " ".join(info["notes"])
    assert "mask_token" in notes and "relative_position_index" in notes
    assert_same_as_hf(model, hf, torch.randn(1, 3, 32, 32))


def test_is_swin_by_model_type_or_keys():
    assert is_swin({"model_type": "swin"}) and is_swin({"model_type": "swinv2"})
    assert not is_swin({"model_type": "vit"}) and not is_swin(None)
    assert is_swin(["swin.encoder.layers.0.blocks.0.attention.self.relative_position_bias_table"])
    assert is_swin(["encoder.layers.1.blocks.0.attention.self.continuous_position_bias_mlp.0.weight"])
    assert not is_swin(["beit.encoder.layer.0.attention.attention.relative_position_bias.relative_position_bias_table"])
    assert not is_swin(["blocks.0.attn.qkv.weight"])


@pytest.mark.parametrize("version", [1, 2])
def test_checkpoint_round_trip_keeps_float32_and_the_outputs(version, tmp_path):
    hf = hf_model(version, image_size=40, window_size=3)
    model, info = import_swin(*saved(hf, tmp_path / "hf"))
    path = save_checkpoint(tmp_path / "swin.safetensors", model, metrics={"family": info["family"]},
                           dtype=info["source_dtype"])
    assert all(v.dtype == torch.float32 for v in load_file(str(path)).values())
    assert isinstance(read_config(path), SwinConfig) and read_config(path) == model.cfg
    side = json.loads(path.with_suffix(".json").read_text())
    assert side["config"]["arch"] == "swin" and side["config"]["version"] == version
    ck = load_checkpoint(path)
    assert isinstance(ck.model, SwinTransformer) and ck.config == model.cfg and ck.history == {}
    x = torch.randn(2, 3, 40, 40)
    with torch.no_grad():
        assert torch.equal(ck.model(x), model(x))


def test_a_forged_swin_config_is_refused_before_building(tmp_path):
    model = SwinTransformer(SwinConfig(img_size=(32, 32), embed_dim=8, depths=(2,), num_heads=(2,), window_size=2,
                                       num_classes=3))
    path = save_checkpoint(tmp_path / "s.safetensors", model, dtype=torch.float32)
    from safetensors.torch import save_file
    tensors = load_file(str(path))
    cfg = {**model.cfg.to_dict(), "embed_dim": 4096, "depths": [40], "num_heads": [8]}
    save_file(tensors, str(path), metadata={"format": "vitpe-checkpoint", "format_version": "1",
                                            "config": json.dumps(cfg), "metrics": "{}"})
    with pytest.raises(CheckpointError, match="describes a model of about"):
        load_checkpoint(path)


def test_config_round_trips_and_checks_itself():
    cfg = SwinConfig(version=2, img_size=(32, 48), embed_dim=16, depths=(2, 2), num_heads=(2, 4), window_size=3,
                     pretrained_window_sizes=(4, 2))
    assert SwinConfig.from_dict(json.loads(cfg.to_json())) == cfg
    assert cfg.stage_windows == (3, 3) and cfg.depth == 4 and cfg.block_of(3) == (1, 1)
    with pytest.raises(ValueError, match="unknown SwinConfig fields"):
        SwinConfig.from_dict({**cfg.to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="not divisible"):
        SwinConfig(embed_dim=10, depths=(2,), num_heads=(3,))
    with pytest.raises(ValueError, match="not a Swin"):
        SwinConfig.from_dict({**cfg.to_dict(), "arch": "vit"})


def test_a_smaller_grid_than_the_table_uses_its_central_offsets():
    """Swin on a grid smaller than its window (transformers' own forward fails there): one window of
    the grid's size, biased by the table's central offsets."""
    model = SwinTransformer(SwinConfig(img_size=(32, 32), embed_dim=8, depths=(2,), num_heads=(2,), window_size=4,
                                       num_classes=3)).eval()
    with torch.no_grad():
        model.layers[0].blocks[0].attn.relative_position_bias_table.normal_()
    out, trace = ours(model, torch.randn(1, 3, 12, 12))
    assert torch.isfinite(out).all() and (trace[0]["window"], trace[0]["shift"]) == (3, 0)
    table = model.layers[0].blocks[0].attn.relative_position_bias_table.detach().reshape(7, 7, 2)
    assert torch.equal(trace[0]["table"], table[1:6, 1:6].permute(2, 0, 1))


# ----------------------------------------------------------------------------- the window view
def test_window_lines_and_stage_tokens():
    assert window_lines((8, 8), 2, 0) == ((2, 4, 6), (2, 4, 6))
    assert window_lines((5, 7), 3, 1) == ((1, 4), (1, 4))
    assert window_lines((4, 4), 4, 0) == ((), ())
    assert stage_token((5, 3), 1, (8, 8)) == (2, 1) and stage_token((7, 7), 2, (8, 8)) == (1, 1)
    with pytest.raises(ValueError, match="outside"):
        stage_token((8, 0), 0, (8, 8))


def _regions(n: int, w: int, shift: int) -> np.ndarray:
    """Per unrolled index along one axis of a padded length `n`: (window, region) as the mask's
    definition says (rolled index i' = i - shift; regions [0, n-w), [n-w, n-shift), [n-shift, n))."""
    rolled = (np.arange(n) - shift) % n
    region = (rolled >= n - w).astype(int) + (rolled >= n - shift).astype(int) if shift else np.zeros(n, int)
    return np.stack([rolled // w, region], -1)


@pytest.mark.parametrize("version,size,window,patch,layer", [
    (1, 40, 3, (9, 9), 1), (1, 40, 3, (0, 4), 1), (1, 40, 3, (6, 2), 3), (2, 32, 2, (7, 0), 1),
    (2, 40, 3, (3, 8), 0), (2, 40, 3, (8, 9), 3)])
def test_window_rows_place_the_patch_window_where_the_mask_lets_it_attend(version, size, window, patch, layer,
                                                                          tmp_path):
    hf = hf_model(version, image_size=size, window_size=window)
    model, _ = import_swin(*saved(hf, tmp_path))
    image = torch.randn(3, size, size, generator=torch.Generator().manual_seed(6))
    rows = window_rows(model, image, patch, layer)
    (Hs, Ws), (Hp, Wp), w, s = rows.grid, rows.padded, rows.window, rows.shift
    r, c = rows.token
    assert rows.token == (patch[0] >> rows.stage, patch[1] >> rows.stage)
    # brute force: same window and region along both axes of the padded grid, inside the image
    ry, rx = _regions(Hp, w, s), _regions(Wp, w, s)
    want = np.array([[(ry[y] == ry[r]).all() and (rx[x] == rx[c]).all() for x in range(Ws)] for y in range(Hs)])
    assert (rows.members == want).all() and rows.members[r, c]
    r0, c0, r1, c1 = rows.window_box
    assert rows.members[r0:r1, c0:c1].all() and rows.members.sum() == (r1 - r0) * (c1 - c0)
    assert all(e in (0, Hs) or e in rows.row_lines for e in (r0, r1))
    assert all(e in (0, Ws) or e in rows.col_lines for e in (c0, c1))
    assert np.isnan(rows.bias[:, ~rows.members]).all() and np.isfinite(rows.bias[:, rows.members]).all()
    # the bias is the table at the offset (query - key); Swin-V2's through 16 sigmoid
    for y, x in zip(*np.nonzero(rows.members)):
        expect = rows.table[:, r - y + w - 1, c - x + w - 1]
        expect = 16 / (1 + np.exp(-expect)) if version == 2 else expect
        np.testing.assert_allclose(rows.bias[:, y, x], expect, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.nansum(rows.attn, axis=(1, 2)) + rows.outside, 1.0, atol=1e-5)
    assert (rows.outside >= -1e-6).all()
    if (Hp, Wp) == (Hs, Ws):
        np.testing.assert_allclose(rows.outside, 0.0, atol=1e-6)   # no padding: nothing outside the window
    # the attention row is transformers' row for that token (its window and its place in it)
    _, attns = hf_outputs(hf, image[None])
    a = attns[layer]
    rr, cc = (r - s) % Hp, (c - s) % Wp
    win, n = (rr // w) * (Wp // w) + cc // w, (rr % w) * w + cc % w
    ys, xs = np.nonzero(rows.members)
    m = ((ys - s) % Hp % w) * w + (xs - s) % Wp % w
    np.testing.assert_allclose(rows.attn[:, ys, xs], a[win, :, n, m].numpy(), rtol=1e-5, atol=1e-7)


def test_window_rows_reuses_a_trace_and_checks_it(tmp_path):
    model, _ = import_swin(*saved(hf_model(1, image_size=32, window_size=2), tmp_path))
    image = torch.randn(3, 32, 32)
    trace = ours(model, image[None])[1]
    a, b = window_rows(model, image, (3, 5), 1), window_rows(model, None, (3, 5), 1, trace=trace)
    assert np.array_equal(a.bias, b.bias, equal_nan=True) and a.what == "relative position bias (table)"
    with pytest.raises(ValueError, match="blocks"):
        window_rows(model, None, (3, 5), 1, trace=trace[:2])
    np.testing.assert_array_equal(a.shown("attn", 1), a.attn[1])
    np.testing.assert_allclose(a.shown(), a.bias.mean(0))
    with pytest.raises(ValueError, match="2 heads"):
        a.shown("bias", 2)
    deep = window_rows(model, None, (3, 5), 3, trace=trace)            # stage 2: a token per 2x2 patches
    spread = deep.on_patch_grid(deep.shown())
    assert deep.token == (1, 2) and spread.shape == (8, 8) and np.isfinite(spread[3, 5])
    assert np.array_equal(spread[::2, ::2], deep.shown(), equal_nan=True)
    assert np.isfinite(spread).sum() == 4 * deep.members.sum()
    with pytest.raises(ValueError, match="out of range"):
        window_rows(model, image, (3, 5), 4)


def test_window_map_fig_draws_the_shifted_window_grid(tmp_path):
    model, _ = import_swin(*saved(hf_model(2, image_size=40, window_size=3), tmp_path))
    rows = window_rows(model, torch.randn(3, 40, 40), (9, 9), 1)     # shifted by 1: lines at 1, 4, 7 on 10x10
    assert rows.row_lines == (1, 4, 7) and rows.col_lines == (1, 4, 7)
    fig = figures.window_map_fig(rows.bias[0], row_lines=rows.row_lines, col_lines=rows.col_lines,
                                 box=rows.window_box, patch=rows.token, title=rows.what, colorbar_title="bias")
    go.Figure(fig.to_dict())                                            # valid Plotly, though built unvalidated
    lines, box, patch = fig.layout.shapes
    assert lines.path == "M0,1H10M0,4H10M0,7H10M1,0V10M4,0V10M7,0V10"
    assert (box.x0, box.y0, box.x1, box.y1) == (7, 7, 10, 10) and (patch.x0, patch.y0) == (9, 9)
    z = np.asarray(fig.data[0].z, dtype=float)
    assert np.isnan(z[0, 0]) and np.isfinite(z[9, 9])
    img = np.zeros((80, 40, 3), np.uint8)                               # over an image: the grid spread over it
    fig = figures.window_map_fig(rows.attn[0], row_lines=(1,), col_lines=(), image_rgb=img, title="t",
                                 colorbar_title="attention", zmin=0)
    go.Figure(fig.to_dict())
    assert fig.data[0].type == "image" and fig.layout.shapes[0].path == "M0,8H40"
    assert (fig.data[1].dx, fig.data[1].dy) == (4, 8)


def test_another_image_size_builds_what_transformers_builds_there(tmp_path):
    """Swin-V2's windows are fixed when built: imported for 40 px instead of the config's 64, it
    equals transformers' model built for 40 px with the same weights (the last stage's 5x5 grid
    one 5x5 window, unshifted, where the 64-px build keeps shifted 6x6 windows)."""
    hf = hf_model(2, image_size=64, window_size=6)
    sd, config = saved(hf, tmp_path)
    model, info = import_swin(sd, config, img_size=(40, 40), norm="inception",
                              crop_pct=1.0)
    assert "Built for 40x40 px" in " ".join(info["notes"]) and info["preprocess"]["crop_pct"] == 1.0
    assert info["preprocess"]["mean"] == [0.5] * 3 and model.cfg.stage_windows == (6, 5)
    assert model.cfg.stage_shifts == (3, 0)
    other = transformers.Swinv2Config(**{**config, "image_size": 40})
    other._attn_implementation = "eager"
    hf40 = transformers.Swinv2ForImageClassification(other).eval()
    hf40.load_state_dict(hf.state_dict())
    x = torch.randn(1, 3, 40, 40)
    assert_same_as_hf(model, hf40, x)
    assert (hf_outputs(hf, x)[0] - hf_outputs(hf40, x)[0]).abs().max() > 1e-4   # the build size matters


@pytest.mark.parametrize("version", [1, 2])
def test_the_cli_imports_a_saved_swin_folder_exactly_and_the_app_loads_it(version, tmp_path, monkeypatch):
    """`python -m vitpe_core import DIR/model.safetensors`: the importer sends Swin keys (which
    hold `relative_position_bias_table`, as BEiT's do) to vitpe_core.swin, float32 kept; the
    app's checkpoint cache loads it as a Swin (the pages draw its windows: test_app_families)."""
    import subprocess
    import sys

    hf = hf_model(version, image_size=40, window_size=3)
    hf.save_pretrained(tmp_path / "hf")
    out = tmp_path / "ckpts" / "swin.safetensors"
    proc = subprocess.run([sys.executable, "-m", "vitpe_core", "import", str(tmp_path / "hf" / "model.safetensors"),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(v.dtype == torch.float32 for v in load_file(str(out)).values())
    ck = load_checkpoint(out)
    assert isinstance(ck.model, SwinTransformer)
    x = torch.randn(2, 3, 40, 40)
    with torch.no_grad():
        assert_rel(ck.model(x), hf(pixel_values=x).logits, "logits after the CLI import")

    monkeypatch.setenv("VITPE_CHECKPOINTS", str(out.parent))
    from pages.common import cache
    assert not hasattr(cache, "refuse_unshown")
    app_ck = cache._load_file(str(out), out.stat().st_mtime_ns)
    assert isinstance(app_ck.model, SwinTransformer) and app_ck.config == ck.config


# ----------------------------------------------------------------------------- what the pages show (swin.explore)
@pytest.mark.parametrize("version", [1, 2])
def test_the_app_trace_offset_kernel_and_stats_of_a_swin(version, tmp_path):
    from vitpe_core.swin import explore

    model, _ = import_swin(*saved(hf_model(version, image_size=40, window_size=3), tmp_path))
    image = torch.randn(3, 40, 40, generator=torch.Generator().manual_seed(7))
    tr = explore.trace_image(model, image)
    assert explore.is_swin_model(model) and explore.is_swin_model(model.cfg) and not explore.is_swin_model(None)
    with torch.no_grad():
        np.testing.assert_allclose(tr.logits, model(image[None])[0].numpy(), rtol=1e-6)
    assert tr.probs.sum() == pytest.approx(1.0) and tr.blocks[0]["attn"].dtype == torch.float32
    small = explore.trace_image(model, image, compact_above=0)           # a big model's trace: float16 attention
    assert all(t["attn"].dtype == torch.float16 for t in small.blocks) and small.nbytes < tr.nbytes
    for patch, layer in [((9, 9), 1), ((4, 8), 3)]:
        rows = window_rows(model, None, patch, layer, trace=list(tr.blocks))
        np.testing.assert_array_equal(rows.bias, window_rows(model, image, patch, layer).bias)
        half = window_rows(model, None, patch, layer, trace=list(small.blocks))
        np.testing.assert_allclose(half.attn, rows.attn, atol=1e-3)
        # the offset kernel is the bias row read by offset: query - key, centre = the query itself
        r, c, w = *rows.token, rows.window
        kernel = explore.offset_bias(rows, version, 1)
        for y, x in zip(*np.nonzero(rows.members)):
            assert kernel[r - y + w - 1, c - x + w - 1] == pytest.approx(rows.bias[1, y, x], rel=1e-5, abs=1e-6)
        stats = explore.window_attention_stats(tr, layer, None)
        assert 0 < stats["mean_distance"] <= np.hypot(w - 1, w - 1) * rows.scale and stats["entropy"] > 0
        assert "attends only inside its window" in explore.window_caption(rows, patch)
    # the picture is padded to what the stage's tokens cover: 5x5 tokens of 2x2 patches of 4 px cover the
    # 40-px input exactly; 10x10 patches cover 40 px of a 36-px input: 4 px more, 11 of 100 picture pixels
    rows = window_rows(model, None, (4, 8), 3, trace=list(tr.blocks))
    assert explore.pad_display(np.zeros((100, 100, 3), np.uint8), rows, (40, 40), 4).shape == (100, 100, 3)
    rows0 = window_rows(model, None, (4, 8), 0, trace=list(tr.blocks))
    assert explore.pad_display(np.zeros((100, 100, 3), np.uint8), rows0, (36, 36), 4).shape == (111, 111, 3)
    assert explore.stage_head(model.cfg, 0, 3) == (1, " Stage 0 has 2 heads: head 1 is shown for head 3.")
    assert explore.stage_head(model.cfg, 3, 3) == (3, "") and explore.stage_head(model.cfg, 0, None) == (None, "")
    assert explore.config_text(model.cfg).startswith(f"{'Swin' if version == 1 else 'Swin-V2'} · C 16 · depths 2-2")
    assert explore.no_table_text(model.cfg) == explore.NO_TABLE
    assert "optional absolute table" in explore.no_table_text(SwinConfig(absolute_pos_embed=True))
