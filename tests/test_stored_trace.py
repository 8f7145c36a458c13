"""The trace stored beside a checkpoint (vitpe_core/stored_trace.py): the app's first page of a
checkpoint is drawn from it without the model or torch, so it must be the model's own trace, and
it must never be used for another checkpoint file, another image or a damaged file."""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vitpe_core import ViTConfig, build_model
from vitpe_core.checkpoint import load_checkpoint, save_checkpoint, update_metrics
from vitpe_core.gallery import gallery_ids
from vitpe_core.stored_trace import read_trace, trace_first_image, trace_path, write_trace

REPO = Path(__file__).resolve().parents[1]


def _saved(tmp_path: Path, encoding: str) -> Path:
    torch.manual_seed(0)
    cfg = ViTConfig(img_size=(32, 32), patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, encoding=encoding)
    return save_checkpoint(tmp_path / f"{encoding}.safetensors", build_model(cfg).eval())


def _same(a, b) -> None:
    assert (a.grid, a.num_prefix, a.prefix, a.hooks, a.bias_sources) == (b.grid, b.num_prefix, b.prefix, b.hooks,
                                                                        b.bias_sources)
    assert set(a.parts) == set(b.parts) and (a.bias is None) == (b.bias is None)
    pairs = [(a.logits, b.logits), (a.attn, b.attn), (a.bias, b.bias), *((a.parts[k], b.parts[k]) for k in a.parts)]
    for x, y in pairs:
        if x is not None:
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("encoding", ["sape2+rpb", "ape"])
def test_a_stored_trace_reads_back_as_the_models_own(tmp_path, encoding):
    path = _saved(tmp_path, encoding)
    image, trace = trace_first_image(load_checkpoint(path))
    assert image == gallery_ids()[0]
    assert write_trace(path, image, trace) == trace_path(path) == tmp_path / f"{encoding}.trace.npz"
    _same(read_trace(path, image), trace)
    assert trace.bias_sources == (("sape2", "rpb") if encoding == "sape2+rpb" else ())


def test_a_stored_trace_is_not_used_for_another_image_file_or_a_damaged_one(tmp_path, caplog):
    path = _saved(tmp_path, "rpb")
    image, trace = trace_first_image(load_checkpoint(path))
    assert read_trace(path, image) is None                       # none written yet
    write_trace(path, image, trace)
    assert read_trace(path, gallery_ids()[1]) is None            # another image
    update_metrics(path, {"note": "retrained"})                  # the checkpoint file changed: stale
    assert read_trace(path, image) is None
    write_trace(path, image, trace)
    assert read_trace(path, image) is not None
    trace_path(path).write_bytes(trace_path(path).read_bytes()[:1000])   # cut short
    with caplog.at_level(logging.WARNING, logger="vitpe_core.stored_trace"):
        assert read_trace(path, image) is None
    assert "not used" in caplog.text


def test_the_apps_trace_takes_the_stored_one_without_loading_the_model(tmp_path, monkeypatch):
    from pages.common import cache

    path = _saved(tmp_path, "sape2+ape")
    image, trace = trace_first_image(load_checkpoint(path))
    write_trace(path, image, trace)
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path))
    cache._trace.clear()

    def no_model(ref):
        raise AssertionError("the model was loaded for a stored trace")

    monkeypatch.setattr(cache, "load_model", no_model)
    assert cache.has_stored_trace("sape2+ape", image) and not cache.has_stored_trace("sape2+ape", gallery_ids()[1])
    _same(cache.trace("sape2+ape", image), trace)
    cache._trace.clear()


NO_TORCH_FIRST_PAGE = r'''
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("the first page imported torch")
sys.meta_path.insert(0, NoTorch())
from streamlit.testing.v1 import AppTest
for query in ({}, {"ckpt": "ape"}, {"ckpt": "long/sape2", "patch": "1,6", "layer": "3"}):
    at = AppTest.from_file(sys.argv[1], default_timeout=120)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, (query, [e.value for e in at.exception])
    assert not at.error, (query, [e.value for e in at.error])
    print(query, len(at.get("plotly_chart")), "torch" in sys.modules)
'''


@pytest.mark.skipif(not (REPO / "checkpoints" / "ape.trace.npz").is_file(), reason="no stored traces shipped")
def test_the_first_page_of_a_shipped_checkpoint_is_drawn_without_torch():
    """The bias explorer's default view of each shipped checkpoint (any patch, layer, head) reads
    only the checkpoint's header and its stored trace: drawn in a process where importing torch
    fails (the warm-up imports torch once this page is drawn; BENCHMARKS.md section 4)."""
    out = subprocess.run([sys.executable, "-c", NO_TORCH_FIRST_PAGE, str(REPO / "app.py")], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3 and all(line.endswith(" False") for line in lines), out.stdout
    assert all(int(line.split()[-2]) >= 2 for line in lines), out.stdout   # picker, (bias,) attention
