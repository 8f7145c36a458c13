"""vitpe_core.stress on cases with known answers: shifting and resizing the input, following a
patch with its content, and the live "bias shift err" (the README's number, for one image)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vitpe_core import ViTConfig, analysis, build_model
from vitpe_core import stress as S
from vitpe_core.evaluate import bias_shift_error, shift_images

NATIVE, P = (16, 20), 4          # a non-square 4 x 5 grid
GRID = (4, 5)


def _model(encoding: str, depth: int = 2, **cfg) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ViTConfig(img_size=NATIVE, patch_size=P, dim=32, depth=depth, heads=2, mlp_dim=32,
                                 encoding=encoding, **cfg)).eval()


def _image() -> torch.Tensor:
    return torch.randn(3, *NATIVE, generator=torch.Generator().manual_seed(1))


def _traces(model, tf: S.Transform, x: torch.Tensor | None = None):
    x = _image() if x is None else x
    return analysis.trace_image(model, x), analysis.trace_image(model, S.transform_input(x, tf))


# ----------------------------------------------------------------------------- the input
@pytest.mark.parametrize("shift", [(4, 0), (0, -8), (3, 5), (-2, 1)])
def test_zero_fill_shift_is_the_evaluation_shift(shift):
    x = _image()
    np.testing.assert_array_equal(S.transform_input(x, S.Transform(NATIVE, shift)), shift_images(x[None], shift)[0])


def test_reflect_fill_mirrors_the_edge_and_native_size_is_untouched():
    x = _image()
    out = S.transform_input(x, S.Transform(NATIVE, (0, 2), "reflect"))
    np.testing.assert_array_equal(out[..., 2:], x[..., :-2])
    np.testing.assert_array_equal(out[..., 0], x[..., 2])                  # reflect: ... x2 x1 | x0 x1 x2
    np.testing.assert_array_equal(out[..., 1], x[..., 1])
    assert S.transform_input(x, S.Transform(NATIVE)) is x                  # the default view: the same tensor
    assert S.transform_input(x, S.Transform((24, 28))).shape == (3, 24, 28)
    with pytest.raises(ValueError, match="fill"):
        S.Transform(NATIVE, (1, 0), "wrap")


def test_controls_offer_the_cifar_and_imported_ranges():
    assert S.size_options((32, 32), 4) == [(s, s) for s in range(24, 49, 4)]
    sizes = S.size_options((224, 224), 16)
    assert sizes[0] == (176, 176) and sizes[-1] == (336, 336) and (224, 224) in sizes
    assert S.size_options(NATIVE, P) == [(12, 16), (16, 20), (20, 24), (24, 32)]    # width in proportion
    assert S.shift_options(4) == list(range(-8, 9)) and S.shift_options(16)[:2] == [-32, -28]
    assert S.shift_label(4, 4) == "+4 px (1 patch)" and S.shift_label(-2, 4) == "-2 px (½ patch)"
    assert S.shift_label(6, 4) == "+6 px (1½ patches)" and S.shift_label(0, 4) == "0"


# ----------------------------------------------------------------------------- following the content
def test_the_patch_follows_the_content():
    follow = lambda tf, patch=(1, 2): S.follow_patch(patch, NATIVE, tf, P)
    assert follow(S.Transform(NATIVE, (4, -8))) == ((2, 0), True)          # whole patches: the index moves by them
    assert follow(S.Transform(NATIVE, (3, 1))) == ((2, 2), True)           # sub-patch: the nearest patch
    assert follow(S.Transform(NATIVE, (2, -2))) == ((1, 2), True)          # a half patch: it stays
    assert follow(S.Transform(NATIVE, (0, 0))) == ((1, 2), True)
    assert follow(S.Transform((24, 32))) == ((2, 4), True)                 # resized 1.5 x 1.6: scaled coordinates
    assert follow(S.Transform((12, 16)), (3, 4)) == ((2, 3), True)
    assert follow(S.Transform(NATIVE, (0, 12))) == ((1, 4), False)         # pushed out of the image: the edge


@pytest.mark.parametrize("shift", [(4, 0), (-4, 8), (3, -1), (2, 2), (-6, -10)])
def test_source_patches_invert_the_follow_mapping(shift):
    tf = S.Transform(NATIVE, shift)
    src = S.source_patches(NATIVE, tf, P)
    for n in range(GRID[0] * GRID[1]):
        (r, c), inside = S.follow_patch(divmod(n, GRID[1]), NATIVE, tf, P)
        if inside:
            assert src[r * GRID[1] + c] == n
    if shift[0] % P == 0 and shift[1] % P == 0:                             # whole patches: an exact shift
        sr, sc = shift[0] // P, shift[1] // P
        rr, cc = np.meshgrid(np.arange(4), np.arange(5), indexing="ij")
        inside = (rr - sr >= 0) & (rr - sr < 4) & (cc - sc >= 0) & (cc - sc < 5)
        np.testing.assert_array_equal(src, np.where(inside, (rr - sr) * 5 + cc - sc, -1).ravel())


# ----------------------------------------------------------------------------- how far the maps moved
@pytest.mark.parametrize("encoding", ["sape2", "cope+ape", "rpb"])
def test_the_live_number_is_the_readmes_bias_shift_error(encoding):
    model, x = _model(encoding), _image()
    for patches in ((1, 0), (0, 2), (1, 1)):
        tf = S.Transform(NATIVE, (patches[0] * P, patches[1] * P))
        before, after = _traces(model, tf, x)
        sv = S.stress_view(before, after, tf, NATIVE, P, (1, 1), 1, None, None)
        assert sv.bias_error == pytest.approx(bias_shift_error(model, x[None], patches), abs=5e-5)


def test_an_rpb_bias_map_moves_exactly_with_a_whole_patch_shift():
    """RPB's bias depends on offsets only: under a whole-patch shift the followed patch's map is
    the original map moved by the shift, where the shifted content is known (error 0); under a
    cyclic shift (torch.roll) as well, on the region the roll does not wrap."""
    model = _model("rpb")
    tf = S.Transform(NATIVE, (4, 8))
    before, after = _traces(model, tf)
    sv = S.stress_view(before, after, tf, NATIVE, P, (1, 1), 1, 0, None)
    assert sv.patch == (2, 3) and sv.bias_error == 0.0 and sv.bias.error == 0.0
    assert np.isnan(sv.bias.expected[0]).all() and np.isnan(sv.bias.expected[:, :2]).all()
    np.testing.assert_array_equal(sv.bias.diff[1:, 2:], 0.0)
    rolled = analysis.trace_image(model, torch.roll(_image(), (4, 8), dims=(-2, -1)))
    m0 = analysis.patch_maps(before, (1, 1))["bias"]                        # (L, h, H, W)
    m1 = analysis.patch_maps(rolled, (2, 3))["bias"]
    np.testing.assert_array_equal(m1[..., 1:, 2:], np.roll(m0, (1, 2), axis=(-2, -1))[..., 1:, 2:])
    # the test can fail: a map that ignores the shift does not match
    assert not np.allclose(m0[..., 1:, 2:], np.roll(m0, (1, 2), axis=(-2, -1))[..., 1:, 2:])


def test_native_size_without_shift_is_the_unshifted_view():
    model = _model("sape2+ape")
    tf = S.Transform(NATIVE)
    before, after = _traces(model, tf)
    np.testing.assert_array_equal(after.attn, before.attn)
    sv = S.stress_view(before, after, tf, NATIVE, P, (2, 3), 1, None, "sum")
    assert sv.patch == (2, 3) and sv.same_prediction and sv.grid == GRID
    assert sv.bias_error == 0.0 and sv.bias.error == 0.0 and sv.attention.error == 0.0
    np.testing.assert_array_equal(sv.src, np.arange(20))


def test_a_resized_input_runs_on_its_grid_and_is_compared_by_nearest_centre():
    model = _model("sape2+ape")
    tf = S.Transform((24, 32), (4, 0), "reflect")
    before, after = _traces(model, tf)
    sv = S.stress_view(before, after, tf, NATIVE, P, (1, 2), 0, 1, "x")
    assert sv.grid == (6, 8) and sv.bias.new.shape == (6, 8) and sv.attention.expected.shape == (6, 8)
    assert np.isnan(sv.bias.expected[0]).all() and np.isfinite(sv.bias.expected[1:]).all()
    assert sv.bias_error > 0 and np.isfinite(sv.bias_error)
    none = S.stress_view(*_traces(_model("none"), tf), tf, NATIVE, P, (1, 2), 0, None, None)
    assert none.bias is None and none.bias_error is None and np.isfinite(none.attention.error)


def test_input_rgb_inverts_the_normalisation():
    rgb = np.random.default_rng(0).integers(0, 256, (6, 7, 3), dtype=np.uint8)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    x = (torch.from_numpy(rgb).permute(2, 0, 1) / 255 - torch.tensor(mean)[:, None, None]) / \
        torch.tensor(std)[:, None, None]
    np.testing.assert_array_equal(S.input_rgb(x, mean, std), rgb)


def test_the_difference_figure_leaves_unknown_cells_blank_and_centres_the_difference():
    from vitpe_core import figures
    model = _model("sape2")
    tf = S.Transform(NATIVE, (4, 0))
    sv = S.stress_view(*_traces(model, tf), tf, NATIVE, P, (1, 1), 0, None, None)
    fig = figures.shift_diff_fig(sv.bias.expected, sv.bias.new, sv.bias.diff, title="bias", colorbar_title="bias",
                                 patch=sv.patch)
    expected, new, diff = (np.array(t.z, dtype=float) for t in fig.data)
    assert np.isnan(expected[0]).all() and np.isnan(diff[0]).all() and np.isfinite(new).all()
    assert fig.data[2].zmin == -fig.data[2].zmax == -np.nanmax(np.abs(sv.bias.diff)) < 0
    assert fig.data[0].zmin == fig.data[1].zmin and fig.data[0].zmax == fig.data[1].zmax
    assert [s.x0 for s in fig.layout.shapes] == [sv.patch[1] - 0.5] * 3


# ----------------------------------------------------------------------------- the bias explorer (AppTest)
REPO = __import__("pathlib").Path(__file__).resolve().parents[1]
SHIPPED = REPO / "checkpoints" / "sape2.safetensors"


@pytest.fixture
def shipped_sape2(tmp_path, monkeypatch):
    """A checkpoint folder holding only the shipped (trained) SaPE² model."""
    if not SHIPPED.exists():
        pytest.skip("checkpoints/sape2.safetensors is not in this checkout")
    import shutil
    for suffix in (".safetensors", ".json"):
        shutil.copy(SHIPPED.with_suffix(suffix), tmp_path)          # a copy: links out of the folder are refused
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(tmp_path))
    return tmp_path


def _app(params: dict, session: dict | None = None):
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=120)
    for k, v in params.items():
        at.query_params[k] = v
    for k, v in (session or {}).items():
        at.session_state[k] = v
    return _ok(at.run())


OPEN = {"open": ("rollout", "stress")}   # both sections open (the view's `open`, stress_panel.section)


def _ok(at):
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def _chart(at, key: str) -> dict:
    import json
    [chart] = [c for c in at.get("plotly_chart") if c.proto.id.endswith(key) or getattr(c, "key", None) == key]
    return json.loads(chart.proto.spec)


def _z(trace: dict) -> np.ndarray:
    import base64
    z = trace["z"]
    if isinstance(z, dict):
        shape = [int(s) for s in str(z.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"])).reshape(shape)
    return np.array([[np.nan if v is None else v for v in row] for row in z], dtype=float)


def _metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _has(at, key: str) -> bool:
    return any(c.proto.id.endswith(key) or getattr(c, "key", None) == key for c in at.get("plotly_chart"))


def test_the_page_rollout_is_positional_rollout(with_app_ckpts):
    from vitpe_core import positional
    from vitpe_core.checkpoint import load_checkpoint
    from vitpe_core.gallery import gallery_image
    from vitpe_core.inputs import checkpoint_input
    at = _app({"page": "bias", "ckpt": "sape2+ape", "patch": "2,5", "image": "cifar10-test-0008"}, OPEN)
    model = load_checkpoint(with_app_ckpts / "sape2+ape.safetensors").model
    tr = analysis.trace_image(model, checkpoint_input(gallery_image("cifar10-test-0008"), load_checkpoint(
        with_app_ckpts / "sape2+ape.safetensors")))
    full = {f: positional.rollout(tr.attn, f) for f in ("mean", "max")}
    np.testing.assert_allclose(_z(_chart(at, "bias_rollout")["data"][1]), full["mean"][1 + 2 * 8 + 5, 1:].reshape(8, 8),
                               rtol=1e-5)
    at.radio(key="bias_rollout_fusion").set_value("max")
    at.radio(key="bias_rollout_of_1").set_value("CLS")
    _ok(at.run())
    np.testing.assert_allclose(_z(_chart(at, "bias_rollout")["data"][1]), full["max"][0, 1:].reshape(8, 8), rtol=1e-5)
    assert "Rollout of CLS, heads fused by max" in _chart(at, "bias_rollout")["layout"]["title"]["text"]
    assert not _has(at, "bias_stress_bias_diff") and not at.metric      # the default view computes no stress test


def test_rollout_and_stress_run_only_once_opened(with_app_ckpts):
    """Closed on a first visit (the first page sends neither their controls nor their charts);
    opened, each is computed, and the view (URL, share link) says which are open; a link asking for
    one opens it (test below)."""
    view = {"page": "bias", "ckpt": "sape2+ape", "patch": "2,5", "image": "cifar10-test-0008"}
    at = _app(view)
    assert {"Attention rollout", "Stress test: shift and resize"} <= {e.label for e in at.expander}
    shifts = lambda: [w for w in at.get("select_slider") if "_shift_" in str(w.key)]   # noqa: E731
    assert not _has(at, "bias_rollout") and not shifts() and not at.get("metric")
    assert "open" not in at.query_params
    at.session_state["open"] = ("rollout",)
    _ok(at.run())
    assert _has(at, "bias_rollout") and not shifts()
    assert at.query_params["open"] == "rollout" and "open=rollout" in at.code[0].value
    at.session_state["open"] = ("rollout", "stress")
    _ok(at.run())
    assert at.select_slider(key="bias_shift_x_32x32p4").value == 0 and at.query_params["open"] == "rollout,stress"
    at.select_slider(key="bias_shift_x_32x32p4").set_value(4)
    _ok(at.run())
    assert at.metric                                                   # a stress view, computed
    at.select_slider(key="bias_shift_x_32x32p4").set_value(0)          # back to none: the section stays open
    _ok(at.run())
    assert not at.metric and shifts() and at.session_state["bias_stress_open"]

    linked = _app({**view, "open": "rollout"})                         # another visitor opens the link
    assert _has(linked, "bias_rollout") and not [w for w in linked.get("select_slider") if "_shift_" in str(w.key)]
    bad = _app({**view, "open": "rollout,nonsense"})
    assert _has(bad, "bias_rollout") and any("Ignored open=" in w.value for w in bad.warning)


@pytest.fixture
def with_app_ckpts(app_checkpoint_dir, monkeypatch):
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(app_checkpoint_dir))
    return app_checkpoint_dir


def test_shift_and_size_controls_on_the_shipped_sape2(shipped_sape2):
    from vitpe_core.checkpoint import load_checkpoint
    from vitpe_core.gallery import gallery_image
    from vitpe_core.inputs import checkpoint_input
    image = "cifar10-test-0008"
    at = _app({"page": "bias", "ckpt": "sape2", "patch": "3,4", "image": image}, {"bias_bias_tab": "Heatmap", **OPEN})
    before = _z(_chart(at, "bias_bias_map")["data"][0])
    assert not at.metric
    at.select_slider(key="bias_shift_x_32x32p4").set_value(4)             # one patch to the right
    _ok(at.run())
    err = _metrics(at)["Bias shift error (all layers and heads)"]
    ckpt = load_checkpoint(SHIPPED)
    expected = bias_shift_error(ckpt.model, checkpoint_input(gallery_image(image), ckpt)[None], (0, 1))
    assert float(err) == pytest.approx(expected, abs=1e-3)               # the README's number, live
    assert any("patch (3, 4) → (3, 5)" in m.value for m in at.markdown)
    diff = _chart(at, "bias_stress_bias_diff")
    assert np.isnan(_z(diff["data"][0])[:, 0]).all()                     # the column that came from outside
    assert "error" in diff["layout"]["title"]["text"]
    at.select_slider(key="bias_shift_y_32x32p4").set_value(-6)             # and 1½ patches up: another number
    _ok(at.run())
    assert _metrics(at)["Bias shift error (all layers and heads)"] != err
    assert any("patch (3, 4) → (2, 5)" in m.value for m in at.markdown)
    at.select_slider(key="bias_size_32x32p4").set_value(40)
    at.radio(key="bias_fill").set_value("reflect")
    _ok(at.run())
    assert _z(_chart(at, "bias_stress_bias_diff")["data"][1]).shape == (10, 10)
    assert any("Grid 10×10" in m.value for m in at.markdown)
    for k in ("bias_shift_x_32x32p4", "bias_shift_y_32x32p4"):
        at.select_slider(key=k).set_value(0)
    at.select_slider(key="bias_size_32x32p4").set_value(32)           # back to native: the unchanged view
    _ok(at.run())
    assert not at.metric and not _has(at, "bias_stress_bias_diff")
    np.testing.assert_array_equal(_z(_chart(at, "bias_bias_map")["data"][0]), before)


def test_rollout_and_stress_on_a_model_with_several_prefix_tokens_and_a_wide_grid(tmp_path, monkeypatch):
    """An imported-style model: CLS + distillation + 2 register tokens, 8-px patches on a 24 x 32 input
    (3 x 4 grid): the rollout offers every prefix token, the controls its own shifts and sizes."""
    from vitpe_core.checkpoint import save_checkpoint
    torch.manual_seed(0)
    model = build_model(ViTConfig(img_size=(24, 32), patch_size=8, dim=32, depth=2, heads=2, mlp_dim=32,
                                  encoding="sape2+ape", dist_token=True, reg_tokens=2))
    save_checkpoint(tmp_path / "wide.safetensors", model, metrics={"recipe": {"dataset": "cifar10"}})
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(tmp_path))
    at = _app({"page": "bias", "ckpt": "wide", "patch": "1,2"}, OPEN)
    radio = at.radio(key="bias_rollout_of_4")
    assert list(radio.options) == ["the query patch (1, 2)", "CLS", "dist", "reg 0", "reg 1"]
    radio.set_value("reg 1")
    _ok(at.run())
    assert _z(_chart(at, "bias_rollout")["data"][1]).shape == (3, 4)
    at.select_slider(key="bias_shift_x_24x32p8").set_value(-8)
    at.select_slider(key="bias_size_24x32p8").set_value(32)                # 4 x 5 patches
    _ok(at.run())
    assert any("Grid 4×5" in m.value for m in at.markdown)
    assert _z(_chart(at, "bias_stress_attn_diff")["data"][1]).shape == (4, 5)
    assert float(_metrics(at)["Bias shift error (all layers and heads)"]) > 0


def test_a_link_with_a_shift_reopens_the_stress_view(with_app_ckpts):
    """The stress test's shift, size and fill and the rollout's source and fusion are in the share
    link: opening it shows the same stress view; a tampered value falls back with a warning."""
    link = {"page": "bias", "ckpt": "sape2+ape", "patch": "2,5", "image": "cifar10-test-0008", "shift": "0,4",
            "fill": "reflect", "rollout": "CLS", "fusion": "max"}
    at = _app(link)
    assert not at.warning, [w.value for w in at.warning]
    assert at.select_slider(key="bias_shift_x_32x32p4").value == 4 and at.radio(key="bias_fill").value == "reflect"
    assert at.select_slider(key="bias_shift_y_32x32p4").value == 0
    assert any("patch (2, 5) → (2, 6)" in m.value for m in at.markdown)          # one patch to the right
    assert "Bias shift error (all layers and heads)" in _metrics(at) and _has(at, "bias_stress_bias_diff")
    assert "Rollout of CLS, heads fused by max" in _chart(at, "bias_rollout")["layout"]["title"]["text"]
    shared = at.code[0].value
    assert all(f"{k}={v}" in shared for k, v in (("shift", "0,4"), ("fill", "reflect"), ("rollout", "CLS"),
                                                  ("fusion", "max")))
    at.select_slider(key="bias_size_32x32p4").set_value(40)                        # the controls write the view back
    at.select_slider(key="bias_shift_y_32x32p4").set_value(-2)
    _ok(at.run())
    assert (at.query_params["shift"], at.query_params["size"]) == ("-2,4", "40")
    assert "shift=-2,4" in at.code[0].value and "size=40" in at.code[0].value
    for k in ("bias_shift_x_32x32p4", "bias_shift_y_32x32p4"):
        at.select_slider(key=k).set_value(0)
    at.select_slider(key="bias_size_32x32p4").set_value(32)
    _ok(at.run())
    assert not {"shift", "size"} & set(at.query_params) and not at.metric    # back to native: a plain link

    bad = _app({**link, "shift": "0,99", "size": "33"})
    notes = " ".join(w.value for w in bad.warning)
    assert "Ignored shift=" in notes and "Ignored size=" in notes
    assert not bad.metric and bad.select_slider(key="bias_shift_x_32x32p4").value == 0
    assert bad.radio(key="bias_fill").value == "reflect"                            # the valid values are kept
