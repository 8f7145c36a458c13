"""An import holds a model once (issue 30): the importers build the ViT on the meta device
(`model.empty_model`) and the weights are assigned, not copied into freshly initialised
parameters. Before, a ViT-B/16 in float32 was held twice during the import (its random
parameters and the file's weights), and a float16 file three times (its weights, their float32
copy and the random parameters): a visitor's import took the server's peak ~1 GB higher."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vitpe_core.checkpoint import CheckpointError, load_weights
from vitpe_core.config import ViTConfig
from vitpe_core.importers import import_state_dict
from vitpe_core.model import build_model, empty_model

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(img_size=(32, 32), patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=5)


@pytest.mark.parametrize("encoding", ["ape", "sincos2d", "rope_axial", "sape2+ape", "rpb"])
def test_an_empty_model_filled_by_assignment_equals_the_model_it_was_given(encoding):
    cfg = ViTConfig(**SMALL, encoding=encoding)
    torch.manual_seed(0)
    full = build_model(cfg).eval()
    empty = empty_model(cfg)
    assert all(p.is_meta for n, p in empty.named_parameters() if not n.startswith("pos_enc."))
    weights = {k: v.clone() for k, v in full.state_dict().items()}
    load_weights(empty, weights, "test", assign=True)
    assert not any(t.is_meta for t in (*empty.parameters(), *empty.buffers()))   # computed buffers too
    assert empty.blocks[0].attn.qkv.weight.data_ptr() == weights["blocks.0.attn.qkv.weight"].data_ptr()  # no copy
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(empty.eval()(x), full(x), rtol=0, atol=0)


def test_a_weight_left_out_is_named_not_left_on_the_meta_device():
    cfg = ViTConfig(**SMALL)
    weights = dict(build_model(cfg).state_dict())
    del weights["head.bias"]
    with pytest.raises(CheckpointError, match=r"missing keys \['head.bias'\]"):
        load_weights(empty_model(cfg), weights, "test", assign=True)


PEAK = r"""
import json, sys, tempfile, pathlib
import numpy as np
sys.path.insert(0, sys.argv[1])
from vitpe_core.importers import import_checkpoint, import_file
path, how = pathlib.Path(sys.argv[2]), sys.argv[3]
def hwm_kb():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
open("/proc/self/clear_refs", "w").write("5")     # the high-water mark starts here
before = hwm_kb()
if how == "checkpoint":                           # the CLI's `import`: the file read, the checkpoint written
    imp = import_checkpoint(path, path.with_name("imported.safetensors"))
else:
    imp = import_file(path, hold=how == "hold")
print(json.dumps({"rise_mb": (hwm_kb() - before) / 1024, "dtype": str(imp.source_dtype)}))
"""


def _timm_file(tmp_path: Path, dtype: str) -> tuple[Path, float]:
    """A ViT of 61 MB in float32 in timm's npz layout, its weights in `dtype`; (path, float32 MB)."""
    cfg = ViTConfig(img_size=(64, 64), patch_size=8, dim=512, depth=5, heads=8, mlp_dim=2048, num_classes=10)
    torch.manual_seed(0)
    sd = {("pos_embed" if k.endswith("pos_embed") else k): v for k, v in build_model(cfg).state_dict().items()}
    model_mb = sum(v.numel() for v in sd.values()) * 4 / 2**20
    assert model_mb > 40
    path = tmp_path / "vit.npz"
    np.savez(path, **{k: v.numpy().astype(dtype) for k, v in sd.items()})
    return path, model_mb


