"""vitpe_core.views: what the pages draw, computed without Streamlit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vitpe_core import ViTConfig, analysis, build_model, views


def _trace(encoding: str, seed: int = 0) -> tuple[analysis.Trace, object]:
    torch.manual_seed(seed)
    model = build_model(ViTConfig(img_size=(24, 32), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=64,
                                  encoding=encoding)).eval()
    return analysis.trace_image(model, torch.randn(3, 24, 32)), model


def _parts(encoding: str) -> list[str]:
    return views.bias_parts(_trace(encoding)[0])


def test_bias_parts_per_encoding():
    assert _parts("ape") == []
    assert _parts("rpb") == ["row"]
    assert _parts("sape2") == ["sum", "x", "y"]
    assert _parts("sape2+ape") == ["sum", "x", "y"]        # the table adds no bias
    assert _parts("sape2+rpb") == ["sum", "x", "y", "bias"]


def test_sape2_bias_view_is_the_normalised_sum_of_its_parts():
    tr, _ = _trace("sape2+rpb")
    maps = analysis.patch_maps(tr, (2, 3))
    layer, head = 1, 0
    s = views.bias_view(tr, maps, "sape2+rpb", layer, head, "sum")
    x, y = maps["sape2.x"], maps["sape2.y"]
    np.testing.assert_allclose(s.full, x + y)
    raw = (x + y)[layer, head]
    np.testing.assert_allclose(s.shown, (raw - raw.min()) / (raw.max() - raw.min()), atol=1e-6)
    assert s.shown.shape == (6, 8) and s.per_layer.shape == (2, 6, 8) and s.per_head.shape == (2, 6, 8)
    assert s.scale_note == "0 = near, 1 = far"
    # the full bias adds rpb's row: it differs from SaPE²'s own sum
    full = views.bias_view(tr, maps, "sape2+rpb", layer, head, "bias")
    np.testing.assert_allclose(full.full, maps["bias"])
    assert not np.allclose(full.full, s.full)
    np.testing.assert_allclose(views.bias_view(tr, maps, "sape2+rpb", layer, None, "x").shown,
                               analysis.normalize01(x[layer].mean(0)), atol=1e-6)
    with pytest.raises(ValueError, match="unknown bias part"):
        views.bias_view(tr, maps, "sape2+rpb", layer, head, "z")


def test_attention_view_and_panel_view():
    tr, model = _trace("rpb")
    patch, layer = (1, 2), 1
    maps = analysis.patch_maps(tr, patch)
    P, i = tr.num_prefix, 1 * 8 + 2
    np.testing.assert_allclose(views.attention_view(maps, layer, 1), tr.attn[layer, 1, P + i, P:].reshape(6, 8))
    comp = analysis.positional_component(model, tr, patch)
    pv = views.panel_view(tr, comp, patch, layer, None)
    assert pv.label == "bias row" and pv.normalised
    assert pv.positional.min() == 0 and pv.positional.max() == pytest.approx(1)
    none_tr, none_model = _trace("none")
    pv = views.panel_view(none_tr, analysis.positional_component(none_model, none_tr, patch), patch, 0, 0)
    assert pv.label == "none" and not pv.positional.any()


def test_clamp_view_and_pick_stat():
    cfg = ViTConfig(img_size=(24, 32), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=64)
    assert views.clamp_view(cfg, (9, 9), 5, 7) == ((5, 7), 1, 1)
    assert views.clamp_view(cfg, (1, 2), 0, None) == ((1, 2), 0, None)
    stats = {"entropy": np.array([[1.0, 3.0], [5.0, 7.0]])}
    assert views.pick_stat(stats, "entropy", 1, None) == 6.0 and views.pick_stat(stats, "entropy", 0, 1) == 3.0


def test_top_class_and_curves():
    tr, _ = _trace("ape")
    top, p = views.top_class(tr)
    assert top == int(np.argmax(tr.logits)) and p == pytest.approx(tr.probs.max())
    metrics = {"a": {"curves": {"epoch": [1, 2], "test_top1": [10.0, 20.0]}},
               "b": {"curves": {"epoch": [1], "test_top1": [1.0, 2.0]}},          # inconsistent: left out
               "c": {"resolution": {"40": {"top1": 4.0}, "24": {"top1": 2.0}}}}
    assert views.accuracy_runs(metrics) == {"a": ([1, 2], [10.0, 20.0])}
    assert list(views.resolution_rows(metrics)["c"]) == ["24px", "40px"]


# ----------------------------------------------------------------------------- what the model sees of an image
def test_fit_notes_say_what_the_crop_leaves_out_and_when_an_image_is_enlarged():
    wide = views.fit_of((640, 427), (427, 427), (32, 32))
    assert wide.dropped == pytest.approx(1 - 427 / 640)
    assert "centred 427×427 px of this 640×427 px image" in wide.crop_note() and "left and right" in wide.crop_note()
    assert wide.upscale_note() is None
    tall = views.fit_of((300, 500), (300, 300), (32, 32))
    assert "top and bottom" in tall.crop_note()
    assert views.fit_of((32, 32), (32, 32), (32, 32)).crop_note() is None
    tiny = views.fit_of((1, 1), (1, 1), (32, 32))
    assert tiny.crop_note() is None and "enlarged 32×" in tiny.upscale_note()
    assert views.fit_of((20, 10), (20, 10), (16, 32)).crop_note() is None              # (H, W) = (16, 32): 2:1


def test_the_crop_note_of_a_shrunk_upload_counts_the_originals_pixels():
    """A 1400×1000 upload is shrunk to 1024×731 for the server; the model sees its centred square,
    which is about 1000×1000 px of the visitor's image, not 731×731 (issue 44, item 9)."""
    from pages.common.uploads import shrunk_text

    fit = views.fit_of((1024, 731), (731, 731), (32, 32))
    note = fit.crop_note(shrunk_text((1400, 1000), (1024, 731)), original=(1400, 1000))
    assert "centred 999×1000 px of your 1400×1000 image, shrunk to 1024×731 px" in note, note
    assert "29 %" in note                                                 # the fraction left out is the same


