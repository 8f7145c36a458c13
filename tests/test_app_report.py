"""The app's "Download this model's report (HTML)" (pages/common/report_button.py) through app.py in
AppTest: on the Checkpoints page and beside the bias explorer, for a folder checkpoint, an
uploaded image and an imported model. What is offered for download is read back: its footer's
content hash, its explorer's images. Checkpoints: conftest's `app_checkpoint_dir`."""
from __future__ import annotations

import hashlib
import io
import json
import re

import numpy as np
import pytest
from PIL import Image

from tests.test_app import APP, ok, run  # noqa: F401  (APP: the same router)

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def upload_dir(tmp_path, monkeypatch):
    folder = tmp_path / "uploads"
    monkeypatch.setenv("VITPE_UPLOAD_DIR", str(folder))
    return folder


def offered(at) -> tuple[str, dict]:
    """The report the session offers (its HTML) and its embedded data."""
    held = at.session_state["_vitpe_report"]
    html = held["data"].decode("utf-8")
    m = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    return html, json.loads(m.group(1))


def save_buttons(at) -> list[str]:
    return [b.proto.label for b in at.get("download_button") if "_report.html" in b.proto.label]


def build(at, page: str):
    assert not save_buttons(at)                          # nothing built before the click
    at.button(key=f"{page}_report_build").click()
    return ok(at.run())


def test_the_checkpoints_page_offers_a_folder_checkpoints_report(app_checkpoint_dir, monkeypatch):
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(app_checkpoint_dir))
    at = build(ok(run({"page": "checkpoints", "ckpt": "rpb"})), "checkpoints")
    [label] = save_buttons(at)
    assert label.startswith("Save rpb_report.html (")
    html, data = offered(at)
    sha = hashlib.sha256((app_checkpoint_dir / "rpb.safetensors").read_bytes()).hexdigest()
    assert f"<code id='content-hash'>{sha}</code>" in html and "vitpe report: rpb" in html
    assert len(data["explorer"]["images"]) == 4 and list(data["explorer"]["parts"]) == ["row"]
    at.selectbox(key="checkpoints_ckpt").set_value("ape")     # another model: built anew on its own click
    ok(at.run())
    assert not save_buttons(at)


def test_beside_the_bias_explorer_the_report_holds_the_uploaded_image(app_checkpoint_dir, monkeypatch):
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(app_checkpoint_dir))
    at = ok(run({"ckpt": "sape2+ape"}))
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(buf, "PNG")
    at.file_uploader(key="bias_upload").set_value(("noise.png", buf.getvalue(), "image/png"))
    ok(at.run())
    at = build(at, "bias")
    _, data = offered(at)
    images = data["explorer"]["images"]
    assert images[0]["key"] == at.session_state["image"] and images[0]["key"].startswith("upload:")
    assert "noise.png" in images[0]["label"] and len(images) == 4
    assert set(data["explorer"]["parts"]) == {"sum", "x", "y"}


def test_an_imported_models_report_names_its_uploaded_file(tmp_path, monkeypatch):
    from tests.test_app import _timm_npz
    from vitpe_core import ViTConfig, build_model

    monkeypatch.setenv("VITPE_CHECKPOINTS", str(tmp_path / "empty"))
    model = build_model(ViTConfig(img_size=(40, 40), patch_size=8, dim=32, depth=2, heads=2, mlp_dim=32,
                                  num_classes=3))
    weights = _timm_npz(model)
    at = ok(run({"page": "checkpoints"}))
    at.file_uploader(key="checkpoints_model_upload").set_value(("vit.npz", weights, "application/octet-stream"))
    ok(at.run())
    at.button(key="checkpoints_model_import").click()
    ok(at.run())
    at = build(at, "checkpoints")
    html, data = offered(at)
    assert f"<code id='content-hash'>{hashlib.sha256(weights).hexdigest()}</code>" in html
    assert "imported from vit.npz" in html and data["explorer"]["grid"] == [5, 5]
