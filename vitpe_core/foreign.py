"""Foreign weight files: a plain state dict from another tool's file, read without running code.

`read_state_dict` reads `.npz` (numpy, pickles refused), `.safetensors` (any metadata) and
torch files (`.pt .pth .bin .ckpt`, `torch.load(weights_only=True)`: tensors and containers
only, so a pickle that would run code is refused). A `.npz` is checked before numpy allocates
anything (`_check_npz`): a forged header must not make the server allocate gigabytes.
Every refusal is a `CheckpointError` naming the file (`name`: the name its owner knows, e.g. an
upload's, where the bytes sit in a temporary file) and saying in plain words what is wrong and
what to do; the parser's own message goes to the log only. vitpe's own checkpoints are read by
`checkpoint.load_checkpoint`; `importers` turns what this returns into a model.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping

import numpy as np
import torch
from safetensors import safe_open

from .checkpoint import SUFFIX, CheckpointError

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
