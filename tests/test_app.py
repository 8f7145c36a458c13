"""The Streamlit app through app.py in AppTest: every page with and without checkpoints, views
restored from the URL, bad parameters falling back with a warning, the clicked patch set
through session_state, widgets driven by key, uploads. Checkpoints: tests/conftest.py's
`app_checkpoint_dir` (tiny random-weight models)."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from vitpe_core import figures, gallery
from vitpe_core.store import png_bytes
from vitpe_core.viewstate import PAGES

APP = str(Path(__file__).resolve().parents[1] / "app.py")
TITLES = {"bias": "Bias explorer", "similarity": "Position-embedding similarity", "compare": "Compare encodings",
          "checkpoints": "Checkpoints"}


@pytest.fixture(autouse=True)
def upload_dir(tmp_path, monkeypatch):
    """Every test's own upload store (never the user's cache folder)."""
    folder = tmp_path / "uploads"
    monkeypatch.setenv("VITPE_UPLOAD_DIR", str(folder))
    return folder


@pytest.fixture
def with_ckpts(app_checkpoint_dir, monkeypatch):
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(app_checkpoint_dir))
    return app_checkpoint_dir


@pytest.fixture
def without_ckpts(tmp_path, monkeypatch):
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(tmp_path / "empty"))
    return tmp_path


HEATMAP = {"bias_bias_tab": "Heatmap"}   # the bias tab with the `bias_bias_map` chart (only the open tab runs)


def run(params: dict | None = None, session: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=60)
    for k, v in (params or {}).items():
        at.query_params[k] = v
    for k, v in (session or {}).items():
        at.session_state[k] = v
    return at.run()


def ok(at: AppTest) -> AppTest:
    assert not at.exception, [e.value for e in at.exception]
    return at


def patch_texts(at: AppTest) -> list[str]:
    return [m.value for m in at.markdown if "Patch (" in m.value]


def chart_spec(at: AppTest, key: str) -> dict:
    [chart] = [c for c in at.get("plotly_chart") if c.proto.id.endswith(key) or getattr(c, "key", None) == key]
    return json.loads(chart.proto.spec)


def attention_row(at: AppTest) -> np.ndarray:
    """The bias page's attention row as drawn on its default tab (the overlay's heatmap, trace 1)."""
    return z_of(chart_spec(at, "bias_attn_overlay"), trace=1)


def z_of(spec: dict, trace: int = 0) -> np.ndarray:
    """The first trace's z (or trace `trace`'s); Plotly >= 6 sends numpy arrays as base64 typed arrays."""
    z = spec["data"][trace]["z"]
    if isinstance(z, dict):
        shape = [int(s) for s in str(z.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"])).reshape(shape)
    return np.array(z, dtype=float)


def title(at: AppTest) -> str:
    return at.title[0].value


# ----------------------------------------------------------------------------- pages
@pytest.mark.parametrize("page", PAGES)
def test_every_page_runs_with_checkpoints(with_ckpts, page):
    at = ok(run({"page": page}))
    assert title(at) == TITLES[page]
    assert not at.warning and not at.error
    assert at.query_params["page"] == page
    if page != "checkpoints":
        assert patch_texts(at) == [p for p in patch_texts(at) if "Patch (4, 4)" in p] != []
        assert at.get("plotly_chart")


@pytest.mark.parametrize("page", PAGES)
def test_every_page_explains_how_to_get_checkpoints(without_ckpts, page):
    at = ok(run({"page": page}))
    assert title(at) == TITLES[page]
    assert any("scripts/train_checkpoints.sh" in i.value and "python -m vitpe_core train" in i.value for i in at.info)


def test_page_parameter_routes_from_the_root(with_ckpts):
    at = ok(run({"page": "compare", "ckpt": "rpb"}))
    assert title(at) == "Compare encodings"
    assert at.query_params["ckpt"] == "rpb"


def test_compare_page_draws_every_run_epoch_by_epoch(with_ckpts):
    from conftest import APP_ENCODINGS
    at = ok(run({"page": "compare"}))
    acc = chart_spec(at, "compare_curves")
    assert [t["name"] for t in acc["data"]] == sorted(APP_ENCODINGS)              # one line per checkpoint
    by_name = {t["name"]: t for t in acc["data"]}
    assert by_name["rpb"]["y"] == [10.0 + APP_ENCODINGS.index("rpb")]           # its recorded test top-1
    struct = chart_spec(at, "compare_structure_curves")
    tables = {t["name"] for t in struct["data"]}
    assert tables == {"ape", "sape2+ape"} and all(t["x"] == [0, 1] for t in struct["data"])


# ----------------------------------------------------------------------------- URL
def test_url_restores_the_view(with_ckpts):
    at = ok(run({"page": "bias", "ckpt": "sape2+ape", "patch": "3,4", "layer": "1", "head": "1",
                 "image": "cifar10-test-0008"}, HEATMAP))
    assert not at.warning
    assert any("Patch (3, 4)" in t for t in patch_texts(at))
    assert at.selectbox(key="bias_ckpt").value == "sape2+ape"
    assert at.selectbox(key="bias_image").value == "cifar10-test-0008"
    assert at.select_slider(key="bias_layer").value == 1
    assert at.selectbox(key="bias_head").value == "1"
    assert (at.number_input(key="bias_row").value, at.number_input(key="bias_col").value) == (3, 4)
    assert "SaPE²(K)" in " ".join(m.value for m in at.markdown)          # readout="query"
    assert "layer 1, head 1" in chart_spec(at, "bias_bias_map")["layout"]["title"]["text"]
    link = at.code[0].value
    assert "page=bias" in link and "ckpt=sape2%2Bape" in link and "patch=3,4" in link and "head=1" in link


def test_bad_parameters_fall_back_with_warnings(with_ckpts):
    at = ok(run({"page": "bias", "ckpt": "../../etc/passwd", "patch": "99,99", "layer": "-1", "head": "abc",
                 "image": "nope"}))
    text = " ".join(w.value for w in at.warning)
    for key in ("ckpt", "patch", "layer", "head", "image"):
        assert f"Ignored {key}=" in text
    assert any("Patch (4, 4)" in t for t in patch_texts(at))
    assert dict(at.query_params) == {"page": "bias", "ckpt": "sape2+ape", "image": gallery.gallery_ids()[0],
                                     "patch": "4,4", "layer": "0", "head": "mean"}
    at.run()                                                             # the URL is valid now
    assert not at.warning


def test_bad_page_parameter_warns(with_ckpts):
    at = ok(run({"page": "admin"}))
    assert title(at) == "Bias explorer" and "Ignored page=" in at.warning[0].value


# ----------------------------------------------------------------------------- interaction
def test_session_state_patch_changes_text_and_map(with_ckpts):
    at = ok(run({"ckpt": "sape2+ape"}, HEATMAP))
    before = z_of(chart_spec(at, "bias_bias_map"))
    at.session_state["patch"] = (1, 6)
    ok(at.run())
    assert any("Patch (1, 6)" in t for t in patch_texts(at))
    assert at.query_params["patch"] == "1,6"
    after = z_of(chart_spec(at, "bias_bias_map"))
    assert before.shape == after.shape == (8, 8) and not np.allclose(before, after)
    assert (at.number_input(key="bias_row").value, at.number_input(key="bias_col").value) == (1, 6)


def chart_keys(at: AppTest) -> set[str]:
    return {k for c in at.get("plotly_chart") for k in ("bias_bias_overlay", "bias_bias_map", "bias_bias_layers",
                                                       "bias_bias_heads") if c.proto.id.endswith(k)}


def test_only_the_open_bias_tab_builds_its_figure(with_ckpts):
    """A click rebuilt all four tabs' figures (~50 % of the server's CPU per click was the two
    hidden small-multiples grids); the tabs now rerun on a switch and only the open one runs."""
    at = ok(run({"ckpt": "sape2+ape"}))
    assert chart_keys(at) == {"bias_bias_overlay"}
    assert [t.label for t in at.tabs] == ["On the image", "Heatmap", "All layers", "All heads",   # the bias
                                          "On the image", "Heatmap"]                              # the attention row
    for label, key in (("All layers", "bias_bias_layers"), ("All heads", "bias_bias_heads"),
                       ("Heatmap", "bias_bias_map")):
        at.session_state["bias_bias_tab"] = label
        ok(at.run())
        assert chart_keys(at) == {key}, label
    at.session_state["patch"] = (0, 1)
    ok(at.run())
    assert chart_keys(at) == {"bias_bias_map"}                      # the tab stays open across a click
    assert len(chart_spec(at, "bias_bias_map")["layout"]["shapes"]) == 1
    attention = lambda: {k for c in at.get("plotly_chart") for k in ("bias_attn_overlay", "bias_attn_map")  # noqa: E731
                         if c.proto.id.endswith(k)}
    assert attention() == {"bias_attn_overlay"}                     # the attention row's tabs: the same rule
    at.session_state["bias_attn_tab"] = "Heatmap"
    ok(at.run())
    assert attention() == {"bias_attn_map"} and chart_keys(at) == {"bias_bias_map"}


def test_widgets_by_key_update_view_and_url(with_ckpts):
    at = ok(run({"ckpt": "sape2+ape"}, HEATMAP))
    at.number_input(key="bias_row").set_value(6)
    ok(at.run())
    assert at.query_params["patch"] == "6,4"
    at.radio(key="bias_part").set_value("x")
    ok(at.run())
    assert "x part" in chart_spec(at, "bias_bias_map")["layout"]["title"]["text"]
    at.selectbox(key="bias_ckpt").set_value("rope_mixed")
    ok(at.run())
    assert at.query_params["ckpt"] == "rope_mixed"
    assert any("adds no attention bias" in i.value for i in at.info)
    at.switch_page("pages/compare.py")
    ok(at.run())                                                         # the view follows to another page
    assert any("Patch (6, 4)" in t for t in patch_texts(at)) and at.query_params["page"] == "compare"
    at.selectbox(key="compare_head").set_value("1")
    ok(at.run())
    assert at.query_params["head"] == "1"


def test_similarity_page_epochs_and_tables(with_ckpts):
    at = ok(run({"page": "similarity", "ckpt": "rpb"}))                  # rpb has no table
    assert any("no position table" in i.value for i in at.info)
    assert at.query_params["ckpt"] == "rpb"                              # the session keeps it (issue 44, item 3)
    assert "ape" in chart_spec(at, "similarity_patch_map")["layout"]["title"]["text"]
    at.select_slider(key="similarity_epoch").set_value(0)
    ok(at.run())
    assert "epoch 0" in chart_spec(at, "similarity_patch_map")["layout"]["title"]["text"]
    at.session_state["patch"] = (0, 7)
    ok(at.run())
    assert any("Patch (0, 7)" in t for t in patch_texts(at))


# ----------------------------------------------------------------------------- uploads
def _png(size=(40, 30), color=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def test_decode_upload_notes():
    from pages.common.uploads import decode_upload_notes

    img, err, notes = decode_upload_notes(_png())
    assert err is None and img.mode == "RGB" and img.size == (40, 30) and notes == []
    img, err, notes = decode_upload_notes(b"definitely not an image")
    assert img is None and "not an image" in err and notes == []
    img, err, _ = decode_upload_notes(_png()[:60])
    assert img is None and err
    assert decode_upload_notes("text")[0] is None


def test_image_upload_in_the_app(with_ckpts, upload_dir):
    at = ok(run({"ckpt": "sape2+ape"}))
    at.file_uploader(key="bias_upload").set_value(("bad.png", b"\x89PNG broken", "image/png"))
    ok(at.run())
    assert at.error and "bad.png" in at.error[0].value
    at.select_slider(key="bias_layer").set_value(1)
    ok(at.run())
    assert at.error and "bad.png" in at.error[0].value                 # said while the file is in the uploader
    at.switch_page("pages/compare.py")
    ok(at.run())
    assert not at.error                                                  # not on a page whose uploader is empty
    at.switch_page("pages/bias.py")
    ok(at.run())
    at.file_uploader(key="bias_upload").set_value(("red.png", _png(), "image/png"))
    ok(at.run())
    assert not at.error
    digest = hashlib.sha256(png_bytes(Image.open(io.BytesIO(_png())))).hexdigest()
    assert at.session_state["image"] == f"upload:{digest}" == _qp(at, "image")
    assert (upload_dir / f"{digest}.png").is_file()                  # in the store, under its hash
    assert any("red.png" in c.value for c in at.caption)


def _qp(at: AppTest, key: str) -> str:
    value = at.query_params[key]
    return value[-1] if isinstance(value, list) else value


def test_a_shared_upload_opens_in_another_session(with_ckpts, upload_dir):
    """Upload, pick a patch, layer and head; a new session (another visitor) opening the link's
    query string sees the same image and view; an unknown hash falls back with a warning."""
    at = ok(run({"ckpt": "sape2+ape"}))
    at.file_uploader(key="bias_upload").set_value(("photo.png", _png((48, 40), (10, 200, 90)), "image/png"))
    ok(at.run())
    at.session_state["patch"] = (2, 5)
    at.select_slider(key="bias_layer").set_value(1)
    ok(at.run())
    link = {k: _qp(at, k) for k in ("page", "ckpt", "image", "patch", "layer", "head")}
    assert link["image"].startswith("upload:") and link["patch"] == "2,5" and link["layer"] == "1"
    mine = attention_row(at)
    other = ok(run(link))                                          # a new AppTest = a new browser session
    assert not other.warning, [w.value for w in other.warning]
    assert other.session_state["image"] == link["image"] and other.session_state["patch"] == (2, 5)
    assert other.session_state["layer"] == 1
    np.testing.assert_array_equal(attention_row(other), mine)    # the same image through the model
    assert any("Patch (2, 5)" in t for t in patch_texts(other))
    gone = ok(run({**link, "image": "upload:" + "0" * 64}))
    assert any("not on this server" in w.value for w in gone.warning)
    assert gone.session_state["image"] == gallery.gallery_ids()[0]
    bad = ok(run({**link, "image": "upload:../../etc/passwd"}))
    assert any("not an upload id" in w.value for w in bad.warning)


def _timm_npz(model) -> bytes:
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    sd["pos_embed"] = sd.pop("pos_enc.pos_embed")
    buf = io.BytesIO()
    np.savez(buf, **sd)
    return buf.getvalue()


def test_import_a_vit_on_the_checkpoints_page_and_use_it_on_every_page(without_ckpts):
    from vitpe_core import ViTConfig, build_model

    model = build_model(ViTConfig(img_size=(40, 40), patch_size=4, dim=64, depth=1, heads=1, mlp_dim=64,
                                  num_classes=3))
    at = ok(run({"page": "checkpoints"}))
    at.file_uploader(key="checkpoints_model_upload").set_value(("vit.npz", _timm_npz(model),
                                                                 "application/octet-stream"))
    ok(at.run())
    at.button(key="checkpoints_model_import").click()
    ok(at.run())
    assert not at.error and "Imported as `vit-upload`" in at.success[0].value
    assert at.selectbox(key="checkpoints_ckpt").value == "vit-upload"
    source = [m.value for m in at.markdown if m.value.startswith("Imported from")]
    assert source and source[0].startswith("Imported from `vit.npz`"), source   # a code span, shown literally
    at.switch_page("pages/similarity.py")
    ok(at.run())
    assert not at.error and "vit-upload" in chart_spec(at, "similarity_patch_map")["layout"]["title"]["text"]
    at.session_state["patch"] = (9, 9)                                   # a 10x10 grid
    ok(at.run())
    assert any("Patch (9, 9)" in t for t in patch_texts(at)) and not at.warning
    for page in ("bias", "compare"):
        at.switch_page(f"pages/{page}.py")
        ok(at.run())
        assert not at.error, page
    other = ok(run({"page": "checkpoints"}))                             # another session does not see it
    assert "vit-upload" not in str(other.dataframe[0].value.index.tolist() if other.dataframe else [])
    at.switch_page("pages/checkpoints.py")
    ok(at.run())
    at.file_uploader(key="checkpoints_model_upload").set_value(("junk.pth", b"junk", "application/octet-stream"))
    ok(at.run())
    at.button(key="checkpoints_model_import").click()
    ok(at.run())
    assert at.error and "junk.pth was not imported" in at.error[0].value


def test_a_share_link_of_an_imported_model_opens_that_model_in_another_session(without_ckpts):
    """The cause of the load test's `does not carry ckpt loadmodel-upload`: the link of a view on
    an imported model named only the session's name for it, so another visitor's session (which
    does not list that model) fell back to the default checkpoint. The link now carries the
    model's content hash (`model=`) and opens the same model anywhere on this server."""
    from vitpe_core import ViTConfig, build_model

    torch_model = build_model(ViTConfig(img_size=(32, 32), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=32,
                                        num_classes=3))
    data = _timm_npz(torch_model)
    at = ok(run({"page": "checkpoints"}))
    at.file_uploader(key="checkpoints_model_upload").set_value(("shared.npz", data, "application/octet-stream"))
    ok(at.run())
    at.button(key="checkpoints_model_import").click()
    ok(at.run())
    at.switch_page("pages/bias.py")
    ok(at.run())
    at.session_state["patch"] = (2, 6)
    ok(at.run())
    link = {k: _qp(at, k) for k in ("page", "ckpt", "image", "patch", "layer", "head", "model")}
    assert link["ckpt"] == "shared-upload" and link["model"] == hashlib.sha256(data).hexdigest(), link
    mine = attention_row(at)
    other = ok(run(link))                                          # another visitor, another session
    assert not other.warning, [w.value for w in other.warning]
    assert other.session_state["ckpt"] == "shared-upload" and other.session_state["patch"] == (2, 6)
    assert other.selectbox(key="bias_ckpt").value == "shared-upload"
    np.testing.assert_array_equal(attention_row(other), mine)
    renamed = ok(run({**link, "ckpt": "sape2+ape"}))               # a link cannot name it as something else
    assert renamed.session_state["ckpt"] == "shared-upload"
    gone = ok(run({**link, "model": "0" * 64}))
    assert any("not on this server any more" in w.value for w in gone.warning), [w.value for w in gone.warning]
    assert gone.session_state["ckpt"] != "shared-upload"
    bad = ok(run({**link, "model": "../x"}))                      # not a content hash: the name alone, unknown here
    assert any("Ignored ckpt='shared-upload'" in w.value for w in bad.warning), [w.value for w in bad.warning]


