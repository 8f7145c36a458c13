"""The self-contained HTML report (vitpe_core/html_report) and the notebook façade
(vitpe_core/explore): what the page embeds, decoded back from the written file, against the
app's own views; the CLI's file and its size budget; the façade's figures.

The page's JavaScript is checked in a real browser by tests/test_browser_report.py; here the
embedded data is read as that script reads it (`page_maps` mirrors report.js)."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitpe_core import analysis, explore, figures, positional, views
from vitpe_core.checkpoint import load_checkpoint
from vitpe_core.html_report import build_report, render_html, write_report
from vitpe_core.html_report.encode import compact_figure, pack, pack_ints, revive, script_json, unpack
from vitpe_core.html_report.explorer import ReportImage, layer_order
from vitpe_core.inputs import checkpoint_input

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "checkpoints"
COMPACT_BUDGET = 5_000_000       # bytes: a shipped compact checkpoint with 4 images


# ----------------------------------------------------------------------------- reading a page back
def embedded_data(html: str) -> dict:
    """The page's data as report.js reads it: the JSON of `<script id="report-data">`."""
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    assert m is not None
    return json.loads(m.group(1))


def page_rows(ex: dict, blobs: list[np.ndarray], image: int, component: str, layer: int, patch, head) -> np.ndarray:
    """report.js's `row`: the component's (N,) row of `patch` at `layer`, one head or their mean."""
    H, W = ex["grid"]
    b = blobs[ex["images"][image]["components"][component][layer]]                # (k, N, N)
    rows = b[:, patch[0] * W + patch[1]]                                          # (k, N)
    return (rows.mean(0) if head is None else rows[head]).reshape(H, W)


def page_bias(ex: dict, blobs, image: int, part: str, layer: int, patch, head) -> np.ndarray:
    """report.js's `biasRow`: the part's components summed, then normalised to 0-1."""
    m = sum(page_rows(ex, blobs, image, c, layer, patch, head) for c in ex["part_components"][part])
    return analysis.normalize01(m)


@pytest.fixture(scope="module")
def tiny(app_checkpoint_dir):
    """Tiny random-weight checkpoints (2 layers, 2 heads, 8x8 grid): name -> path."""
    return {p.stem: p for p in Path(app_checkpoint_dir).glob("*.safetensors")}


def two_images() -> list[ReportImage]:
    from vitpe_core.gallery import gallery_image
    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8))
    return [ReportImage("cat", "cifar10-test-0000", gallery_image("cifar10-test-0000")),
            ReportImage("noise </script><b>", "noise", noise)]


@pytest.fixture(scope="module")
def sape_page(tiny, tmp_path_factory):
    """The tiny sape2+ape model's report with two images, written and read back."""
    path = tiny["sape2+ape"]
    out = tmp_path_factory.mktemp("report") / "sape.html"
    ckpt = load_checkpoint(path)
    write_report(ckpt, out, images=two_images(), path=path, command="pytest")
    html = out.read_text(encoding="utf-8")
    data = embedded_data(html)
    return ckpt, html, data, [unpack(b) for b in data["explorer"]["blobs"]]


# ----------------------------------------------------------------------------- packing
def test_pack_keeps_float16_values_nan_and_shape():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(3, 5, 7)).astype(np.float32) * 10
    a[0, 0, 0] = np.nan
    b = unpack(pack(a))
    assert b.shape == a.shape and np.isnan(b[0, 0, 0])
    np.testing.assert_array_equal(b[1:], a[1:].astype(np.float16).astype(np.float32))


def test_pack_ints_uses_the_smallest_type_and_round_trips():
    for values, code in (([0, 255], "u1"), ([-3, 100], "i1"), ([0, 70_000], "i4"), ([0, 3_000_000_000], "u4")):
        p = pack_ints(np.array(values * 3, dtype=np.int64).reshape(2, 3))
        assert p["dtype"] == code
        np.testing.assert_array_equal(unpack(p), np.array(values * 3).reshape(2, 3))


