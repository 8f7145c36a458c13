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


def z_of(spec: dict) -> np.ndarray:
    """The first trace's z; Plotly >= 6 sends numpy arrays as base64 typed arrays."""
    z = spec["data"][0]["z"]
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
    assert [t.label for t in at.tabs] == ["On the image", "Heatmap", "All layers", "All heads"]
    for label, key in (("All layers", "bias_bias_layers"), ("All heads", "bias_bias_heads"),
                       ("Heatmap", "bias_bias_map")):
        at.session_state["bias_bias_tab"] = label
        ok(at.run())
        assert chart_keys(at) == {key}, label
    at.session_state["patch"] = (0, 1)
    ok(at.run())
    assert chart_keys(at) == {"bias_bias_map"}                      # the tab stays open across a click
    assert len(chart_spec(at, "bias_bias_map")["layout"]["shapes"]) == 1


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
    assert at.query_params["ckpt"] in ("ape", "sape2+ape")
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
    mine = chart_spec(at, "bias_attn_map")["data"][0]["z"]
    other = ok(run(link))                                          # a new AppTest = a new browser session
    assert not other.warning, [w.value for w in other.warning]
    assert other.session_state["image"] == link["image"] and other.session_state["patch"] == (2, 5)
    assert other.session_state["layer"] == 1
    assert chart_spec(other, "bias_attn_map")["data"][0]["z"] == mine    # the same image through the model
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
    mine = chart_spec(at, "bias_attn_map")["data"][0]["z"]
    other = ok(run(link))                                          # another visitor, another session
    assert not other.warning, [w.value for w in other.warning]
    assert other.session_state["ckpt"] == "shared-upload" and other.session_state["patch"] == (2, 6)
    assert other.selectbox(key="bias_ckpt").value == "shared-upload"
    assert chart_spec(other, "bias_attn_map")["data"][0]["z"] == mine
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
    assert z_of(chart_spec(at, "bias_attn_map")).shape == (14, 14)
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
    cropped = z_of(chart_spec(at, "bias_attn_map"))
    at.radio(key="bias_fit").set_value("pad")
    ok(at.run())
    assert not [i for i in at.info if "left out" in i.value]
    assert any("Padded: the whole 640×427 px image" in c.value for c in at.caption)
    assert not np.allclose(cropped, z_of(chart_spec(at, "bias_attn_map")))             # the model sees another input
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


def test_download_buttons_say_what_they_hold(with_ckpts):
    at = ok(run({"ckpt": "sape2+ape"}, HEATMAP))                                     # the bias map's downloads
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
    the server log says the imports are done while no browser has connected; with
    `VITPE_WARMUP=0` it never does, and the app still answers."""
    import time

    from benchmarks.harness import streamlit_server

    for setting, expected in (("1", True), ("0", False)):
        log = tmp_path / f"server-{setting}.log"
        with streamlit_server(app_checkpoint_dir, log=log, timeout=120, env={"VITPE_WARMUP": setting}):
            deadline = time.monotonic() + (300 if expected else 5)   # 52 s seen in a loaded CI run
            while "warm-up done in" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            text = log.read_text()
        assert ("warm-up done in" in text) is expected, text
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
    warmup.start()
    warmup.start()                              # once per process
    warmup.wait()
    assert warmup._done.is_set() and warmup.seconds is not None
    assert [t for t in warmup.threading.enumerate() if t.name == "vitpe-warmup"] == []


_PAGE_IMPORTS_CHECK = r'''
import ast, importlib, importlib.util, sys
from pathlib import Path
from pages.common import warmup
for name in warmup.MODULES:
    importlib.import_module(name)
before = set(sys.modules)
for f in [*sorted(Path("pages").glob("*.py")), *sorted(Path("pages/common").glob("*.py"))]:
    package = "pages.common" if f.parent.name == "common" else "pages"
    for node in ast.parse(f.read_text()).body:                 # module level: what a page run imports first
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
print(sorted(m for m in set(sys.modules) - before if not m.startswith("_")))
'''


@pytest.mark.slow
def test_the_warmup_imports_every_module_the_pages_import_first():
    """warmup.MODULES is kept by hand: a module a page imports at module level and the list
    leaves out would be imported by the first visitor instead of the warm-up. Imports inside
    functions (the import form's importers, say) are lazy on purpose and not checked."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", _PAGE_IMPORTS_CHECK], cwd=root, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", (
        f"imported by the pages but not by the warm-up (add them to pages/common/warmup.py MODULES): {out.stdout}")


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
    ("/vitpe/compare", "", "vitpe", None),                         # below server.baseUrlPath: a page
    ("/vitpe/pages/bias", "", "/vitpe/", "/vitpe/bias"),
    ("/other/compare", "", "vitpe", None),                         # outside the base: not ours
])
def test_deep_paths_redirect_to_the_page_they_name(path, query, base, target):
    from pages.common.paths import redirect_target

    assert redirect_target(path, query, base) == target