def test_a_model_ref_names_a_file_or_an_imported_model_not_a_path_prefix(app_checkpoint_dir, tmp_path):
    """The model cache's key says which kind of model it is: a folder file by path and mtime, an
    imported one by content hash, looked up in the store (an evicted one is said, not a crash).
    A file whose name looks like an upload id is still a file."""
    from pages.common import cache
    from vitpe_core.checkpoint import CheckpointError

    path = app_checkpoint_dir / "ape.safetensors"
    ref = cache.ModelRef("file", str(path), path.stat().st_mtime_ns)
    assert ref.is_file and cache.load_model(ref).config.encoding == "ape"
    odd = tmp_path / "upload:ape.safetensors"
    odd.write_bytes(path.read_bytes())
    assert cache.load_model(cache.ModelRef("file", str(odd), odd.stat().st_mtime_ns)).config.encoding == "ape"
    with pytest.raises(CheckpointError, match="removed from the server"):
        cache.load_model(cache.ModelRef("imported", "0" * 64))


# ----------------------------------------------------------------------------- pure helpers
def test_gallery():
    ids = gallery.gallery_ids()
    cifar = [i for i in ids if i.startswith("cifar10-test-")]
    assert len(cifar) == 12 and len({gallery.gallery_label(i) for i in cifar}) == 10
    img = gallery.gallery_image(cifar[0])
    assert img.mode == "RGB" and img.size == (32, 32)
    assert gallery.gallery_image("photo-camera").mode == "RGB"          # grayscale photo -> RGB
    with pytest.raises(ValueError, match="valid"):
        gallery.gallery_image("../../etc/passwd")


