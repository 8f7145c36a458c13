"""Hold a half-precision model's weights in their file's precision, compute in float32.

An imported float16 (or bfloat16) file becomes a float32 model: the upcast is exact and every
computation runs in float32. Held that way a ViT-B/16 takes 330 MiB instead of its file's 165
(issue 30: the demo server's memory). `hold_weights` keeps the weights of the model's
`Linear`, `LayerNorm` and `Conv2d` layers in the file's precision and gives the layers their
float32 values each time they read them (a `torch.nn.utils.parametrize` parametrization: a
fresh float32 tensor per read, freed after the layer's step; nothing is swapped in place, so
several threads may run the same model at once). Numerically nothing changes: a weight is held
in half precision only where converting it back gives the same float32 bits (a float16 file's
weights all do; a table vitpe resampled does not and stays float32), and the position encoding
(`model.pos_enc`, read directly by the analysis pages) stays float32 whole. The importers load
those weights (`held_names`) in the file's precision when asked to hold them
(`import_state_dict(hold=True)`), so the float32 copy of the whole model never exists.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize

HELD = (nn.Linear, nn.LayerNorm, nn.Conv2d)
HALF = (torch.float16, torch.bfloat16)


class _Upcast(nn.Module):
    """The parametrization: the held tensor, as float32."""

    def forward(self, held: torch.Tensor) -> torch.Tensor:
        return held.float()


def hold_weights(model: nn.Module, dtype: torch.dtype) -> int:
    """Hold `model`'s layer weights (`HELD`, outside `model.pos_enc`) in `dtype` (float16 or
    bfloat16) where that is exact; returns the bytes saved against float32. A weight already in
    `dtype` (loaded so by an importer, `held_names`) is held as it is, never copied to float32.
    The model's outputs are bit-identical (tests/test_held_precision.py). For inference: the held
    tensors take no gradient."""
    if dtype not in HALF:
        raise ValueError(f"weights are held in float16 or bfloat16, not {dtype}")
    saved = 0
    for module in _held_layers(model):
        for name, p in list(module.named_parameters(recurse=False)):
            held = p.detach().to(dtype)                 # no copy where the importer loaded it in `dtype`
            if p.dtype != dtype and (p.dtype != torch.float32 or not torch.equal(held.float(), p.detach())):
                continue                                # not exact in `dtype`: stays float32
            parametrize.register_parametrization(module, name, _Upcast(), unsafe=True)
            module.parametrizations[name].original = nn.Parameter(held, requires_grad=False)
            saved += p.numel() * (4 - held.element_size())
    return saved


def held_names(model: nn.Module) -> set[str]:
    """The state-dict names of the weights `hold_weights` holds where they are exact: an importer
    loads these in the file's half precision (and only these: every other tensor of the model
    runs in float32), so that the float32 copy of a big model never exists."""
    names = {id(m): n for n, m in model.named_modules()}
    return {f"{names[id(m)]}.{p}".lstrip(".")
            for m in _held_layers(model) for p, _ in m.named_parameters(recurse=False)}


def _held_layers(model: nn.Module) -> list[nn.Module]:
    skip = set(getattr(model, "pos_enc", nn.Module()).modules())
    return [m for m in model.modules() if type(m) in HELD and m not in skip]


def held_dtype(model: nn.Module) -> torch.dtype | None:
    """The precision `hold_weights` holds the model's weights in, or None where it holds none."""
    for module in model.modules():
        if parametrize.is_parametrized(module):
            for plist in module.parametrizations.values():
                if isinstance(plist[0], _Upcast):
                    return plist.original.dtype
    return None
