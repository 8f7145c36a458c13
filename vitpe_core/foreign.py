"""Foreign weight files: a plain state dict from another tool's file, read without running code.

`read_state_dict` reads `.npz` (numpy, pickles refused), `.safetensors` (any metadata) and
torch files (`.pt .pth .bin .ckpt`, `torch.load(weights_only=True)`: tensors and containers
only, so a pickle that would run code is refused). A `.npz` is checked before numpy allocates
anything (`_check_npz`): a forged header must not make the server allocate gigabytes.
Every refusal is a `CheckpointError` naming the file (`name`: the name its owner knows, e.g. an
upload's, where the bytes sit in a temporary file) and saying in plain words what is wrong and
what to do; the parser's own message goes to the log only. vitpe's own checkpoints are read by
`checkpoint.load_checkpoint`; `importers` turns what this returns into a model, the file's
half-precision tensors converted by `upcast` (to float32 one at a time, or kept in their precision
for the weights a model holds so).
"""
from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Mapping

import numpy as np
import torch
from safetensors import safe_open

from .checkpoint import SUFFIX, CheckpointError, load_weights
from .held_precision import HALF, held_names, hold_weights
from .model import empty_model
from .swin.config import SwinConfig
from .swin.model import SwinTransformer

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
NPZ_MAX_EXPANSION = 20   # a compressed .npz may hold up to this many times its size (weights compress ~1.1x)
log = logging.getLogger(__name__)

# What an unreadable file of each kind is, and how to write a readable one.
UNREADABLE = {
    ".npz": ("a readable .npz file (a zip of .npy arrays: it is damaged or another kind of file)",
             "save the weights again with numpy.savez (timm's .npz checkpoints are read as they are)"),
    SUFFIX: ("a readable safetensors file (its header is damaged or it is another kind of file)",
             "export the weights again with safetensors.torch.save_file or model.save_pretrained"),
}
TORCH_UNREADABLE = ("a readable PyTorch weights file (it is damaged or another kind of file)",
                    "save the weights again with torch.save(model.state_dict(), PATH) or as .safetensors")
PICKLED = ("holds pickled Python objects besides tensors, and loading those would run code from the file, so it is "
           "refused; save only the weights with torch.save(model.state_dict(), PATH) or as .safetensors")


def unreadable(name: str, suffix: str) -> CheckpointError:
    """The error for a file `name` that does not parse as its `suffix` says."""
    what, todo = UNREADABLE.get(suffix, TORCH_UNREADABLE)
    return CheckpointError(f"{name} is not {what}; {todo}")


def _check_npz(path: Path, name: str) -> None:
    """Refuse an .npz whose arrays claim more data than the archive can hold, before numpy
    allocates them: each member's header (shape x dtype) must fit its stored size, and all
    together at most NPZ_MAX_EXPANSION x the file."""
    import zipfile

    from numpy.lib import format as npformat
    try:
        with zipfile.ZipFile(path) as zf:
            total = 0
            for info in zf.infolist():
                with zf.open(info) as f:
                    version = npformat.read_magic(f)
                    read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
                    shape, _, dtype = read(f, max_header_size=10_000)
                need = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
                if need > info.file_size:
                    raise CheckpointError(f"{name}: array {info.filename!r} claims {need:,} bytes but holds "
                                          f"{info.file_size:,}; the file is damaged or forged")
                total += need
    except CheckpointError:
        raise
    except Exception as e:   # not a zip, a member that is not .npy, a bad header
        log.info("unreadable .npz %s: %s", name, e)
        raise unreadable(name, ".npz") from None
    if total > NPZ_MAX_EXPANSION * max(1, path.stat().st_size):
        raise CheckpointError(f"{name}: its arrays would take {total:,} bytes, more than "
                              f"{NPZ_MAX_EXPANSION}x the file; refused")