def test_a_compacted_figure_revives_to_the_same_map():
    m = np.random.default_rng(2).random((6, 9))
    fig = figures.patch_map_fig(m, title="t", colorbar_title="c", patch=(1, 2))
    spec = compact_figure(json.loads(fig.to_json()))
    assert "bdata" not in json.dumps(spec) and "vitpe_packed" in json.dumps(spec)
    z = np.array(revive(spec)["data"][0]["z"])
    np.testing.assert_allclose(z, m, atol=1e-3)
    assert not np.allclose(z, m.T[:6, :6].repeat(2, 1)[:, :9], atol=1e-3)   # the test could tell a wrong map


def test_script_json_cannot_end_its_script_element():
    text = script_json({"label": "</script><script>alert(1)</script> & <!--"})
    assert "</" not in text and "<!--" not in text
    assert json.loads(text)["label"].startswith("</script>")


def test_layer_order_starts_at_the_ends_and_covers_every_layer():
    assert layer_order(12)[:3] == [0, 11, 6] and sorted(layer_order(12)) == list(range(12))
    assert layer_order(1) == [0]


# ----------------------------------------------------------------------------- what the page embeds
@pytest.mark.parametrize("part", ["sum", "x", "y"])
@pytest.mark.parametrize("layer,head", [(0, None), (1, 0), (1, 1)])
def test_embedded_bias_rows_are_the_bias_explorers(sape_page, part, layer, head):
    ckpt, _, data, blobs = sape_page
    ex = data["explorer"]
    assert set(ex["parts"]) == {"sum", "x", "y"}
    for i, image in enumerate(two_images()):
        tr = analysis.trace_image(ckpt.model, checkpoint_input(image.image, ckpt))
        for patch in [(2, 5), (7, 0)]:
            want = views.bias_view(tr, analysis.patch_maps(tr, patch), ckpt.config.encoding, layer, head, part).shown
            got = page_bias(ex, blobs, i, part, layer, patch, head)
            np.testing.assert_allclose(got, want, atol=5e-3)
            other = views.bias_view(tr, analysis.patch_maps(tr, (0, 0)), ckpt.config.encoding, layer, head, part)
            assert np.abs(got - other.shown).max() > 0.05     # a row of another patch would be caught


def test_embedded_attention_rollout_and_prefix_share(sape_page):
    ckpt, _, data, blobs = sape_page
    ex = data["explorer"]
    image = two_images()[1]
    tr = analysis.trace_image(ckpt.model, checkpoint_input(image.image, ckpt))
    patch, P = (3, 6), tr.num_prefix
    maps = analysis.patch_maps(tr, patch)
    for layer, head in [(0, None), (1, 1)]:
        np.testing.assert_allclose(page_rows(ex, blobs, 1, "attn", layer, patch, head),
                                   views.attention_view(maps, layer, head), atol=2e-3)
    for fusion in ("mean", "max"):
        rolled = blobs[ex["images"][1]["rollout"][fusion]]                        # (T, T)
        want, share = positional.rollout_map(tr.attn, tr.grid, P, P + analysis.patch_index(patch, tr.grid), fusion)
        row = rolled[P + analysis.patch_index(patch, tr.grid)]
        np.testing.assert_allclose(row[P:].reshape(tr.grid), want, atol=2e-3)
        assert abs(row[:P].sum() - share) < 2e-3
    prefix = blobs[ex["images"][1]["prefix_share"]]                                # (L, h, N)
    assert abs(prefix[1, 0, analysis.patch_index(patch, tr.grid)] - views.prefix_share(tr, patch, 1, 0)["CLS"]) < 2e-3