@pytest.mark.parametrize("size,img_size,crop_pct", [((640, 427), (32, 32), 1.0), ((300, 500), (32, 32), 1.0),
                                                    ((640, 427), (224, 224), 0.9), ((100, 100), (224, 224), 0.875),
                                                    ((50, 40), (16, 32), 1.0)])
def test_letterbox_lets_the_models_crop_keep_the_whole_image(size, img_size, crop_pct):
    from PIL import Image

    from vitpe_core import ViTConfig
    from vitpe_core.checkpoint import Checkpoint
    from vitpe_core.inputs import model_crop

    img = Image.new("RGB", size, (255, 0, 0))
    padded = views.letterbox(img, img_size, crop_pct)
    H, W = img_size
    assert abs(padded.width / padded.height - W / H) < 0.02
    cfg = ViTConfig(img_size=img_size, patch_size=8 if H % 8 == 0 and W % 8 == 0 else 4, dim=32, depth=1,
                    heads=1, mlp_dim=32)
    metrics = {"preprocess": {"mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": crop_pct}} if crop_pct < 1 else {}
    seen = model_crop(padded, Checkpoint(None, cfg, metrics, {}, "x"))
    red = (np.asarray(seen) == [255, 0, 0]).all(-1).sum()
    assert red >= size[0] * size[1] * 0.97                                            # (rounding at the edges)
    assert padded.getpixel((0, 0)) == views.PAD_FILL or size[0] / size[1] == W / H


def test_compare_words():
    assert views.hooks_text(("table", "bias")) == "adds a table, biases attention"
    assert views.hooks_text(("rotation",)) == "rotates q/k" and views.hooks_text(()) == "no position information"
    rows = [{"checkpoint": "ape", "encoding": "ape", "x": 1}, {"checkpoint": "mine", "encoding": "sape2+ape", "x": 2}]
    assert views.without_same_encoding(rows[:1]) == [{"checkpoint": "ape", "x": 1}]
    assert [r["encoding"] for r in views.without_same_encoding(rows)] == ["ape", "sape2+ape"]   # no dashes
    grouped = [{"checkpoint": "long/ape", "encoding": "ape"}, {"checkpoint": "none", "encoding": "none"}]
    assert views.without_same_encoding(grouped) == [{"checkpoint": "long/ape"}, {"checkpoint": "none"}]
    assert [r["encoding"] for r in views.without_same_encoding([*grouped, rows[1]])] == ["ape", "none", "sape2+ape"]
    assert "SaPE²(K)" in views.readout_text({}) and "SaPE²(Q)" in views.readout_text({"readout": "key"})


def test_bias_titles_are_short_and_the_caption_says_how_maps_are_scaled():
    tr, _ = _trace("sape2+rpb")
    maps = analysis.patch_maps(tr, (2, 3))
    short = {p: views.bias_short(views.bias_view(tr, maps, "sape2+rpb", 0, None, p)) for p in ("sum", "x", "bias")}
    assert short == {"sum": "SaPE² bias", "x": "SaPE² bias, x part", "bias": "sape2+rpb full bias"}
    cap = views.bias_caption(views.bias_view(tr, maps, "sape2+rpb", 0, None, "x"))
    assert "x part" in cap and "0 = near the query patch, 1 = far" in cap and "raw values" in cap
    tr, _ = _trace("rpb")
    bv = views.bias_view(tr, analysis.patch_maps(tr, (2, 3)), "rpb", 0, None, "row")
    assert views.bias_short(bv) == "rpb bias" and "0 = its smallest bias" in views.bias_caption(bv)


# ----------------------------------------------------------------------------- per-query kernels, encoding scale
def _kernel_arrays(kernel: np.ndarray, grid: tuple[int, int]) -> dict[str, np.ndarray]:
    from vitpe_core import positional
    return {"kind": np.array("bias"), "kernel": kernel, "offset_kernel": positional.offset_map(kernel, grid),
            "relative_score": positional.relative_score(kernel, grid)}