def read_state_dict(path: str | Path, name: str | None = None) -> dict[str, torch.Tensor]:
    """A plain state dict from .npz, .safetensors or a weights-only torch file (no code runs);
    a torch file's `model` / `state_dict` / `model_state` entry is taken when it has one.
    `name`: the file's name in messages (default the path's)."""
    path = Path(path)
    name = name or path.name
    if path.suffix not in (".npz", SUFFIX, *TORCH_SUFFIXES):
        raise CheckpointError(f"{name}: expected timm weights as .npz, {SUFFIX} or a torch file "
                              f"({', '.join(TORCH_SUFFIXES)})")
    if path.is_file() and path.stat().st_size == 0:
        raise CheckpointError(f"{name} is empty (0 bytes); upload or pass the weights file itself")
    try:
        if path.suffix == ".npz":
            _check_npz(path, name)
            out = {}
            with np.load(path, allow_pickle=False) as z:   # one array at a time: never the file twice in memory
                for k in z.files:
                    a = z[k]
                    if a.dtype.kind in "fiub":
                        out[k] = torch.from_numpy(a if a.flags.writeable and a.flags.aligned else a.copy())
            return out
        if path.suffix == SUFFIX:
            with safe_open(str(path), framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except Exception as e:  # any failure to parse is the file's problem, said in plain words
        log.info("unreadable weights file %s: %s: %s", name, type(e).__name__, str(e).strip()[:300])
        if "Unsupported global" in str(e):  # objects, not tensors: torch's advice (weights_only=False) runs code
            raise CheckpointError(f"{name} {PICKLED}") from None
        raise unreadable(name, path.suffix) from None
    for key in ("model", "state_dict", "model_state"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{name} does not hold a flat dict of tensors (a state dict); save the weights with "
                              "torch.save(model.state_dict(), PATH)")
    return sd


def source_dtype(sd: Mapping[str, torch.Tensor]) -> torch.dtype:
    """The widest floating precision among the file's tensors (float32 if it has none)."""
    found = {v.dtype for v in sd.values() if v.is_floating_point()}
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        if dtype in found:
            return dtype
    return torch.float32


# ----------------------------------------------------------------------------- to the model's precision
def upcast(weights: Mapping[str, torch.Tensor], spent: Mapping[str, torch.Tensor] | None = None,
           keep: tuple[set[str], torch.dtype] | None = None) -> dict[str, torch.Tensor]:
    """`{k: v.float()}` (float16 / bfloat16 -> float32 is exact), one tensor at a time. `spent`:
    the state dict the weights were made from, where the importer owns it: its tensors and the
    weights' sources are emptied (`Tensor.set_()`) once no weight still to convert shares their
    memory, so that the file's half-precision tensors leave as their float32 copies arrive
    (issue 30: a ViT-B/16 in float16 held 165 + 330 MiB at once, the server's peak). `keep`
    (names, dtype): the weights of those names already in `dtype` stay in it (to be held,
    `held_precision`), each in memory of its own (a view of a larger tensor is copied)."""
    def convert(k: str, v: torch.Tensor) -> torch.Tensor:
        if keep is None or k not in keep[0] or v.dtype != keep[1]:
            return v.float()
        whole = v.is_contiguous() and v.untyped_storage().nbytes() == v.numel() * v.element_size()
        return v if whole else v.clone()

    if spent is None:
        return {k: convert(k, v) for k, v in weights.items()}
    pending = Counter(_memory(v) for v in weights.values())
    holders: dict[int, list[torch.Tensor]] = {}
    for t in {id(t): t for t in (*spent.values(), *weights.values())}.values():
        holders.setdefault(_memory(t), []).append(t)
    out: dict[str, torch.Tensor] = {}
    kept: set[int] = set()             # weights passed through (float32 already, or kept in `keep`): the model's now
    for mem in [m for m in holders if not pending[m]]:      # what no weight was made from (renamed, left out)
        _empty(holders.pop(mem), kept)
    for k, v in weights.items():
        out[k] = convert(k, v)
        if out[k] is v:
            kept.add(id(v))
        mem = _memory(v)
        pending[mem] -= 1
        if not pending[mem]:
            _empty(holders.pop(mem, []), kept)
    return out


def assigned_model(config, weights: Mapping[str, torch.Tensor], name: str, *,
                   spent: Mapping[str, torch.Tensor] | None = None, held: torch.dtype | None = None,
                   rename=None):
    """The model of `config` (a `ViTConfig` or `SwinConfig`) built on the meta device and filled
    with `weights` by assignment (strictly; never held twice: the weights are upcast to float32 one
    at a time, `spent`'s tensors emptied as they go, `upcast`), its layer weights held in `held`
    (float16 / bfloat16: `held_precision`) where given; `rename(model, weights)`: the weights' names
    as the built model has them. What the importers and the model store (`store.ModelStore`)
    build a model with."""
    if held is not None and held not in HALF:
        raise ValueError(f"held must be float16 or bfloat16, got {held}")
    if isinstance(config, SwinConfig):
        with torch.device("meta"):                        # no buffers: every tensor comes from the file
            model = SwinTransformer(config, init_weights=False)
    else:
        model = empty_model(config)
    if rename is not None:
        weights = rename(model, dict(weights))
    load_weights(model, upcast(weights, spent, held_keep(model, held)), name, assign=True)
    if held is not None:
        hold_weights(model, held)
    return model.eval()


def held_keep(model: torch.nn.Module, dtype: torch.dtype | None) -> tuple[set[str], torch.dtype] | None:
    """`upcast`'s `keep` for `model`: the weights `held_precision.hold_weights` will hold, in `dtype`
    (None: none held)."""
    return None if dtype is None else (held_names(model), dtype)


def own_memory(model: torch.nn.Module, given: Mapping[str, torch.Tensor]) -> int:
    """Give every parameter and buffer of `model` that shares memory with one of `given`'s
    tensors (a caller's state dict, its weights loaded by assignment) memory of its own, so
    that the caller's tensors and the model never change each other (a parameter shared by two
    modules stays shared). Returns how many it copied."""
    theirs = {_memory(t) for t in given.values() if isinstance(t, torch.Tensor) and t.numel()}
    copies: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for store in (module._parameters, module._buffers):
            for name, t in list(store.items()):
                if t is None or not t.numel() or _memory(t) not in theirs:
                    continue
                if id(t) not in copies:
                    data = t.detach().clone()
                    copies[id(t)] = (torch.nn.Parameter(data, requires_grad=t.requires_grad)
                                     if isinstance(t, torch.nn.Parameter) else data)
                store[name] = copies[id(t)]
    return len(copies)


def _memory(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _empty(tensors: list[torch.Tensor], kept: set[int]) -> None:
    for t in tensors:
        if id(t) not in kept and t.numel():
            t.set_()