def test_click_geometry():
    assert figures.pixel_to_patch(0, 0, 320, 320, (8, 8)) == (0, 0)
    assert figures.pixel_to_patch(319.9, 100, 320, 320, (8, 8)) == (2, 7)
    assert figures.pixel_to_patch(500, -3, 320, 240, (6, 8)) == (0, 7)   # clamped
    sim = np.random.default_rng(0).random((4, 3, 4, 3))
    canvas = figures.figure7_canvas(sim)                                 # tile (r, c) at (r*5, c*4)
    assert canvas.shape == (4 * 5 - 1, 3 * 4 - 1)
    assert canvas[2 * 5 + 1, 1 * 4 + 2] == pytest.approx(sim[2, 1, 1, 2]) and np.isnan(canvas[4, 0])
    img = figures.figure7_image(sim, cell_px=2)
    w, h = img.size
    assert figures.figure7_pixel_to_patch((1 * 4 + 1) * 2, (2 * 5 + 3) * 2, w, h, (4, 3)) == (2, 1)


def test_the_patch_picker_has_a_marker_per_patch_and_outlines_the_chosen_one(with_ckpts):
    """The picker's figure (`vitpe_core.figures.picker`) as the bias page draws it: one marker
    per patch, at that patch's centre and carrying its (r, c), and the chosen patch outlined."""
    at = ok(run({"ckpt": "sape2+ape", "patch": "2,5"}))
    spec = chart_spec(at, "bias_click")
    w, h = spec["layout"]["xaxis"]["range"][1], spec["layout"]["yaxis"]["range"][0]
    markers = spec["data"][1]
    assert sorted(map(tuple, markers["customdata"])) == [(r, c) for r in range(8) for c in range(8)]
    for x, y, rc in zip(markers["x"], markers["y"], markers["customdata"]):
        assert figures.pixel_to_patch(x, y, w, h, (8, 8)) == tuple(rc)
    [box] = spec["layout"]["shapes"]
    assert figures.pixel_to_patch((box["x0"] + box["x1"]) / 2, (box["y0"] + box["y1"]) / 2, w, h, (8, 8)) == (2, 5)


ODD_METRICS = [  # valid checkpoints whose metrics were hand-edited or written by another tool
    {"test": "n/a", "epochs": "many", "recipe": "compact", "structure": 3, "resolution": [1, 2],
     "translation": "none", "curves": {"epoch": 5, "train_loss": "x"}},
    {"test": {"top1": "high"}, "resolution": {"24": "bad", "x": {"top1": None}}, "translation": {"half_x": 1},
     "curves": {"epoch": [1, 2], "train_loss": [2.3], "test_top1": [None, "a"]}, "structure": {"spearman": "s"}},
    {"curves": {"epoch": [], "test_top1": []}, "notes": 7, "git_commit": None},
    [1, 2, 3],
]


