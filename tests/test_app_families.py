"""Every page of the app renders an imported model of each Hugging Face family (BEiT with its
learned bias per layer and head, data2vec-vision, DINOv2 with registers, DINOv3's RoPE, CLIP,
SigLIP without a class token, Swin and Swin-V2 with shifted windows): tiny random models built by
transformers, imported with the CLI, every page run through app.py in AppTest."""
from __future__ import annotations

import json

import numpy as np
import pytest

from test_app import TITLES, _title_lines, chart_spec, ok, run, z_of
from vitpe_core import figures
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
    between layers (a table per layer) and is the same in every layer for a shared table. Its 4 x 4
    heatmap is ticked on whole patches (issue 44 item 11a)."""
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(family_dir))
    rows = {}
    for name in ("beit", "beit_shared"):
        for layer in (0, 1):
            at = ok(run({"page": "bias", "ckpt": name, "patch": "1,2", "layer": str(layer)},
                        {"bias_bias_tab": "Heatmap"}))
            spec = chart_spec(at, "bias_bias_map")
            rows[name, layer] = z_of(spec)
            assert rows[name, layer].shape == (4, 4) and np.isfinite(rows[name, layer]).all()
            for axis in ("xaxis", "yaxis"):                 # ticks 0, 1, 2, 3, not Plotly's -0.5, 0, 0.5, … (item 11a)
                ax = spec["layout"][axis]
                assert (ax.get("tickmode"), ax.get("tick0"), ax.get("dtick")) == ("linear", 0, 1), ax
    assert not np.allclose(rows["beit", 0], rows["beit", 1])
    np.testing.assert_allclose(rows["beit_shared", 0], rows["beit_shared", 1])


@pytest.mark.slow
@pytest.mark.parametrize("name, said", [("beit", "Prediction:"), ("dinov3", "a backbone: no prediction"),
                                        ("siglip", "a backbone: no prediction")])
def test_the_stress_test_runs_on_imported_families_with_and_without_a_head(family_dir, monkeypatch, name, said):
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(family_dir))
    at = ok(run({"page": "bias", "ckpt": name, "patch": "1,1", "shift": "0,8"}))     # one patch to the right
    assert any("→ (1, 2)" in m.value and said in m.value for m in at.markdown), [m.value for m in at.markdown]


# ----------------------------------------------------------------------------- Swin and Swin-V2
# Two stages of two blocks, every odd block shifted: 8x8 then 4x4 tokens in 2x2 windows (Swin);
# 10x10 (padded to 12x12) then 5x5 (padded to 6x6) in 3x3 windows (Swin-V2).
SWINS = {"swin": (1, dict(image_size=32, window_size=2)), "swinv2": (2, dict(image_size=40, window_size=3))}
IMAGE = "cifar10-test-0001"


@pytest.fixture(scope="module")
def swin_dir(tmp_path_factory):
    """One imported Swin and one Swin-V2 (transformers' tiny random models), through the CLI."""
    from test_swin import hf_model
    from vitpe_core.__main__ import main
    root = tmp_path_factory.mktemp("swins")
    for name, (version, overrides) in SWINS.items():
        hf_model(version, **overrides).save_pretrained(root / "src" / name)
        assert main(["import", str(root / "src" / name / "model.safetensors"),
                     "--out", str(root / "ckpts" / f"{name}.safetensors")]) == 0
    return root / "ckpts"


def heatmap_z(spec: dict) -> np.ndarray:
    """The heatmap's z of a window map (drawn over the image: the image is the first trace)."""
    [heat] = [d for d in spec["data"] if d["type"] == "heatmap"]
    return z_of({"data": [heat]})


def swin_rows(path, patch, layer):
    """`window_rows` of the app's image as the app feeds it to the checkpoint's model."""
    from vitpe_core.checkpoint import load_checkpoint
    from vitpe_core.gallery import gallery_image
    from vitpe_core.inputs import checkpoint_input
    from vitpe_core.swin.windows import window_rows
    ck = load_checkpoint(path)
    return ck, window_rows(ck.model, checkpoint_input(gallery_image(IMAGE), ck), patch, layer)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SWINS))
def test_every_page_renders_an_imported_swin(swin_dir, monkeypatch, name):
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(swin_dir))
    for page in PAGES:
        at = ok(run({"page": page, "ckpt": name, "image": IMAGE, "layer": "3", "patch": "7,6"}))
        assert at.title[0].value == TITLES[page]
        assert not at.error, (page, [e.value for e in at.error])
        captions = " ".join(c.value for c in at.caption)
        for chart in at.get("plotly_chart"):                      # titles fit a phone (test_app's rule)
            lines = _title_lines(json.loads(chart.proto.spec))
            assert max(map(len, lines)) <= figures.TITLE_MAX_CHARS, (page, lines)
        if page == "bias":
            assert "attends only inside its window" in captions and "block 3 (stage 1, block 1), shifted" in captions
            assert "Prediction:" in " ".join(m.value for m in at.markdown)
            assert "not drawn for Swin" in captions and "No HTML report for a Swin" in captions
        elif page == "compare":
            for n in SWINS:                     # its offset bias and its window's attention row
                assert chart_spec(at, f"compare_swin_offsets_{n}") and chart_spec(at, f"compare_fig_{n}")
            table = at.dataframe[0].value
            assert np.isfinite(table.filter(like="attn dist").to_numpy(float)).all()
            assert "Not analysed here: swin, swinv2" in captions
        elif page == "similarity":
            assert any("has no absolute position table" in i.value for i in at.info)
        else:
            options = at.dataframe[0].value["options"]
            assert options["swin"].startswith("Swin · C 16 · depths 2-2 · heads 2-4 · window 2")
            assert options["swinv2"].startswith("Swin-V2 · C 16 · depths 2-2 · heads 2-4 · window 3")