def test_a_query_row_of_a_stationary_kernel_is_the_offset_kernel_and_a_random_one_is_not():
    from vitpe_core.encodings.grid import relative_index

    grid, rng = (3, 5), np.random.default_rng(0)
    H, W = grid
    table = rng.normal(size=(2, 2, (2 * H - 1) * (2 * W - 1)))                    # (L, h, offsets)
    idx = relative_index(grid).numpy()                                          # (N, N)
    shift = rng.normal(size=(1, 1, H * W, 1)) * 5       # a constant per query: softmax ignores it
    stationary = _kernel_arrays(table[..., idx] + shift, grid)
    for patch in [(0, 0), (1, 3), (2, 4)]:
        row, fit = views.query_kernel_view(stationary, 1, 0, patch, grid)
        assert row.shape == grid and fit == pytest.approx(1.0, abs=1e-9)
        i = patch[0] * W + patch[1]
        np.testing.assert_allclose(row.ravel(), table[1, 0, idx[i]] + shift[0, 0, i, 0])
    row, _ = views.query_kernel_view(stationary, 5, None, (1, 1), grid)          # layer clamped, mean of heads
    np.testing.assert_allclose(row.ravel(), table[1][:, idx[6]].mean(0) + shift[0, 0, 6])
    noise = _kernel_arrays(rng.normal(size=(1, 2, H * W, H * W)), grid)
    assert max(views.query_kernel_view(noise, 0, h, (1, 2), grid)[1] for h in (0, 1)) < 0.6
    assert views.query_kernel_view({"kind": np.array("none")}, 0, None, (0, 0), grid) is None


def test_a_query_row_the_shared_offset_pattern_fits_worse_than_flat_gets_a_negative_fit():
    """Issue 31: "fit -2.02". The view passes `positional.query_fit` on as it is: an R² of the
    whole kernel's offset fit on this row, negative here, not clipped to a share."""
    from vitpe_core import positional
    from vitpe_core.encodings.grid import relative_index

    grid, rng = (3, 5), np.random.default_rng(3)
    H, W = grid
    kernel = rng.normal(size=(2 * H - 1) * (2 * W - 1))[relative_index(grid).numpy()]     # (N, N)
    kernel[1 * W + 2] = 0.01 * rng.normal(size=H * W)                                     # query (1, 2): flat
    arrays = _kernel_arrays(kernel[None, None], grid)
    row, fit = views.query_kernel_view(arrays, 0, 0, (1, 2), grid)
    assert fit == pytest.approx(positional.query_fit(kernel, grid, 1 * W + 2)) and fit < 0
    assert views.query_kernel_view(arrays, 0, 0, (0, 0), grid)[1] <= 1


def test_encoding_scale_series_per_quantity_and_layer_skipping_missing_epochs():
    curves = {"epoch": [1, 2, 3], "test_top1": [1, 2, 3], "enc_bias_ratio_L1": [None, 0.2, 0.3],
              "enc_bias_ratio_L0": [0.1, 0.2, 0.4], "enc_ex_norm_L0": [1.0, 1.5, 2.0], "enc_bias_ratio_Lx": [1, 1, 1]}
    s = views.encoding_scale_series(curves)
    assert list(s) == ["bias std / logit std", "‖E_x‖"]
    assert list(s["bias std / logit std"]) == ["L0", "L1"]
    assert s["bias std / logit std"]["L1"] == ([2, 3], [0.2, 0.3])
    assert views.encoding_scale_series({"epoch": [1], "test_top1": [5.0]}) == {}
    assert views.encoding_scale_series({"epoch": [1, 2], "enc_bias_ratio_L0": [None, None]}) == {}


def test_encoding_scale_series_reads_what_training_records():
    """The keys `analysis.encoding_scale` writes into the curves (train.py) are the ones read."""
    torch.manual_seed(0)
    model = build_model(ViTConfig(img_size=(16, 24), patch_size=4, dim=32, depth=3, heads=2, mlp_dim=64,
                                  encoding="sape2+ape")).eval()
    rec = analysis.encoding_scale(model, torch.randn(2, 3, 16, 24))
    curves = {"epoch": [1, 2], **{k: [v, v * 2] for k, v in rec.items()}}
    s = views.encoding_scale_series(curves)
    assert {q: list(v) for q, v in s.items()} == {q: ["L0", "L1", "L2"] for q in views.SCALE_SERIES.values()}
    assert s["bias std / logit std"]["L1"] == ([1, 2], [rec["enc_bias_ratio_L1"], 2 * rec["enc_bias_ratio_L1"]])


def test_top_k_names_the_most_probable_classes_first():
    probs = np.array([0.1, 0.5, 0.05, 0.3, 0.05])
    assert views.top_k(probs, ["a", "b", "c", "d"], k=3) == [("b", 0.5), ("d", 0.3), ("a", 0.1)]
    assert views.top_k(probs, ["a", "b"], k=2)[1] == ("class 3", 0.3)          # a class without a name