@pytest.mark.parametrize("case", range(len(ODD_METRICS)))
def test_pages_survive_odd_metrics(case, tmp_path, monkeypatch):
    from vitpe_core import ViTConfig, build_model
    from vitpe_core.checkpoint import save_checkpoint
    model = build_model(ViTConfig(img_size=(32, 32), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=64,
                                  encoding="sape2+ape")).eval()
    save_checkpoint(tmp_path / "odd.safetensors", model, metrics=ODD_METRICS[case])
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(tmp_path))
    for page in PAGES:
        at = ok(run({"page": page, "ckpt": "odd"}))
        assert at.title[0].value == TITLES[page]
    assert any("not in the shape" in w.value for w in at.warning)      # the checkpoints page says what it hid


@pytest.mark.shared
@pytest.mark.slow
def test_the_real_vit_tiny_on_every_page_at_14x14(shared_dir, tmp_path, monkeypatch):
    """The README's "Your own model" path: import the pretrained ViT-Ti/16 with the CLI, then
    every page renders it at its own resolution and grid."""
    from vitpe_core.__main__ import main
    folder = tmp_path / "ckpts"
    src = shared_dir / "data" / "vit_tiny_patch16_224_tinyimagenet_ft.npz"
    assert main(["import", str(src), "--out", str(folder / "vit_tiny.safetensors")]) == 0
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(folder))
    for page in PAGES:
        at = ok(run({"page": page, "ckpt": "vit_tiny", "patch": "13,13", "layer": "11"}))
        assert not at.error and not at.warning, (page, [w.value for w in at.warning])
    at = ok(run({"page": "bias", "ckpt": "vit_tiny", "patch": "13,13", "layer": "11", "image": "photo-astronaut"}))
    assert any("Patch (13, 13)" in t for t in patch_texts(at))
    assert attention_row(at).shape == (14, 14)
    assert any("CLS" in c.value for c in at.caption)                     # the prefix token is named
    at = ok(run({"page": "similarity", "ckpt": "vit_tiny"}))
    assert any("0.573" in str(m.value) for m in at.metric)


# ----------------------------------------------------------------------------- the view and the URL
def test_a_stale_address_bar_neither_resets_the_view_nor_loses_the_next_action(with_ckpts, monkeypatch):
    """Every rerun carries the browser's address bar; after quick actions it can be one the app
    has already replaced. Only a session's first run and back/forward read it."""
    from pages.common import viewsync

    at = ok(run({"ckpt": "sape2+ape"}, HEATMAP))
    at.select_slider(key="bias_layer").set_value(1)
    ok(at.run())
    assert at.query_params["layer"] == "1"
    at.query_params["layer"] = "0"                       # the address bar before the app's update arrived
    at.selectbox(key="bias_head").set_value("1")         # the next action
    ok(at.run())
    assert (at.select_slider(key="bias_layer").value, at.selectbox(key="bias_head").value) == (1, "1")
    assert (at.query_params["layer"], at.query_params["head"]) == ("1", "1")
    assert "layer 1, head 1" in chart_spec(at, "bias_bias_map")["layout"]["title"]["text"]
    assert "layer=1&head=1" in at.code[0].value
    monkeypatch.setattr(viewsync, "history_navigation", lambda: True)   # the back button: the URL is the view
    at.query_params["layer"], at.query_params["head"] = "0", "mean"
    ok(at.run())
    assert (at.select_slider(key="bias_layer").value, at.selectbox(key="bias_head").value) == (0, "mean")
    assert not at.warning


def test_the_share_link_keeps_the_epoch(with_ckpts):
    at = ok(run({"page": "similarity", "ckpt": "ape"}))
    assert "epoch" not in at.query_params and "epoch=" not in at.code[0].value      # the final table: a clean link
    at.select_slider(key="similarity_epoch").set_value(0)
    ok(at.run())
    assert at.query_params["epoch"] == "0" and "epoch=0" in at.code[0].value
    link = at.code[0].value
    again = ok(run({k: v[0] for k, v in parse_qs(urlsplit(link).query).items()}))
    assert again.select_slider(key="similarity_epoch").value == 0 and not again.warning
    assert "epoch 0" in chart_spec(again, "similarity_patch_map")["layout"]["title"]["text"]
    bad = ok(run({"page": "similarity", "ckpt": "ape", "epoch": "7"}))             # not recorded: refused
    assert any("Ignored epoch='7'" in w.value for w in bad.warning)
    assert bad.select_slider(key="similarity_epoch").value == "final"


# ----------------------------------------------------------------------------- images
def _gif(frames: int = 3, size=(40, 30)) -> bytes:
    imgs = [Image.new("RGB", size, c) for c in [(200, 30, 30), (30, 200, 30), (30, 30, 200)][:frames]]
    buf = io.BytesIO()
    imgs[0].save(buf, "GIF", save_all=True, append_images=imgs[1:], duration=100, loop=0)
    return buf.getvalue()


def picker_caption(at: AppTest) -> str:
    return next(c.value for c in at.caption if "click a patch" in c.value)


def test_an_upload_follows_the_visitor_across_pages_until_cleared(with_ckpts):
    at = ok(run({"ckpt": "sape2+ape"}))
    at.file_uploader(key="bias_upload").set_value(("red.png", _png(), "image/png"))
    ok(at.run())
    assert picker_caption(at).startswith("uploaded: red.png")
    for page in ("compare", "bias"):
        at.switch_page(f"pages/{page}.py")
        ok(at.run())
        assert picker_caption(at).startswith("uploaded: red.png"), page
        assert any("Showing your upload" in c.value for c in at.caption)
    at.button(key="bias_clear_upload").click()
    ok(at.run())
    assert picker_caption(at).startswith("CIFAR-10 test #0")
    at.file_uploader(key="bias_upload_1").set_value(("red.png", _png(), "image/png"))   # a fresh, empty uploader
    ok(at.run())
    assert picker_caption(at).startswith("uploaded: red.png")
    at.selectbox(key="bias_image").set_value("cifar10-test-0008")                     # choosing a sample replaces it
    ok(at.run())
    assert picker_caption(at).startswith("CIFAR-10 test #8")
    assert not any("Showing your upload" in c.value for c in at.caption)


def test_odd_images_are_used_with_a_notice(with_ckpts):
    at = ok(run({"ckpt": "sape2+ape"}))
    at.file_uploader(key="bias_upload").set_value(("dot.png", _png(size=(1, 1)), "image/png"))
    ok(at.run())
    assert any("1×1 px" in i.value and "enlarged 32×" in i.value for i in at.info) and not at.error
    at.file_uploader(key="bias_upload").set_value(("anim.gif", _gif(3), "image/gif"))
    ok(at.run())
    assert any("only its first frame (of 3) is used" in i.value for i in at.info) and not at.error


def test_a_wide_image_says_what_the_crop_leaves_out_and_can_be_padded(with_ckpts):
    at = ok(run({"ckpt": "sape2+ape", "image": "photo-rocket"}))                        # 640 x 427
    [note] = [i.value for i in at.info if "left out" in i.value]
    assert "centred 427×427 px of this 640×427 px image" in note and "33 %" in note and "left and right" in note
    cropped = attention_row(at)
    at.radio(key="bias_fit").set_value("pad")
    ok(at.run())
    assert not [i for i in at.info if "left out" in i.value]
    assert any("Padded: the whole 640×427 px image" in c.value for c in at.caption)
    assert not np.allclose(cropped, attention_row(at))             # the model sees another input
    at.switch_page("pages/compare.py")                                                  # the choice holds on every page
    ok(at.run())
    assert at.radio(key="compare_fit").value == "pad"
    square = ok(run({"ckpt": "sape2+ape", "image": "photo-astronaut"}))                 # 512 x 512: nothing left out
    assert not [i for i in square.info if "left out" in i.value]
    assert "bias_fit" not in [r.key for r in square.radio]


