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
    tr, model = _trace(encoding)
    return views.bias_parts(tr, model.pos_enc)


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