def _peak(path: Path, how: str) -> dict:
    """`PEAK` in a fresh process: the import (`how`: "hold", "-", or "checkpoint") of `path`."""
    out = subprocess.run([sys.executable, "-c", PEAK, str(REPO), str(path), how],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow                       # a fresh process each, importing a 61 MB model
@pytest.mark.parametrize(("dtype", "hold", "limit"), [("float32", False, 1.35), ("float16", False, 1.2),
                                                     ("float16", True, 0.75)])
def test_importing_a_timm_file_raises_the_peak_by_about_the_model_once(tmp_path, dtype, hold, limit):
    """A ViT of 61 MB in float32 (timm's npz layout) imported in a fresh process: the resident
    high-water mark rises by at most 1.35x the float32 model for a float32 file (it was 2x), and
    1.2x for a float16 one: its weights (0.5x) leave one tensor at a time as their float32 copies
    (the model) arrive (`foreign.upcast`; both held whole were 1.62x, and 2.5x before the
    model was built empty). Held in float16 (`hold=True`, the app's imports) the layer weights
    never have a float32 copy: at most 0.75x (the file's 0.5x, the float32 tensors beside them,
    the reader's buffers), where building in float32 and then holding it rose by 1.2x."""
    path, model_mb = _timm_file(tmp_path, dtype)
    got = _peak(path, "hold" if hold else "-")
    assert got["dtype"] == f"torch.{dtype}"
    assert got["rise_mb"] <= limit * model_mb + 16, (got, model_mb)


@pytest.mark.slow                       # a fresh process each, importing a 61 MB model
@pytest.mark.parametrize(("dtype", "limit"), [("float32", 1.35), ("float16", 0.75)])
def test_the_clis_import_writes_the_checkpoint_within_the_imports_own_peak(tmp_path, dtype, limit):
    """`python -m vitpe_core import` (`import_checkpoint`) of the same 61 MB ViT: reading the file,
    building the model and writing the checkpoint together raise the high-water mark no more
    than the import alone (float32 1.35x, float16 0.75x). Before, the float16 file's model was
    built in float32 and the checkpoint's bytes were made in memory before they were written:
    2.6x for float16, 3.1x for float32 (measured at b87b6a0)."""
    path, model_mb = _timm_file(tmp_path, dtype)
    got = _peak(path, "checkpoint")
    assert got["dtype"] == f"torch.{dtype}"
    assert got["rise_mb"] <= limit * model_mb + 16, (got, model_mb)
    assert (tmp_path / "imported.safetensors").is_file()


@pytest.mark.slow                       # a fresh process, importing a 105 MB (float32) Swin-T
def test_a_float16_swin_import_raises_the_peak_by_less_than_its_file(tmp_path):
    """A Hugging Face Swin-T (random weights, transformers' own layout and config.json) in
    float16, imported held in a fresh process (the app's imports): the Swin is built on the meta
    device and its layer weights kept in float16, so the high-water mark rises by at most 0.75x
    its float32 size. Before, the Swin was built in float32 and all its weights were copied to
    float32 at once before they were loaded: 2.7x (282 MB for this model, measured at b87b6a0)."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_file

    cfg = transformers.SwinConfig(image_size=224, embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                                  window_size=7, num_labels=100)
    torch.manual_seed(0)
    sd = {k: v.contiguous() for k, v in transformers.SwinForImageClassification(cfg).state_dict().items()}
    model_mb = sum(v.numel() for v in sd.values() if v.is_floating_point()) * 4 / 2**20
    path = tmp_path / "swin.safetensors"
    save_file({k: v.half() if v.is_floating_point() else v for k, v in sd.items()}, str(path))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    del sd
    got = _peak(path, "hold")
    assert got["dtype"] == "torch.float16"
    assert got["rise_mb"] <= 0.75 * model_mb + 16, (got, model_mb)


def _reference_cases() -> list[tuple[str, dict, dict]]:
    """(name, state dict, import options) of the committed reference files: timm's ViT layouts
    (one at another image size: its table resampled) and timm's BEiT, EVA-02, CLIP, DINOv3 and
    Swin layouts with their config.json."""
    from test_importers import AMBIGUOUS, CASES, HEADS, META, MODEL_CASES
    from test_importers_timm_families import CASES as FAMILY_CASES, META as FAMILY_META
    sd = lambda ref: {k[3:]: v for k, v in ref.items() if k.startswith("sd.")}
    out = [(c, sd(CASES[c]), {"img_size": tuple(META[c]["input"]), "family": AMBIGUOUS.get(c, "auto"),
                              "heads": HEADS}) for c in MODEL_CASES]
    out.append(("timm_resampled", sd(CASES[MODEL_CASES[0]]), {"img_size": (48, 40), "heads": HEADS}))
    return out + [(c, sd(FAMILY_CASES[c]), {"hf_config": FAMILY_META[c]["config"]}) for c in FAMILY_META]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_spending_the_files_tensors_leaves_every_weight_as_it_was(dtype):
    """`import_state_dict(consume=True)` (`import_file`'s: the tensors it read) empties them as
    their float32 copies are made, and the model is bit for bit the one built from a copy it
    keeps; a caller's own state dict (the default) is never touched."""
    for name, sd, kw in _reference_cases():
        half = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
        mine = {k: v.clone() for k, v in half.items()}
        kept = import_state_dict(mine, **kw).model.state_dict()
        assert all(torch.equal(mine[k], half[k]) for k in half), name                 # untouched
        spent = import_state_dict(mine, consume=True, **kw).model.state_dict()
        assert kept.keys() == spent.keys(), name
        assert all(kept[k].dtype == spent[k].dtype and torch.equal(kept[k], spent[k]) for k in kept), name
        assert all(v.numel() == 0 for v in mine.values() if v.is_floating_point()), name   # Swin's too


@pytest.mark.parametrize("dtype, hold", [(torch.float32, False), (torch.float16, True)])
def test_a_callers_state_dict_and_the_imported_model_share_no_memory(dtype, hold):
    """`import_state_dict` of a caller's own state dict (a notebook's `timm_model.state_dict()`)
    loads its weights by assignment; the model then takes memory of its own (`own_memory`):
    changing the caller's tensors in place changes nothing in the model, in float32 and in the
    half precision it holds, in every reference layout (Swin's too)."""
    for name, sd, kw in _reference_cases():
        mine = {k: (v.to(dtype) if v.is_floating_point() else v).clone() for k, v in sd.items()}
        model = import_state_dict(mine, hold=hold, **kw).model
        theirs = {v.untyped_storage().data_ptr() for v in mine.values() if v.numel()}
        weights = model.state_dict()
        shared = [k for k, v in weights.items() if v.numel() and v.untyped_storage().data_ptr() in theirs]
        assert not shared, (name, shared[:4])
        before = {k: v.clone() for k, v in weights.items()}
        x = torch.randn(1, 3, *model.cfg.img_size, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            out = model(x)
            for v in mine.values():
                if v.is_floating_point():
                    v.add_(1)
            assert torch.equal(model(x), out), name             # no tensor of theirs is used, kept anywhere
        assert all(torch.equal(weights[k], v) for k, v in before.items()), name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_file_imported_held_is_its_float32_import_bit_for_bit(dtype, tmp_path):
    """`import_state_dict(hold=True)` (the app's and the CLI's imports) loads the layer weights in
    the file's precision and holds them (`held_precision`); every weight the model computes with is
    the float32 import's, bit for bit, in every reference layout (Swin's too), with or without the
    file's tensors spent; and `save_checkpoint` writes the float32 import's names, tensors and
    dtypes for it, in the file's precision and in float32 (the CLI's checkpoint is the same file)."""
    from vitpe_core.checkpoint import read_checkpoint_file, save_checkpoint
    from vitpe_core.held_precision import held_dtype

    def saved(model, stored):
        return read_checkpoint_file(save_checkpoint(tmp_path / "m.safetensors", model, dtype=stored))[1]

    for name, sd, kw in _reference_cases():
        half = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
        want = import_state_dict(dict(half), **kw).model
        for consume in (False, True):
            held = import_state_dict({k: v.clone() for k, v in half.items()}, hold=True, consume=consume, **kw).model
            assert held_dtype(held) == dtype, name
            for key, value in want.state_dict().items():
                prefix, _, leaf = key.rpartition(".")
                got = getattr(held.get_submodule(prefix), leaf)
                assert got.dtype == value.dtype and torch.equal(got, value), (name, key)
            stored = [t for t in held.state_dict().values() if t.is_floating_point()]
            assert any(t.dtype == dtype for t in stored) and all(t.dtype in (dtype, torch.float32) for t in stored)
        for stored in (dtype, torch.float32):
            want_file, held_file = saved(want, stored), saved(held, stored)
            assert held_file.keys() == want_file.keys(), (name, sorted(set(held_file) ^ set(want_file))[:4])
            assert all(held_file[k].dtype == v.dtype and torch.equal(held_file[k], v) for k, v in want_file.items()), (
                name, stored)


def test_a_held_weight_that_is_a_view_of_a_larger_tensor_is_copied_not_kept_with_it():
    """`upcast(keep=…)` keeps a weight in the file's precision without a copy only where the tensor
    is all of its memory: a view would keep the whole buffer alive."""
    from vitpe_core.foreign import upcast
    flat = torch.randn(30).half()
    whole, part = torch.randn(4).half(), flat[:10]
    weights = {"whole": whole, "part": part, "other": torch.randn(2).half()}
    got = upcast(weights, keep=({"whole", "part"}, torch.float16))
    assert got["whole"] is whole and got["part"].dtype == torch.float16 and torch.equal(got["part"], part)
    assert got["part"].untyped_storage().nbytes() == 20 and got["other"].dtype == torch.float32


def test_weights_that_share_one_buffer_are_each_copied_before_it_is_let_go():
    """A torch file may hold views of one storage (a flattened parameter buffer): the buffer goes
    only once its last view is converted, and every weight is still the file's."""
    cfg = ViTConfig(**SMALL)
    torch.manual_seed(0)
    sd = {("pos_embed" if k.endswith("pos_embed") else k): v.half() for k, v in build_model(cfg).state_dict().items()}
    flat = torch.cat([v.flatten() for v in sd.values()])
    views, at = {}, 0
    for k, v in sd.items():
        views[k] = flat[at:at + v.numel()].view(v.shape)
        at += v.numel()
    del flat
    kept = import_state_dict(dict(sd), heads=2).model.state_dict()
    spent = import_state_dict(views, heads=2, consume=True).model.state_dict()
    assert all(torch.equal(kept[k], spent[k]) for k in kept)


def test_upcast_copies_every_weight_before_the_memory_they_share_goes():
    """Views of one buffer and one tensor under two names: each weight is copied before any of
    it is emptied; a float32 weight is the model's own and stays."""
    from vitpe_core.foreign import upcast
    flat = torch.randn(30).half()
    a, b, own = flat[:10], flat[10:].view(4, 5), torch.ones(3)
    weights = {"a": a, "b": b, "a again": a, "own": own}
    want = {k: v.float().clone() for k, v in weights.items()}
    got = upcast(weights, {"flat": flat, "left out": torch.zeros(2).half(), **weights})
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert got["own"] is own and own.numel() == 3
    assert a.numel() == b.numel() == flat.numel() == 0