def test_the_image_uploader_states_its_limit(with_ckpts):
    from pages.common.uploads import MAX_IMAGE_UPLOAD_MB
    at = ok(run({"ckpt": "sape2+ape"}))
    [cap] = [c.value for c in at.caption if f"Images up to {MAX_IMAGE_UPLOAD_MB} MB" in c.value]
    assert "refused by the browser" in cap and "shrink the image" in cap


# ----------------------------------------------------------------------------- what the pages say
def _title_lines(spec: dict) -> list[str]:
    import re
    text = ((spec.get("layout") or {}).get("title") or {}).get("text") or ""
    return [re.sub(r"<[^>]+>", "", line) for line in re.split(r"<br\s*/?>", text)]


@pytest.mark.parametrize("page", PAGES)
def test_every_chart_title_fits_a_phone_below_the_modebar(with_ckpts, page):
    at = ok(run({"page": page, "ckpt": "sape2+ape", "image": "photo-rocket"}))
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")
             if json.loads(c.proto.config).get("displayModeBar") is not False]   # not the untitled patch picker
    assert specs or page == "checkpoints"
    for spec in specs:
        lines = _title_lines(spec)
        assert max(map(len, lines)) <= figures.TITLE_MAX_CHARS, lines
        assert max(map(len, lines)) * figures.CHAR_EM * figures.TITLE_FONT_PX <= figures.NARROW_CHART_PX
        assert spec["layout"]["margin"]["t"] >= figures.MODEBAR_PX + figures.TITLE_LINE_PX * len(lines), lines


def test_compare_page_colours_a_checkpoint_alike_in_both_charts_and_names_hooks_plainly(with_ckpts):
    at = ok(run({"page": "compare"}))
    acc, struct = chart_spec(at, "compare_curves"), chart_spec(at, "compare_structure_curves")
    colour = {t["name"]: t["line"]["color"] for t in acc["data"]}
    assert len(set(colour.values())) == len(colour)                                    # one colour each
    for t in struct["data"]:
        assert t["line"]["color"] == colour[t["name"]], t["name"]
    assert set(colour.values()) <= set(figures.CHECKPOINT_PALETTE)
    table = at.dataframe[0].value
    assert "encoding" not in table.columns                                              # every encoding is its name
    assert all(len(c) <= 16 for c in table.columns), list(table.columns)
    heads = [m.value for m in at.markdown if m.value.startswith("**ape**")]
    assert heads == ["**ape** · adds a table"]
    assert not any("hooks" in m.value for m in at.markdown)


@pytest.mark.parametrize("tab", ["On the image", "Heatmap", "All layers", "All heads"])
def test_download_buttons_say_what_they_hold(with_ckpts, tab):
    """The bias map's downloads, under every tab (the default one included: the caption there
    says the NPY download holds the raw values; issue 44, item 10)."""
    at = ok(run({"ckpt": "sape2+ape"}, {"bias_bias_tab": tab}))
    buttons = {b.proto.label: b.proto.help for b in at.get("download_button")}
    assert "CSV: shown map, normalised 0–1" in buttons
    assert "shape (2, 2, 8, 8)" in buttons["NPY: raw bias, all layers × heads"]
    labels = list(buttons)
    assert not any(lb in ("Data (CSV)",) or lb.startswith("Array (NPY") for lb in labels)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_says_what_it_shows(with_ckpts, page):
    at = ok(run({"page": page}))
    [box] = [e for e in at.expander if e.label == "What am I looking at?"]
    text = " ".join(m.value for m in box.markdown)
    assert "docs/encodings.md" in text and "arxiv.org" in text
    if page == "bias":
        assert all(w in text for w in ("SaPE²", "Bias row", "0 = near, 1 = far", "rescaled to 0–1"))


def test_narrow_screens_are_told_where_the_controls_are(with_ckpts):
    at = ok(run({"ckpt": "sape2+ape", "layer": "1", "head": "0"}))
    assert any(c.value.startswith("Showing layer 1, head 0.") and "sidebar" in c.value for c in at.caption)


def test_compare_says_what_it_loads(with_ckpts, monkeypatch):
    import streamlit as st
    said = []
    spinner = st.spinner

    def recording(text="", **kw):
        said.append(text)
        return spinner(text, **kw)

    monkeypatch.setattr(st, "spinner", recording)
    ok(run({"page": "compare"}))
    assert any(s.startswith("Loading 5 checkpoints") for s in said), said


# ----------------------------------------------------------------------------- warm-up at server start
@pytest.mark.slow
def test_the_server_imports_the_heavy_modules_before_any_visitor(app_checkpoint_dir, tmp_path):
    """`streamlit run app.py` finds app.py's `st.App`, whose lifespan starts pages/common/warmup.py:
    the server log says the imports are done while no browser has connected. (`VITPE_WARMUP=0`
    keeps it from starting: the next test; pages run without it: every AppTest here.)"""
    import time

    from benchmarks.harness import streamlit_server

    log = tmp_path / "server.log"
    with streamlit_server(app_checkpoint_dir, log=log, timeout=120, env={"VITPE_WARMUP": "1"}):
        deadline = time.monotonic() + 300    # 52 s seen in a loaded CI run
        while "warm-up done in" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        text = log.read_text()
    assert "warm-up done in" in text, text
    assert "failed" not in text and "Traceback" not in text, text


def test_warmup_wait_returns_at_once_where_nothing_started_it_and_after_it_ran(monkeypatch):
    from pages.common import warmup

    monkeypatch.setattr(warmup, "_started", False)
    monkeypatch.setattr(warmup, "_done", warmup.threading.Event())
    warmup.wait(timeout=0)                      # AppTest, or VITPE_WARMUP=0: nothing to wait for
    monkeypatch.setenv("VITPE_WARMUP", "0")
    warmup.start()
    assert not warmup._started
    monkeypatch.setenv("VITPE_WARMUP", "1")
    monkeypatch.setattr(warmup, "VISITOR_GRACE_S", 0.0)   # no visitor comes: torch at once
    warmup.start()
    warmup.start()                              # once per process
    warmup.wait()
    assert warmup._done.is_set() and warmup.seconds is not None
    assert [t for t in warmup.threading.enumerate() if t.name == "vitpe-warmup"] == []


def test_torch_is_imported_after_the_first_page_or_as_soon_as_a_run_needs_a_model(monkeypatch):
    """The warm-up imports torch after the first visitor's first page (drawn from a stored trace,
    without torch) was sent and `SETTLE_S` passed for the browser to draw it, not before; a run
    that needs a model first (`cache.load_model` -> `wait_for_torch`) lets it go at once and waits."""
    import threading
    import time

    from pages.common import warmup

    go, visitor, done = threading.Event(), threading.Event(), threading.Event()
    for name, value in (("_go", go), ("_visitor", visitor), ("_torch", done), ("_started", True), ("SETTLE_S", 0.05)):
        monkeypatch.setattr(warmup, name, value)
    warmup.page_sent()                      # a run ended before any visitor's first run: no timer
    time.sleep(0.2)
    assert not go.is_set()
    visitor.set()
    warmup.page_sent()
    assert not go.is_set() and go.wait(5)   # SETTLE_S after the first page
    go2 = threading.Event()
    monkeypatch.setattr(warmup, "_go", go2)
    threading.Timer(0.2, done.set).start()
    t0 = time.monotonic()
    warmup.wait_for_torch()                 # outside a script run: waits without drawing
    assert go2.is_set() and done.is_set() and time.monotonic() - t0 >= 0.15
    warmup.wait_for_torch()                 # done: at once