def test_the_page_holds_every_section_and_nothing_from_the_network(sape_page, tiny):
    ckpt, html, data, _ = sape_page
    for section in ("card", "similarity", "position", "explorer", "footer"):
        assert f'<section id="{section}">' in html or f'<footer id="{section}">' in html
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', html), "the page must fetch nothing"
    assert html.count('id="plotly-gz"') == 1
    for path in re.findall(r'data-fig="([\w.]+)"', html):          # every chart's spec is in the data
        node = data
        for key in path.split("."):
            node = node[key]
        assert node["data"], path
    assert data["similarity"]["film"]["frames"]                     # the tiny checkpoints record 2 epochs
    assert "noise &lt;/script&gt;&lt;b&gt;" in html and "noise </script><b>" not in html
    sha = hashlib.sha256(tiny["sape2+ape"].read_bytes()).hexdigest()
    assert f"<code id='content-hash'>{sha}</code>" in html
    assert re.search(r"vitpe commit <code>([0-9a-f]{40}|not in a git checkout)</code>", html)


def test_layers_not_chosen_keep_only_their_head_mean(tiny):
    ckpt = load_checkpoint(tiny["rpb"])
    rep = build_report(ckpt, images=two_images(), layers=[1], command="pytest")
    ex = rep["explorer"]
    blobs = [unpack(b) for b in ex["blobs"]]
    full = [b for b in ex["images"][0]["components"]["bias"]]
    assert blobs[full[0]].shape[0] == 1 and blobs[full[1]].shape[0] == ckpt.config.heads
    tr = analysis.trace_image(ckpt.model, checkpoint_input(two_images()[0].image, ckpt))
    want = views.bias_view(tr, analysis.patch_maps(tr, (4, 4)), "rpb", 0, None, "row").shown
    np.testing.assert_allclose(page_bias(ex, blobs, 0, "row", 0, (4, 4), None), want, atol=5e-3)
    # rpb's bias does not depend on the image: stored once for both
    assert ex["images"][0]["components"]["bias"] == ex["images"][1]["components"]["bias"]
    assert ex["images"][0]["components"]["attn"] != ex["images"][1]["components"]["attn"]


def test_the_byte_budget_chooses_fewer_layers(tiny):
    ckpt = load_checkpoint(tiny["ape"])
    roomy = build_report(ckpt, images=two_images(), command="pytest")["explorer"]["heads_layers"]
    tight = build_report(ckpt, images=two_images(), command="pytest", max_bytes=1_000_000)["explorer"]["heads_layers"]
    assert roomy == [0, 1] and tight == []


