"""Every page of the app renders an imported model of each Hugging Face family (BEiT with its
learned bias per layer and head, data2vec-vision, DINOv2 with registers, DINOv3's RoPE, CLIP,
SigLIP without a class token): tiny random models built by transformers, imported with the CLI,
every page run through app.py in AppTest."""
from __future__ import annotations

import numpy as np
import pytest

from test_app import TITLES, chart_spec, ok, run, z_of
from test_importers_families import build, save
from vitpe_core.viewstate import PAGES

pytest.importorskip("transformers", reason="transformers is a test dependency (requirements-dev.txt)")

FAMILIES = {"beit": "beit_layer_bias_mean", "beit_shared": "beit_shared_bias_ape_cls",
            "data2vec": "data2vec_vision", "dinov2_reg": "dinov2_registers_classifier",
            "dinov3": "dinov3", "clip": "clip_vision", "siglip": "siglip_vision_map"}


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory):
    """One imported checkpoint per family (named as FAMILIES' keys), through the CLI."""
    from vitpe_core.__main__ import main
    root = tmp_path_factory.mktemp("families")
    for name, case in FAMILIES.items():
        src = save(build(case), root / "src" / case)
        assert main(["import", str(src), "--out", str(root / "ckpts" / f"{name}.safetensors")]) == 0
    return root / "ckpts"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_page_renders_each_imported_family(family_dir, monkeypatch, name):
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(family_dir))
    for page in PAGES:
        at = ok(run({"page": page, "ckpt": name}))
        assert at.title[0].value == TITLES[page]
        assert not at.error, (page, [e.value for e in at.error])
        if page == "bias":
            headless = name in ("dinov3", "clip", "siglip")
            assert any("No classification head" in c.value for c in at.caption) == headless


@pytest.mark.slow
def test_the_bias_explorer_draws_beits_learned_bias_row_per_layer(family_dir, monkeypatch):
    """BEiT's bias row is the learned table's entries for the clicked patch's offsets: it differs
    between layers (a table per layer) and is the same in every layer for a shared table."""
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(family_dir))
    rows = {}
    for name in ("beit", "beit_shared"):
        for layer in (0, 1):
            at = ok(run({"page": "bias", "ckpt": name, "patch": "1,2", "layer": str(layer)},
                        {"bias_bias_tab": "Heatmap"}))
            rows[name, layer] = z_of(chart_spec(at, "bias_bias_map"))
            assert rows[name, layer].shape == (4, 4) and np.isfinite(rows[name, layer]).all()
    assert not np.allclose(rows["beit", 0], rows["beit", 1])
    np.testing.assert_allclose(rows["beit_shared", 0], rows["beit_shared", 1])


@pytest.mark.slow
@pytest.mark.parametrize("name, said", [("beit", "Prediction:"), ("dinov3", "a backbone: no prediction"),
                                        ("siglip", "a backbone: no prediction")])
def test_the_stress_test_runs_on_imported_families_with_and_without_a_head(family_dir, monkeypatch, name, said):
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(family_dir))
    at = ok(run({"page": "bias", "ckpt": name, "patch": "1,1", "shift": "0,8"}))     # one patch to the right
    assert any("→ (1, 2)" in m.value and said in m.value for m in at.markdown), [m.value for m in at.markdown]