def test_a_waiting_visitor_is_told_what_the_warm_up_does_until_it_is_done(monkeypatch):
    """The blank page of a fresh install (issue: 25 s of a title alone while the kernel compiled):
    `wait` shows the stage at once and again as it changes, and stops when the warm-up is done."""
    import threading
    import time

    from pages.common import warmup

    done = threading.Event()
    monkeypatch.setattr(warmup, "_started", True)
    monkeypatch.setattr(warmup, "_done", done)
    monkeypatch.setattr(warmup, "SHOW_EVERY_S", 0.02)
    monkeypatch.setattr(warmup, "_stage", (warmup.COMPILING, time.monotonic()))
    seen: list[str] = []
    waiter = threading.Thread(target=warmup.wait, kwargs={"timeout": 5.0, "show": seen.append})
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive() and seen
    assert seen[0].startswith("Preparing the app: compiling the fused SaPE²/CoPE attention kernel")
    warmup._set_stage(warmup.FORWARD)
    deadline = time.monotonic() + 4
    while not any("first forward pass" in t for t in seen) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert any("first forward pass" in t for t in seen), seen     # the message follows the stage
    done.set()
    waiter.join(30)
    assert not waiter.is_alive()
    monkeypatch.setattr(warmup, "_done", threading.Event())         # a compile outlasts the usual limit
    monkeypatch.setattr(warmup, "_stage", (warmup.COMPILING, time.monotonic()))
    waiter = threading.Thread(target=warmup.wait, kwargs={"timeout": 0.01})
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()
    warmup._done.set()
    waiter.join(30)
    assert warmup.message() is None


def _warm_up_slot_page():
    import streamlit as st

    from pages.common import warmup
    warmup.wait_visibly()
    st.file_uploader("weights", key="after")


def test_the_page_keeps_its_place_whether_or_not_its_run_waited_for_the_warm_up(monkeypatch):
    """A run that waited for the warm-up and the next one put the page's widgets at the same
    place: a shift made Streamlit mount every widget again, and a file being uploaded into one
    was lost (a second uploader's, on a cold server)."""
    import threading

    from streamlit.testing.v1 import AppTest

    from pages.common import warmup

    def place(waits: bool) -> int:
        done = threading.Event()
        monkeypatch.setattr(warmup, "_done", done)
        if waits:
            threading.Timer(0.3, done.set).start()
        else:
            done.set()
        at = AppTest.from_function(_warm_up_slot_page, default_timeout=30).run()
        assert not at.exception
        return [i for i, node in at.main.children.items() if getattr(node, "key", None) == "after"]

    monkeypatch.setattr(warmup, "_started", True)
    monkeypatch.setattr(warmup, "SHOW_EVERY_S", 0.02)
    assert place(waits=True) == place(waits=False) == [1]
    monkeypatch.setattr(warmup, "_started", False)                    # AppTest, VITPE_WARMUP=0: no slot
    assert place(waits=False) == [0]


_PAGE_IMPORTS_CHECK = r'''
import ast, importlib, importlib.util, sys
from pathlib import Path
from pages.common import warmup


def module_level_imports(files):
    """Import what `files` import at module level (what a page run imports first); the modules that were new."""
    before = set(sys.modules)
    for f in files:
        package = "pages.common" if f.parent.name == "common" else "pages"
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                spec = importlib.util.find_spec(base)
                targets = [base] + ([f"{base}.{a.name}" for a in node.names]
                                    if spec.submodule_search_locations is not None else [])
            else:
                continue
            for name in targets:
                if importlib.util.find_spec(name) is not None:
                    importlib.import_module(name)
    return sorted(m for m in set(sys.modules) - before if not m.startswith("_"))


for name in warmup.CHARTING + warmup.PAGE_MODULES:
    importlib.import_module(name)
for heavy in ("torch", "pandas"):
    assert heavy not in sys.modules, f"a module of warmup.PAGE_MODULES imports {heavy}: the first page would wait"
print("first page:", module_level_imports([Path("pages/bias.py")]))
for name in warmup.LATER_MODULES:
    importlib.import_module(name)
pages = [*sorted(Path("pages").glob("*.py")), *sorted(Path("pages/common").glob("*.py"))]
print("other pages:", module_level_imports(pages))
'''


