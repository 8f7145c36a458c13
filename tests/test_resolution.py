"""The resolution sweep (vitpe_core/resolution.py) and its explorer on the compare page: the
sizes it offers, its values against the library calls it is built from, and the page in AppTest."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vitpe_core import analysis, figures, positional, resolution
from vitpe_core.config import ViTConfig
from vitpe_core.model import ViT
from vitpe_core.stress import Transform, transform_input


def _model(encoding: str, classes: int = 5) -> ViT:
    torch.manual_seed(0)
    cfg = ViTConfig(img_size=(32, 32), patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=classes,
                    encoding=encoding)
    return ViT(cfg).eval()


def test_default_sizes_span_half_to_twice_native_in_whole_patches_with_one_rectangle():
    sizes = resolution.default_sizes((32, 32), 4)
    assert sizes[0] == (16, 16) and sizes[-1] == (64, 64) and (32, 32) in sizes
    assert all(h % 4 == 0 and w % 4 == 0 for h, w in sizes)
    assert [s for s in sizes if s[0] != s[1]] == [(32, 48)]
    big = resolution.default_sizes((224, 224), 16)
    assert big[0] == (112, 112) and big[-1] == (448, 448) and (224, 336) in big


def test_sizes_are_checked():
    assert resolution.check_sizes([(16, 24), (16, 24), (8, 8)], 8) == [(8, 8), (16, 24)]
    with pytest.raises(ValueError, match="multiple of the patch size 8"):
        resolution.check_sizes([(20, 16)], 8)
    with pytest.raises(ValueError, match="at most"):
        resolution.check_sizes([(8 * 65, 8)], 8)


@pytest.mark.parametrize("encoding", ["ape", "rpb", "rope_axial", "none"])
def test_a_sweep_equals_the_library_calls_it_is_built_from(encoding):
    model = _model(encoding)
    images = torch.randn(3, 3, 32, 32)
    rows = resolution.sweep(model, images, [(16, 16), (48, 48), (32, 48)])
    assert [r.size for r in rows] == [(16, 16), (32, 32), (32, 48), (48, 48)]
    native = next(r for r in rows if r.native)
    assert native.size == (32, 32) and native.agreement == 1.0 and native.feature_cosine == pytest.approx(1.0)
    with torch.no_grad():
        ref = model(images)
        ref_feat = model.pool(model.forward_features(images))
    for r in rows:
        x = transform_input(images, Transform(r.size))
        grid = model.grid_for(r.size)
        assert r.grid == grid == (r.size[0] // 8, r.size[1] // 8)
        with torch.no_grad():
            logits = model(x)
            feat = model.pool(model.forward_features(x))
        assert r.agreement == pytest.approx(float((logits.argmax(-1) == ref.argmax(-1)).float().mean()))
        cos = torch.nn.functional.cosine_similarity(feat, ref_feat, dim=-1).mean()
        assert r.feature_cosine == pytest.approx(float(cos), abs=1e-6)
        table = analysis.position_table(model, grid)
        if table is None:
            assert r.structure is None
        else:
            sim = analysis.cosine_similarity(table)
            assert r.structure == pytest.approx(analysis.structure_score(sim, grid)["spearman"])
        kern = positional.position_kernels(model, x)
        if kern.kind == "none":
            assert r.relative_score is None
        else:
            assert r.relative_score == pytest.approx(float(positional.relative_score(kern.kernel, kern.grid).mean()))
        rec: list[dict] = []
        with torch.no_grad():
            model(x, trace=rec)
        attn = np.stack([t["attn"].float().numpy() for t in rec], 1)
        dist = positional.mean_attention_distance(attn, grid, model.num_prefix).mean(-1).mean(0)
        np.testing.assert_allclose(r.distance, dist, rtol=1e-5)


def test_without_a_head_agreement_is_none_and_the_verdict_reads_the_feature_cosine():
    rows = resolution.sweep(_model("ape", classes=0), torch.randn(3, 3, 32, 32), [(16, 16), (64, 64)])
    assert all(r.agreement is None for r in rows)
    below, above = resolution.lost_at(rows, threshold=2.0)     # every cosine is under 2: the nearest sizes
    assert below.size == (16, 16) and above.size == (64, 64)
    assert resolution.lost_at(rows, threshold=-2.0) == (None, None)


def test_the_figures_draw_every_series_and_size():
    rows = resolution.sweep(_model("ape"), torch.randn(3, 3, 32, 32), [(16, 16), (48, 48), (32, 48)])
    fig = figures.resolution_fig(rows, title="t")
    names = {t.name for t in fig.data}
    assert names == {name for _, name, _ in figures.RESOLUTION_SERIES}
    squares = [t for t in fig.data if t.mode == "lines+markers"]
    assert all(len(t.x) == 3 for t in squares)                                # 16, 32, 48: joined
    assert all(t.marker.symbol == "circle-open" and len(t.x) == 1 for t in fig.data if t.mode == "markers")
    dist = figures.distance_by_size_fig(rows, title="d")
    assert [t.name for t in dist.data] == ["16×16", "32×32 (native)", "32×48", "48×48"]
    assert resolution.rows_json(rows)[1]["native"] is True


def test_the_compare_page_sweeps_on_request_and_draws_the_chart(app_checkpoint_dir, monkeypatch, tmp_path):
    from streamlit.testing.v1 import AppTest
    from test_app import APP
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(app_checkpoint_dir))
    monkeypatch.setenv("VITPE_UPLOAD_DIR", str(tmp_path / "uploads"))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "compare"
    at.run()
    assert not at.exception
    assert "compare_res_chart" not in {c.key for c in at.get("plotly_chart")}      # nothing swept unasked
    at.selectbox(key="compare_res_model").select("ape").run()
    sizes = at.multiselect(key="compare_res_sizes_ape")
    sizes.set_value(["16×16", "32×32", "32×48"]).run()
    at.button(key="compare_res_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    charts = {c.key: c for c in at.get("plotly_chart")}
    assert {"compare_res_chart", "compare_res_distance"} <= set(charts)
    table = next(d.value for d in at.dataframe if "feature_cosine" in d.value.columns)
    assert len(table) == 3 and table["native"].tolist() == ["False", "True", "False"]


def test_the_notebook_sweeps_a_checkpoint_and_keeps_the_rows(app_checkpoint_dir):
    from vitpe_core import explore as vx
    m = vx.load(app_checkpoint_dir / "ape.safetensors")
    fig = vx.resolution(m, sizes=[(32, 32)], progress=False)
    rows = fig.layout.meta["rows"]
    native = tuple(m.config.img_size)
    assert [tuple(r["size"]) for r in rows] == sorted({(32, 32), native})
    assert next(r for r in rows if r["native"])["agreement"] == 1.0


def test_a_swin_is_swept_for_its_top1_and_features_only():
    from vitpe_core.swin import SwinConfig, SwinTransformer
    torch.manual_seed(0)
    cfg = SwinConfig(version=2, img_size=(32, 32), patch_size=4, in_chans=3, num_classes=4, embed_dim=16,
                     depths=(2, 2), num_heads=(2, 4), window_size=4, stage_windows=(4, 4), stage_shifts=(2, 0))
    model = SwinTransformer(cfg).eval()
    images = torch.randn(3, 3, 32, 32)
    rows = resolution.sweep(model, images, [(16, 16), (48, 32)])
    assert [r.size for r in rows] == [(16, 16), (32, 32), (48, 32)]
    for r in rows:
        assert r.structure is None and r.relative_score is None and r.distance == ()
        x = transform_input(images, Transform(r.size))
        with torch.no_grad():
            assert r.agreement == pytest.approx(float((model(x).argmax(-1) == model(images).argmax(-1)).float().mean()))
    assert next(r for r in rows if r.native).feature_cosine == pytest.approx(1.0)
    assert figures.resolution_fig(rows, title="t").data


def test_the_report_cli_adds_the_sweep_and_refuses_bad_sizes(app_checkpoint_dir, tmp_path, capsys):
    import json
    import re

    from vitpe_core.__main__ import main
    ckpt = str(app_checkpoint_dir / "ape.safetensors")
    out = tmp_path / "r.html"
    assert main(["report", ckpt, "--out", str(out), "--images", "cifar10-test-0000", "--sizes", "16,32x48"]) == 0
    html = out.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)[1])
    fig = data["position"]["resolution"]
    assert "At other input sizes" in html and 'data-fig="position.resolution"' in html
    assert {t["name"] for t in fig["data"]} >= {"top-1 as at native size", "feature cosine to native"}
    assert "--sizes 16,32x48" in html                                                  # the command that made it
    assert main(["report", ckpt, "--out", str(tmp_path / "bad.html"), "--sizes", "18"]) == 2   # not whole patches
    assert "multiple of the patch size" in capsys.readouterr().err and not (tmp_path / "bad.html").exists()


def test_a_sweep_resamples_the_tables_by_the_library_asked_for_and_leaves_the_model_alone():
    from vitpe_core.encodings.absolute import resample_abs_pos_embed
    model = _model("ape")
    assert resolution.rules_for(model) == ["model", "timm", "transformers"]
    assert resolution.rules_for(_model("rope_axial")) == ["model"]
    hf = resolution.with_rule(model, "transformers")
    pos = model.pos_enc.pos_embed
    want = resample_abs_pos_embed(pos, (6, 6), (4, 4), 1, antialias=False)[0]
    assert torch.equal(hf.pos_enc.table((6, 6)), want)
    assert torch.equal(model.pos_enc.table((6, 6)), resample_abs_pos_embed(pos, (6, 6), (4, 4), 1)[0])  # unchanged
    assert hf.blocks is model.blocks and hf.pos_enc is not model.pos_enc           # only the encoding is copied
    assert resolution.with_rule(model, "model") is model
    images = torch.randn(3, 3, 32, 32)
    own, other = (resolution.sweep(model, images, [(48, 48)], rule=r) for r in ("model", "transformers"))
    assert own[0] == other[0]                                                       # the native size: no resampling
    assert own[1].feature_cosine != other[1].feature_cosine
    rpb = _model("rpb_cls")
    assert resolution.with_rule(rpb, "timm").pos_enc.table_resize == "geometric" and rpb.pos_enc.table_resize == \
        "bilinear"
    with pytest.raises(ValueError, match="unknown rule"):
        resolution.with_rule(model, "keras")