@pytest.mark.slow
@pytest.mark.parametrize("name, patch, layer, head", [
    ("swin", (7, 6), 1, None),     # stage 0, shifted: the window wraps at the grid's edge
    ("swin", (5, 2), 3, "1"),      # the last block: stage 1, shifted, a 2x2-patch token
    ("swinv2", (9, 9), 1, "0"),    # the bottom-right corner window of the shifted grid
    ("swinv2", (4, 8), 2, None),   # stage 1, not shifted, a padded grid
    ("swinv2", (3, 3), 0, "3"),    # stage 0 has 2 heads: head 3 shows its last
])
def test_the_swin_bias_explorer_draws_the_window_rows_of_the_clicked_patch(swin_dir, monkeypatch, name, patch,
                                                                           layer, head):
    """The bias and attention maps the page draws are `window_rows`' for that patch, block and
    head (NaN outside the window, the window box where the mask says); the block before gives
    other values, so a page that drew another block or window would fail here."""
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(swin_dir))
    params = {"page": "bias", "ckpt": name, "image": IMAGE, "patch": f"{patch[0]},{patch[1]}", "layer": str(layer)}
    at = ok(run({**params, **({"head": head} if head else {})}))
    ck, rows = swin_rows(swin_dir / f"{name}.safetensors", patch, layer)
    shown = None if head is None else min(int(head), ck.config.num_heads[rows.stage] - 1)
    bias, attn = (heatmap_z(chart_spec(at, f"bias_swin_{k}")) for k in ("bias", "attn"))
    np.testing.assert_allclose(bias, rows.shown("bias", shown), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(attn, rows.shown("attn", shown), rtol=1e-4, atol=1e-6)
    assert (np.isfinite(bias) == rows.members).all() and np.isfinite(bias[rows.token])
    spec = chart_spec(at, "bias_swin_bias")
    box = [s for s in spec["layout"]["shapes"] if s.get("line", {}).get("dash") == "dash"][0]
    ph = spec["data"][1]["dy"]                                   # pixels per stage token
    r0, c0, r1, c1 = rows.window_box
    assert (box["y0"], box["x0"], box["y1"], box["x1"]) == pytest.approx((r0 * ph, c0 * ph, r1 * ph, c1 * ph))
    if shown != (None if head is None else int(head)):
        assert any(f"has {ck.config.num_heads[rows.stage]} heads" in c.value for c in at.caption)
    _, before = swin_rows(swin_dir / f"{name}.safetensors", patch, layer - 1 if layer else layer + 1)
    assert not np.array_equal(before.shown("bias", shown), rows.shown("bias", shown), equal_nan=True)


@pytest.mark.slow
def test_the_swin_layer_slider_reaches_the_last_block_of_the_last_stage(swin_dir, monkeypatch):
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(swin_dir))
    at = ok(run({"page": "bias", "ckpt": "swinv2", "image": IMAGE, "patch": "9,0"}))
    slider = at.select_slider(key="bias_layer")
    assert list(map(int, slider.options)) == [0, 1, 2, 3]                    # depths (2, 2): every block
    at = ok(slider.set_value(3).run())
    assert at.session_state["layer"] == 3
    assert any("Swin block 3 (stage 1, block 1), shifted by 1" in c.value for c in at.caption)
    _, rows = swin_rows(swin_dir / "swinv2.safetensors", (9, 0), 3)
    np.testing.assert_allclose(heatmap_z(chart_spec(at, "bias_swin_bias")), rows.shown("bias"), rtol=1e-5, atol=1e-6)


def _sweep_on_compare(folder, monkeypatch, name: str) -> list[dict]:
    """The compare page's resolution explorer on `name` at its smallest and largest sizes and the native one:
    the table's rows (AppTest, as a visitor presses "Sweep these sizes")."""
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(folder))
    at = ok(run({"page": "compare", "ckpt": name}))
    at = ok(at.selectbox(key="compare_res_model").select(name).run())
    sizes = at.multiselect(key=f"compare_res_sizes_{name}")
    at = ok(sizes.set_value([sizes.value[0], sizes.value[-1]]).run())       # 0.5x and 2x (never the native)
    at = ok(at.button(key="compare_res_go").click().run())
    assert not at.error, [e.value for e in at.error]
    assert "compare_res_chart" in {c.key for c in at.get("plotly_chart")}
    table = next(d.value for d in at.dataframe if "feature_cosine" in d.value.columns)
    return table.reset_index().to_dict("records")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["beit", "dinov2_reg", "dinov3"])
def test_the_resolution_explorer_sweeps_an_imported_beit_table_vit_and_rope_model(family_dir, monkeypatch, name):
    """Issue 46: the explorer renders for an imported BEiT (relative bias), a table ViT (DINOv2 with
    registers) and a RoPE model (DINOv3): two sizes and the native one, the native row agreeing
    with itself (or, headless, a feature cosine of 1)."""
    rows = _sweep_on_compare(family_dir, monkeypatch, name)
    native = [r for r in rows if r["native"] == "True"]
    assert len(rows) == 3 and len(native) == 1
    assert native[0]["feature_cosine"] == "1.0" and native[0]["agreement"] == ("—" if name == "dinov3" else "1.0")


@pytest.mark.slow
def test_the_resolution_explorer_sweeps_an_imported_swin_v2(swin_dir, monkeypatch):
    rows = _sweep_on_compare(swin_dir, monkeypatch, "swinv2")
    assert len(rows) == 3 and all(r["structure"] == "—" and r["distance"] == "[]" for r in rows)