@pytest.mark.slow
def test_the_warmup_imports_every_module_the_pages_import_first():
    """warmup.PAGE_MODULES is kept by hand: a module the default page (pages/bias.py)
    imports at module level and the list leaves out would be imported by the first visitor instead
    of the warm-up; none of them may import torch or pandas (the first page is drawn before them: a
    page importing them at module level shows up here as their modules). With LATER_MODULES (pandas,
    imported after the first page) the warm-up covers every page. Imports inside functions (the
    import form's importers, say) are lazy on purpose and not checked."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", _PAGE_IMPORTS_CHECK], cwd=root, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    first, other = out.stdout.strip().splitlines()[-2:]
    assert first == "first page: []", (
        f"imported by the default page but not by the warm-up's first step (add them to pages/common/warmup.py "
        f"PAGE_MODULES, or import torch and pandas lazily): {out.stdout}")
    assert other == "other pages: []", f"imported by a page but not by the warm-up (LATER_MODULES): {out.stdout}"


@pytest.mark.parametrize("path, query, base, target", [
    ("/pages/compare", "show=ape", "", "/compare?show=ape"),       # the repo's folder name typed in
    ("/compare/", "", "", "/compare"),
    ("/a/b/c", "patch=1,1", "", "/?patch=1,1"),                    # no page named: the default, same query
    ("/compare", "x=1", "", None),                                 # a page or the root: served as it is
    ("/", "", "", None),
    ("/static/js/main.js", "", "", None),                          # Streamlit's own routes
    ("/_stcore/health", "", "", None),
    ("/media/abc.png", "", "", None),
    ("/app/static/x.png", "", "", None),
    ("/app/compare", "", "", "/compare"),
    ("/pages/definitions", "", "", "/definitions"),                # the text page is a page too
    ("/vitpe/compare", "", "vitpe", None),                         # below server.baseUrlPath: a page
    ("/vitpe/pages/bias", "", "/vitpe/", "/vitpe/"),               # the default page lives at the root only:
    ("/bias", "ckpt=ape", "", "/?ckpt=ape"),                       # its name was "Page not found" (issue 44 item 2)
    ("/pages/bias/", "", "", "/"),
    ("/vitpe/bias", "", "vitpe", "/vitpe/"),
    ("/other/compare", "", "vitpe", None),                         # outside the base: not ours
])
def test_deep_paths_redirect_to_the_page_they_name(path, query, base, target):
    from pages.common.paths import redirect_target

    assert redirect_target(path, query, base) == target


# ----------------------------------------------------------------------------- definitions (issue 31, item 4)
def test_the_definitions_open_as_a_page_of_the_app_with_the_document_rendered(with_ckpts):
    """The compare page's "Definitions" pointed at docs/encodings.md, a repository file that a
    served app does not have (a new tab on the bias explorer). The document is a page now,
    reached from `?page=definitions` as any page, its links into the repository kept as text."""
    from pages.common import definitions

    at = ok(run({"page": "definitions"}))
    assert at.title[0].value == "Definitions"
    text = "\n".join(m.value for m in at.markdown)
    assert "## Position encodings in vitpe" in text and "## Position-only kernels and the relative score" in text
    assert "](../" not in text and "README.md#" not in text                  # no link to a repository file
    assert not at.warning and not at.get("plotly_chart")
    assert definitions.URL_PATH not in PAGES                                 # not a view: share links unchanged


def test_every_link_to_the_definitions_points_at_the_app_page(with_ckpts):
    """The compare page links the page itself (st.page_link); the "What am I looking at?" texts
    link it relatively (`definitions`, beside the page's own address); none links into docs/."""
    from pages.common import explain

    at = ok(run({"page": "compare"}))
    [link] = [p for p in at.get("page_link") if "Definitions" in p.proto.label]
    assert link.proto.page == "definitions"
    for page in PAGES:
        text = explain.text(page)
        assert "](docs/" not in text and "[Definitions](definitions)" in text, page
    assert not any("](docs/" in m.value for m in at.markdown)


# ----------------------------------------------------------------------------- issue 31, items 6-8 and 10-14
def _import_upload(at: AppTest, name: str, data: bytes, labels: tuple[str, bytes] | None = None) -> AppTest:
    """Upload `data` as `name` (and a labels file) in the Checkpoints page's import form and press Import."""
    at.file_uploader(key="checkpoints_model_upload").set_value((name, data, "application/octet-stream"))
    if labels is not None:
        at.file_uploader(key="checkpoints_model_labels").set_value((labels[0], labels[1], "text/plain"))
    ok(at.run())
    at.button(key="checkpoints_model_import").click()
    return ok(at.run())


def _small_vit(num_classes: int = 3, img_size: int = 32):
    from vitpe_core import ViTConfig, build_model
    return build_model(ViTConfig(img_size=(img_size, img_size), patch_size=4, dim=32, depth=1, heads=1, mlp_dim=32,
                                 num_classes=num_classes))


@pytest.mark.parametrize("name, data", [
    ("vit.safetensors", bytes(range(256)) * 64),                       # random bytes
    ("notes.safetensors", b"These are my notes, not weights.\n" * 40),  # a text file renamed
    ("vit.npz", bytes(range(256)) * 64),
    ("vit.pth", bytes(range(256)) * 64),
])
def test_a_junk_weights_file_is_refused_by_its_own_name_in_plain_words(without_ckpts, name, data):
    """Issue 31 (6): "cannot read vitpe-import-fsw_l77w.safetensors as a state dict of tensors: Error
    while deserializing header: header too large" named a server temp file and quoted the parser."""
    at = _import_upload(ok(run({"page": "checkpoints"})), name, data)
    [error] = [e.value for e in at.error]
    assert error.startswith(f"{name} was not imported: {name} is not a readable"), error
    assert "again with" in error                                                   # what to do
    assert "vitpe-import-" not in error and "deserializ" not in error.lower() and "header too large" not in error


@pytest.fixture
def served_routing(monkeypatch):
    """Page switches as the server makes them: app.py turns Streamlit's pages-folder mode off when
    the server imports it (`_no_pages_folder_mode`); AppTest turns it on again before every run,
    so a run after a page switch ran the page's file alone, without app.py's sidebar."""
    from streamlit.runtime.pages_manager import PagesManager
    init = PagesManager.__init__

    def served(self, *args, **kw):
        init(self, *args, **kw)
        PagesManager.uses_pages_directory = False

    monkeypatch.setattr(PagesManager, "__init__", served)


def test_after_an_import_the_sidebar_and_the_page_count_the_same_checkpoints(with_ckpts, served_routing):
    """Issue 31 (7): the page said "(6 checkpoints)" while the sidebar, drawn before the import,
    said "5 found"; both now say what the lists hold (the import runs in the button's callback,
    before the sidebar is drawn)."""
    at = ok(run({"page": "checkpoints"}))
    assert any("(5 checkpoints in the folder)" in c.value for c in at.sidebar.caption)
    at = _import_upload(at, "vit.npz", _timm_npz(_small_vit()))
    assert "Imported as `vit-upload`" in at.success[0].value
    said = "5 checkpoints in the folder + 1 imported in this session"
    assert any(said in c.value for c in at.sidebar.caption), [c.value for c in at.sidebar.caption]
    assert any(said in c.value for c in at.main.caption), [c.value for c in at.main.caption]
    assert not any("found)" in c.value or "(6 checkpoints)" in c.value for c in at.caption)
    at.switch_page("pages/bias.py")
    ok(at.run())
    assert any(said in c.value for c in at.sidebar.caption)


def test_a_shared_upload_is_named_once(with_ckpts):
    """Issue 31 (8): "Showing the shared upload shared upload 688e8c7f2e90… (688e8c7f2e90)"."""
    at = ok(run({"ckpt": "sape2+ape"}))
    at.file_uploader(key="bias_upload").set_value(("photo.png", _png((48, 40), (10, 200, 90)), "image/png"))
    ok(at.run())
    image = _qp(at, "image")
    short = image.removeprefix("upload:")[:12]
    other = ok(run({"ckpt": "sape2+ape", "image": image}))                     # a visitor opening the link
    [showing] = [c.value for c in other.caption if c.value.startswith("Showing the shared upload")]
    assert showing == f"Showing the shared upload `{short}…` on every page of this session.", showing
    texts = [c.value for c in other.caption] + [other.selectbox(key="bias_image").format_func(image)]
    assert not any("shared upload shared upload" in t or t.count(short) > 1 for t in texts), texts
    assert other.selectbox(key="bias_image").format_func(image) == f"shared upload {short}…"


def _prediction(at: AppTest) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("Prediction:"))


def test_an_imported_models_prediction_does_not_pair_its_class_with_a_cifar_label(without_ckpts):
    """Issue 31 (10): "class 150 (89.9 %) — true class: cat" paired an imported model's class with a
    CIFAR-10 label. Unnamed classes say how to name them; a labels file names them; the CIFAR-10
    true class is said as another set unless the model's classes are CIFAR-10's."""
    at = _import_upload(ok(run({"page": "checkpoints"})), "vit.npz", _timm_npz(_small_vit(3)))
    at.switch_page("pages/bias.py")
    ok(at.run())
    text = _prediction(at)                                         # the first sample image: a CIFAR-10 cat
    assert "**class " in text and "labels file" in text
    assert "true class (CIFAR-10): cat — this model's classes are another set" in text, text
    assert "— true class: cat" not in text
    at.switch_page("pages/checkpoints.py")
    ok(at.run())
    at = _import_upload(at, "named.npz", _timm_npz(_small_vit(3)), ("labels.txt", b"tench\ngoldfish\nshark\n"))
    assert "Imported as `named-upload`" in at.success[0].value
    at.switch_page("pages/bias.py")
    ok(at.run())
    text = _prediction(at)
    assert any(f"**{n}**" in text for n in ("tench", "goldfish", "shark")) and "another set" in text, text
    at.switch_page("pages/checkpoints.py")
    ok(at.run())
    at = _import_upload(at, "wrong.npz", _timm_npz(_small_vit(4)), ("labels.json", b'{"0": "a", "1": "b"}'))
    assert "wrong.npz was not imported: labels.json names 2 classes, but the model's head has 4" in at.error[0].value


def test_a_cifar10_models_prediction_keeps_the_true_class(with_ckpts):
    at = ok(run({"ckpt": "sape2+ape"}))
    text = _prediction(at)
    assert text.endswith("— true class: cat") and "another set" not in text and "labels file" not in text
    # the top-5 as bars (no chart), the most probable first: the predicted class and its probability
    bars = [(p.proto.text, p.value) for p in at.get("progress")]
    assert len(bars) == 5 and [v for _, v in bars] == sorted((v for _, v in bars), reverse=True), bars
    top, p = re.match(r"Prediction: \*\*(.+?)\*\* \(([\d.]+) %\)", text).groups()
    assert bars[0][0] == f"{top} — {p} %" and bars[0][1] == int(float(p))        # the bar's length: whole percent
    assert not [c for c in at.get("plotly_chart") if c.proto.id.endswith("bias_top5")]


