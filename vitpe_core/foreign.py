"""Foreign weight files: a plain state dict from another tool's file, read without running code.

`read_state_dict` reads `.npz` (numpy, pickles refused), `.safetensors` (any metadata) and
torch files (`.pt .pth .bin .ckpt`, `torch.load(weights_only=True)`: tensors and containers
only, so a pickle that would run code is refused). A `.npz` is checked before numpy allocates
anything (`_check_npz`): a forged header must not make the server allocate gigabytes.
Every refusal is a `CheckpointError` naming the file and why. vitpe's own checkpoints are
read by `checkpoint.load_checkpoint`; `importers` turns what this returns into a model.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from .checkpoint import SUFFIX, CheckpointError

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
NPZ_MAX_EXPANSION = 20   # a compressed .npz may hold up to this many times its size (weights compress ~1.1x)


def _check_npz(path: Path) -> None:
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
                    raise CheckpointError(f"{path.name}: array {info.filename!r} claims {need:,} bytes but holds "
                                          f"{info.file_size:,}; the file is damaged or forged")
                total += need
    except CheckpointError:
        raise
    except Exception as e:   # not a zip, a member that is not .npy, a bad header
        raise CheckpointError(f"cannot read {path.name} as a state dict of tensors: {str(e) or type(e).__name__}"
                              ) from None
    if total > NPZ_MAX_EXPANSION * max(1, path.stat().st_size):
        raise CheckpointError(f"{path.name}: its arrays would take {total:,} bytes, more than "
                              f"{NPZ_MAX_EXPANSION}x the file; refused")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A plain state dict from .npz, .safetensors or a weights-only torch file (no code runs);
    a torch file's `model` / `state_dict` / `model_state` entry is taken when it has one."""
    path = Path(path)
    try:
        if path.suffix == ".npz":
            _check_npz(path)
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            return {k: torch.from_numpy(a.copy()) for k, a in arrays.items() if a.dtype.kind in "fiub"}
        if path.suffix == SUFFIX:
            with safe_open(str(path), framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        if path.suffix not in TORCH_SUFFIXES:
            raise CheckpointError(f"{path.name}: expected timm weights as .npz, {SUFFIX} or a torch file "
                                  f"({', '.join(TORCH_SUFFIXES)})")
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except Exception as e:  # any failure to parse is the file's problem, reported as such
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "Weights only load failed" in first:  # torch's advice (weights_only=False) would run the file's code
            first = "it is not a plain file of tensors, and pickled objects are refused because loading them runs code"
        raise CheckpointError(f"cannot read {path.name} as a state dict of tensors: {first}") from None
    for key in ("model", "state_dict", "model_state"):
        if isinstance(sd, dict) and isinstance(sd.get(key), dict):
            sd = sd[key]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise CheckpointError(f"{path.name} does not hold a flat dict of tensors")
    return sd