def test_the_page_stays_within_the_bytes_it_was_given(tiny):
    """Between the page with no layer's heads and the page with all, the layers chosen for a
    budget keep the written page within it."""
    ckpt, images = load_checkpoint(tiny["sape2+ape"]), two_images()
    none = len(render_html(build_report(ckpt, images=images, layers=[])))
    every = len(render_html(build_report(ckpt, images=images, layers=[0, 1])))
    assert every > none + 20_000
    for budget in (none + 120_000, (none + every) // 2 + 100_000):
        rep = build_report(ckpt, images=images, max_bytes=budget)
        assert len(render_html(rep)) <= budget, (budget, rep["explorer"]["heads_layers"])
    assert build_report(ckpt, images=images, max_bytes=every + 100_000)["explorer"]["heads_layers"] == [0, 1]


def test_a_model_without_a_bias_or_table(tiny):
    ckpt = load_checkpoint(tiny["none"])
    rep = build_report(ckpt, images=two_images()[:1], command="pytest")
    assert rep["similarity"] is None and rep["explorer"]["parts"] == {} and "bias" not in rep["explorer"]["figures"]
    html = render_html(rep)
    assert "no absolute position table" in html and "adds no attention bias" in html


def test_report_refuses_layers_outside_the_model(tiny):
    with pytest.raises(ValueError, match="layers 0-1"):
        build_report(load_checkpoint(tiny["ape"]), images=two_images()[:1], layers=[2])


# ----------------------------------------------------------------------------- the CLI
@pytest.mark.slow
def test_cli_writes_a_shipped_compact_report_under_its_budget(tmp_path, capsys):
    from vitpe_core.__main__ import main
    name = "sape2+ape"            # the shipped model with the most embedded arrays (x, y and attention)
    if not (SHIPPED / f"{name}.safetensors").is_file():
        pytest.skip("the shipped checkpoints are not in this checkout")
    out = tmp_path / "report.html"
    assert main(["report", name, "--out", str(out)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    size = out.stat().st_size
    assert line["bytes"] == size and 1_000_000 < size <= COMPACT_BUDGET, size
    data = embedded_data(out.read_text(encoding="utf-8"))
    ex = data["explorer"]
    assert len(ex["images"]) == 4 and ex["heads_layers"] == list(range(6))
    assert "python -m vitpe_core report sape2+ape --out" in out.read_text(encoding="utf-8")


def test_cli_refuses_a_bad_layer_list(tmp_path, capsys, tiny):
    from vitpe_core.__main__ import main
    with pytest.raises(SystemExit):
        main(["report", str(tiny["ape"]), "--out", str(tmp_path / "r.html"), "--layers", "a,b"])
    assert main(["report", str(tiny["ape"]), "--out", str(tmp_path / "r.html"), "--layers", "5"]) == 2
    assert "layers 0-1" in capsys.readouterr().err and not (tmp_path / "r.html").exists()


# ----------------------------------------------------------------------------- the notebook façade
def test_explore_loads_files_and_foreign_weights(tiny, tmp_path):
    from safetensors.torch import save_file
    m = explore.load(str(tiny["ape"]))
    assert m.config.encoding == "ape" and m.content_hash == hashlib.sha256(tiny["ape"].read_bytes()).hexdigest()
    weights = tmp_path / "timm_vit.safetensors"                    # timm's key layout, no vitpe metadata
    sd = {k.replace("pos_enc.", ""): v.contiguous() for k, v in m.ckpt.model.state_dict().items()}
    save_file(sd, str(weights))
    foreign = explore.load(str(weights))
    assert foreign.ckpt.metrics.get("imported") and foreign.config.grid == m.config.grid
    assert foreign.path is None and foreign.content_hash == hashlib.sha256(weights.read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="neither a shipped checkpoint"):
        explore.load(str(tmp_path / "missing.safetensors"))


def test_explore_figures_are_the_apps_views(tiny):
    m = explore.load(str(tiny["sape2+ape"]))
    tr = analysis.trace_image(m.ckpt.model, checkpoint_input(explore.as_image("cifar10-test-0001").image, m.ckpt))
    fig = explore.bias(m, "cifar10-test-0001", patch=(3, 4), layer=1, head=0, part="x")
    want = views.bias_view(tr, analysis.patch_maps(tr, (3, 4)), "sape2+ape", 1, 0, "x").shown
    np.testing.assert_allclose(np.asarray(fig.data[1].z), want, atol=1e-6)
    rolled = explore.rollout(m, "cifar10-test-0001", patch=(3, 4))
    np.testing.assert_allclose(np.asarray(rolled.data[1].z), positional.rollout_map(
        tr.attn, tr.grid, 1, 1 + analysis.patch_index((3, 4), tr.grid))[0], atol=1e-6)
    for fig in (explore.similarity(m), explore.kernels(m), explore.query_kernels(m, (0, 0)),
                explore.attention_distance(m), explore.attention(m, patch=(1, 1))):
        assert fig.data and fig.layout.title.text
    with pytest.raises(ValueError, match="layers 0-1"):
        explore.bias(m, layer=3)
    with pytest.raises(ValueError, match="no position table"):
        explore.similarity(explore.load(str(tiny["rpb"])))


def test_explore_report_writes_the_file(tiny, tmp_path):
    m = explore.load(str(tiny["rope_mixed"]))
    out = explore.report(m, tmp_path / "rope.html", images=["cifar10-test-0003"])
    data = embedded_data(out.read_text(encoding="utf-8"))
    assert [im["key"] for im in data["explorer"]["images"]] == ["cifar10-test-0003"]
    assert "explore.report" in out.read_text(encoding="utf-8")