def test_the_encoding_column_keeps_the_shipped_rows_after_an_import(with_ckpts):
    """Issue 31 (11): one imported row made the table blank every shipped row's encoding."""
    at = ok(run({"page": "checkpoints"}))
    assert "encoding" not in at.dataframe[0].value.columns                  # every encoding is its name
    at = _import_upload(at, "vit.npz", _timm_npz(_small_vit()))
    table = at.dataframe[0].value
    assert table["encoding"].to_dict() == {"ape": "ape", "sape2+ape": "sape2+ape", "rope_mixed": "rope_mixed",
                                           "rpb": "rpb", "none": "none", "vit-upload": "ape"}


def test_a_model_without_a_bias_shows_its_attention_row_beside_the_image(with_ckpts):
    """Issue 31 (12): the bias column of a model without a bias was one info box and empty space."""
    at = ok(run({"ckpt": "ape"}))
    [right] = [c for c in at.columns if any("adds no attention bias" in i.value for i in c.info)]
    keys = [getattr(ch, "key", None) or ch.proto.id for ch in right.get("plotly_chart")]
    assert any(str(k).endswith("bias_attn_overlay") for k in keys), keys
    assert any(s.value == "Attention row of the full model" for s in right.subheader)
    assert len([c for c in at.get("plotly_chart") if c.proto.id.endswith("bias_attn_overlay")]) == 1   # drawn once
    at.session_state["bias_attn_tab"] = "Heatmap"                     # its other tab: the heatmap, in the same place
    ok(at.run())
    [right] = [c for c in at.columns if any("adds no attention bias" in i.value for i in c.info)]
    keys = [getattr(ch, "key", None) or ch.proto.id for ch in right.get("plotly_chart")]
    assert any(str(k).endswith("bias_attn_map") for k in keys) and not any("attn_overlay" in str(k) for k in keys)
    biased = ok(run({"ckpt": "rpb"}))                                    # a bias: the attention row stays below
    [right] = [c for c in biased.columns if any("bias_bias_overlay" in ch.proto.id for ch in c.get("plotly_chart"))]
    assert not any("bias_attn" in ch.proto.id for ch in right.get("plotly_chart"))


def test_a_shrunk_upload_says_so(with_ckpts):
    """Issue 31 (13): a 1400×1000 upload was described as "this 1024×731 px image"."""
    at = ok(run({"ckpt": "sape2+ape"}))
    at.file_uploader(key="bias_upload").set_value(("big.png", _png((1400, 1000)), "image/png"))
    ok(at.run())
    said = "your 1400×1000 image, shrunk to 1024×731 px for the server"
    assert any(said in c.value for c in at.caption), [c.value for c in at.caption]
    [note] = [i.value for i in at.info if "left out" in i.value]
    # the box in the visitor's pixels (issue 44, item 9: it said 731×731 "of your 1400×1000 image")
    assert f"centred 999×1000 px of {said}" in note and "this 1024×731" not in note, note
    assert at.session_state["_vitpe_upload"]["original"] == (1400, 1000)
    at.radio(key="bias_fit").set_value("pad")
    ok(at.run())
    assert any(f"Padded: the whole image ({said})" in c.value for c in at.caption)
    small = ok(run({"ckpt": "sape2+ape"}))
    small.file_uploader(key="bias_upload").set_value(("red.png", _png(), "image/png"))
    ok(small.run())
    assert not any("shrunk" in c.value for c in small.caption)


def _csv_downloads(monkeypatch) -> dict[str, bytes]:
    """file name -> bytes of every CSV download button a run draws (their data is computed on click)."""
    import streamlit as st
    drawn, button = {}, st.download_button

    def recording(label, data=None, file_name=None, **kw):
        if str(file_name).endswith(".csv"):
            drawn[file_name] = data
        return button(label, data=data, file_name=file_name, **kw)

    monkeypatch.setattr(st, "download_button", recording)
    return drawn


def _rows(data) -> list[list[str]]:
    import csv
    raw = data() if callable(data) else data
    return list(csv.reader(io.StringIO(raw.decode())))


def test_csv_downloads_name_their_rows_and_columns(with_ckpts, monkeypatch):
    """Issue 31 (14): CSV downloads were bare grids."""
    drawn = _csv_downloads(monkeypatch)
    ok(run({"ckpt": "sape2+ape"}, HEATMAP))
    ok(run({"page": "similarity", "ckpt": "ape"}))
    ok(run({"page": "compare"}))
    csvs = {name: _rows(data) for name, data in drawn.items() if name != "checkpoints.csv"}
    assert len(csvs) >= 6, list(csvs)
    for name, rows in csvs.items():
        assert rows[0][0] != "", name                                                  # the corner says which is which
        assert all(not _is_number(h) for h in rows[0][1:]), (name, rows[0][:4])       # a header row
        assert all(not _is_number(r[0]) for r in rows[1:]), (name, [r[0] for r in rows[:4]])   # a header column
        assert len({len(r) for r in rows}) == 1, name
    [probs] = [rows for name, rows in csvs.items() if "probabilities" in name]
    assert probs[0] == ["class", *gallery.CIFAR10_CLASSES] and probs[1][0] == "probability"
    [attn] = [rows for name, rows in csvs.items() if "_attention_" in name]
    assert attn[0][:3] == ["patch row \\ patch column", "c0", "c1"] and [r[0] for r in attn[1:3]] == ["r0", "r1"]
    [matrix] = [rows for name, rows in csvs.items() if "similarity_matrix" in name]
    assert matrix[0][1:3] == ["r0c0", "r0c1"] and matrix[9][0] == "r1c0" and len(matrix) == 65   # 8x8 patches
    [fig7] = [rows for name, rows in csvs.items() if "figure7" in name]
    assert fig7[1][0] == "r0 i0" and fig7[9][0] == "gap" and fig7[0][1] == "c0 j0"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return text.lower() not in ("nan", "inf", "-inf")


def test_a_checkpoint_without_a_table_survives_the_similarity_compare_and_checkpoints_pages(with_ckpts):
    """Issue 44, item 3: the similarity page showed `ape` in place of a checkpoint without a table
    (an imported Swin-V2 or BEiT, or `rpb`) and made it the session's checkpoint, so the Bias
    explorer came back on `ape` and the link lost the model. It now shows `ape` there only."""
    at = ok(run({"page": "bias", "ckpt": "rpb"}))
    assert at.session_state["ckpt"] == "rpb"
    for page in ("similarity", "bias", "compare", "checkpoints", "bias"):
        at.switch_page(f"pages/{page}.py")
        ok(at.run())
        if page == "similarity":
            assert any("`rpb` has no position table; showing `ape`" in i.value for i in at.info)
            assert "ape" in chart_spec(at, "similarity_patch_map")["layout"]["title"]["text"]
        assert at.session_state["ckpt"] == "rpb", page
        assert at.query_params["ckpt"] in ("rpb", ["rpb"]), page
    assert "rpb" in chart_spec(at, "bias_attn_overlay")["layout"]["title"]["text"] or not at.warning
    at.switch_page("pages/similarity.py")
    ok(at.run())
    at.selectbox(key="similarity_ckpt").select("sape2+ape")            # a visitor's own pick does switch
    ok(at.run())
    assert at.session_state["ckpt"] == "sape2+ape"
