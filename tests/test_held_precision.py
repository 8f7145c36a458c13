"""A half-precision model held in its file's precision computes exactly what its float32 model
computes (vitpe_core/held_precision.py), in about half the memory; the app's store holds a
visitor's float16 import that way (issue 30)."""
from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import torch

from vitpe_core.analysis import trace_image
from vitpe_core.config import ViTConfig
from vitpe_core.held_precision import hold_weights, held_dtype
from vitpe_core.model import build_model
from vitpe_core.store import model_bytes

SMALL = dict(img_size=(32, 32), patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64, num_classes=5)


def _half_exact_model(encoding: str, dtype=torch.float16):
    torch.manual_seed(0)
    model = build_model(ViTConfig(**SMALL, encoding=encoding)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).float())              # what an import of a half-precision file gives
    return model


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("encoding", ["ape", "sape2+ape", "rope_axial", "rpb_cls"])
def test_held_weights_give_the_same_bits_in_about_half_the_memory(encoding, dtype):
    model = _half_exact_model(encoding, dtype)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
    traced = trace_image(model, x[0])
    size = model_bytes(model)
    saved = hold_weights(model, dtype)
    assert held_dtype(model) == dtype and model_bytes(model) == size - saved
    layers = sum(p.numel() for n, p in model.named_parameters() if n.startswith("blocks."))
    assert saved >= 2 * layers * 0.9          # the blocks' weights went from 4 to 2 bytes each
    assert all(p.dtype == torch.float32 for p in model.pos_enc.parameters())   # the encoding stays whole
    with torch.no_grad():
        assert torch.equal(model(x), before)
    again = trace_image(model, x[0])
    assert np.array_equal(again.attn, traced.attn) and np.array_equal(again.logits, traced.logits)


def test_a_weight_that_is_not_exact_in_half_precision_stays_float32():
    model = _half_exact_model("ape")
    with torch.no_grad():
        model.head.weight[0, 0] = 0.1                 # not a float16 number
    hold_weights(model, torch.float16)
    assert model.head.weight.dtype == torch.float32
    assert model.head.parametrizations.bias.original.dtype == torch.float16   # its exact neighbour is held
    assert model.head.weight[0, 0].item() == torch.tensor(0.1).item()


def test_threads_running_one_held_model_each_get_its_output():
    model = _half_exact_model("sape2+ape")
    xs = [torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    with torch.no_grad():
        want = [model(x) for x in xs]
    hold_weights(model, torch.float16)
    got, errors = [None] * len(xs), []

    def run(i):
        try:
            with torch.no_grad():
                for _ in range(20):
                    got[i] = model(xs[i])
        except Exception as e:  # noqa: BLE001 — reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and all(torch.equal(g, w) for g, w in zip(got, want))


def test_float32_is_refused():
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        hold_weights(_half_exact_model("ape"), torch.float32)


def test_the_app_holds_a_float16_import_in_float16_and_a_float32_one_in_float32(tmp_path):
    """`model_import.import_upload` (the import form's path): the stored model of a float16 timm
    file is held in float16 and traces as its float32 import does; a float32 file's stays float32."""
    from pages.common import model_import
    from vitpe_core.importers import import_file

    torch.manual_seed(0)
    sd = build_model(ViTConfig(**SMALL, encoding="ape")).state_dict()
    timm = {("pos_embed" if k == "pos_enc.pos_embed" else k): v for k, v in sd.items()}   # timm's keys
    x = torch.rand(3, 32, 32)
    for dtype in (np.float16, np.float32):
        buf = io.BytesIO()
        np.savez(buf, **{k: v.numpy().astype(dtype) for k, v in timm.items()})
        path = tmp_path / f"m_{np.dtype(dtype).name}.npz"
        path.write_bytes(buf.getvalue())
        name, _ = model_import.import_upload(path.name, buf.getvalue(), heads=2)
        stored = model_import.model_store().get(model_import.uploaded_models()[name]).model
        reference = import_file(path, heads=2).model
        assert held_dtype(stored) == (torch.float16 if dtype is np.float16 else None)
        want, got = trace_image(reference, x), trace_image(stored, x)
        assert np.array_equal(got.attn, want.attn) and np.array_equal(got.logits, want.logits)
