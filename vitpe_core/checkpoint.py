"""Checkpoint I/O: one self-describing safetensors file per model, loaded strictly.

A checkpoint `NAME.safetensors` holds
* the weights (float16 by default; float32 on request), no `_orig_mod.` / `module.` prefixes;
* per-epoch snapshots of the position-encoding parameters under `history.{epoch}.{name}`
  (the app replays how 2D structure emerges during training);
* metadata (strings): `format` = "vitpe-checkpoint", `format_version`, `config` (ViTConfig
  JSON), `metrics` (JSON: recipe, accuracy, curves, resolution and translation results...).
Beside it, `NAME.json` repeats config + metrics for humans and diffs.

Loading never executes code (safetensors has no pickle), checks the format and version,
rebuilds the model from its config and loads the weights with `strict=True`. Every refusal
is a `CheckpointError` (a `ValueError`) naming the problem. `resolve_checkpoint` only opens
files inside a given folder (no `..`, absolute paths or symlinks out of it).

`import_timm` builds an `ape` model from a timm / DeiT `VisionTransformer` state dict.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as st_save

from .config import ViTConfig
from .encodings.base import encoding_parts
from .model import ViT, map_timm_pos_embed

log = logging.getLogger(__name__)

FORMAT = "vitpe-checkpoint"
FORMAT_VERSION = "1"
SUFFIX = ".safetensors"
HISTORY = "history."
MAX_CHECKPOINT_BYTES = 512 * 2**20


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message says why and what to do."""


@dataclass
class Checkpoint:
    model: ViT
    config: ViTConfig
    metrics: dict[str, Any] = field(default_factory=dict)
    history: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # epoch -> pos_enc params
    name: str = ""


# ----------------------------------------------------------------------------- metrics shape
def _number(v: Any) -> float | int | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
    return v if ok else None


def _numbers(d: Mapping) -> dict[str, Any]:
    """A flat result dict: numbers stay, integer lists (grid, shift_px) stay, anything else is None."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            out[str(k)] = v
        else:
            out[str(k)] = _number(v)
    return out


def _valid_preprocess(pre: Any) -> bool:
    """An imported model's eval transform as `importers` writes it."""
    if not isinstance(pre, dict):
        return False
    mean, std, crop = pre.get("mean"), pre.get("std"), _number(pre.get("crop_pct"))
    three = lambda v: isinstance(v, list) and len(v) == 3 and all(_number(x) is not None for x in v)
    return three(mean) and three(std) and min(std) > 0 and crop is not None and 0 < crop <= 1


def sanitize_metrics(metrics: Any) -> tuple[dict[str, Any], list[str]]:
    """Metrics with the shapes `vitpe_core.train` writes, and the keys that had to be dropped or
    emptied. For readers (the app) that must survive metrics edited by hand or written by other
    tools; the checkpoint file itself is left as it is."""
    if not isinstance(metrics, dict):
        return {}, [f"metrics is a {type(metrics).__name__}, not an object"]
    out, problems = dict(metrics), []

    def drop(key: str, why: str) -> None:
        out.pop(key, None)
        problems.append(f"{key}: {why}")

    for key in ("test", "structure"):
        if key in out:
            if isinstance(out[key], dict):
                out[key] = _numbers(out[key])
            else:
                drop(key, "not an object")
    for key in ("resolution", "translation"):
        if key in out:
            if isinstance(out[key], dict):
                rows = {str(k): _numbers(v) for k, v in out[key].items() if isinstance(v, dict)}
                if len(rows) < len(out[key]):
                    problems.append(f"{key}: {len(out[key]) - len(rows)} entries are not objects")
                out[key] = rows
            else:
                drop(key, "not an object")
    if "recipe" in out and not isinstance(out["recipe"], dict):
        drop("recipe", "not an object")
    for key in ("epochs", "steps", "wall_time_s", "images_per_s", "parameters"):
        if key in out and _number(out[key]) is None:
            drop(key, "not a number")
    if "preprocess" in out and not _valid_preprocess(out["preprocess"]):
        drop("preprocess", "not {mean: [3 numbers], std: [3 positive numbers], crop_pct: (0, 1]}")
    for key in ("notes", "git_commit", "device", "torch"):
        if key in out and not isinstance(out[key], str):
            drop(key, "not a string")
    if "curves" in out:
        curves = out["curves"]
        if not isinstance(curves, dict):
            drop("curves", "not an object")
        else:
            series = {str(k): [_number(x) for x in v] for k, v in curves.items() if isinstance(v, list)}
            n = len(series.get("epoch", []))
            bad = [k for k, v in series.items() if (n and len(v) != n) or (v and all(x is None for x in v))]
            series = {k: v for k, v in series.items() if k not in bad}
            if bad or len(series) + len(bad) < len(curves):
                problems.append("curves: series dropped (not numbers, or not one value per epoch): "
                                + ", ".join(sorted(set(curves) - set(series))))
            out["curves"] = series
    return out, problems


def clean_state_dict(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip `torch.compile` (`_orig_mod.`) and DDP (`module.`) prefixes."""
    out = {}
    for k, v in sd.items():
        while k.startswith(("_orig_mod.", "module.")):
            k = k.split(".", 1)[1]
        out[k] = v
    return out


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`: a crash
    leaves either the old file or the new one, never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # mkstemp makes 0600; a checkpoint is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sidecar_path(path: Path) -> Path:
    return Path(path).with_suffix(".json")


def save_checkpoint(path: str | Path, model: ViT, *, metrics: dict | None = None,
                    history: Mapping[int, Mapping[str, torch.Tensor]] | None = None,
                    dtype: torch.dtype = torch.float16) -> Path:
    """Write `path` (.safetensors) and its `.json` sidecar atomically."""
    path = Path(path)
    if path.suffix != SUFFIX:
        raise ValueError(f"checkpoint files end in {SUFFIX}, got {path.name}")
    tensors = {}
    for k, v in clean_state_dict(model.state_dict()).items():
        v = v.detach().cpu()
        tensors[k] = (v.to(dtype) if v.is_floating_point() else v).contiguous()
    for epoch, params in (history or {}).items():
        for k, v in params.items():
            tensors[f"{HISTORY}{int(epoch)}.{k}"] = v.detach().cpu().to(dtype).contiguous()
    metrics = metrics or {}
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION,
            "config": model.cfg.to_json(), "metrics": json.dumps(metrics, sort_keys=True)}
    atomic_write_bytes(path, st_save(tensors, metadata=meta))
    sidecar = {"config": model.cfg.to_dict(), "metrics": metrics}
    atomic_write_bytes(sidecar_path(path), (json.dumps(sidecar, indent=1, sort_keys=True) + "\n").encode())
    return path


def history_params(model: ViT) -> dict[str, torch.Tensor]:
    """The position encoding's learned parameters now (what `history` records per epoch)."""
    return {k: v.detach().cpu().clone() for k, v in model.pos_enc.named_parameters()}


def read_checkpoint_file(path: str | Path, *, tensors: bool = True
                         ) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """Metadata and tensors of a vitpe checkpoint, with every failure a CheckpointError;
    `tensors=False` reads the header only (no tensor is read: `{}` in their place)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    size = path.stat().st_size
    if size > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"{path.name} is {size / 2**20:.0f} MiB; the limit is "
                              f"{MAX_CHECKPOINT_BYTES / 2**20:.0f} MiB")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            read = {k: f.get_tensor(k) for k in f.keys()} if tensors else {}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path.name} is not a readable safetensors file "
                              f"(truncated or not a vitpe checkpoint): {e}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path.name} is a safetensors file but not a vitpe checkpoint "
                              f"(metadata 'format' is {meta.get('format')!r}). For timm weights use "
                              "vitpe_core.checkpoint.import_timm.")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path.name} has checkpoint format version {meta.get('format_version')!r}; "
                              f"this vitpe reads version {FORMAT_VERSION}. Re-save it with a matching vitpe.")
    return meta, read


def _parse_json(meta: dict[str, str], key: str, name: str) -> Any:
    try:
        return json.loads(meta[key])
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{name}: metadata {key!r} is missing or not JSON ({e})") from None


def approx_elements(cfg: ViTConfig) -> int:
    """About how many values building `cfg` allocates (weights plus per-position tables), from
    its sizes alone: what the file's tensors must roughly add up to."""
    H, W = cfg.grid
    d = cfg.dim
    blocks = cfg.depth * (4 * d * d + 2 * d * cfg.mlp_dim)
    return (blocks + cfg.patch_size ** 2 * cfg.in_chans * d + cfg.num_classes * d
            + (H * W + 1) * d + 4 * H * W * cfg.heads)


def read_config(path: str | Path) -> ViTConfig:
    """The model config of a vitpe checkpoint from its header alone (milliseconds: no tensor is
    read, no model built), for listing many checkpoints; `load_checkpoint` still checks the rest."""
    path = Path(path)
    meta, _ = read_checkpoint_file(path, tensors=False)
    return _config_of(meta, path.name)


def _config_of(meta: dict[str, str], name: str) -> ViTConfig:
    """The metadata's config, its encoding's parts checked against the registry."""
    try:
        cfg = ViTConfig.from_dict(_parse_json(meta, "config", name))
        encoding_parts(str(cfg.encoding))
    except CheckpointError:
        raise
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{name}: its config cannot build a model: {e}") from None
    return cfg


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> Checkpoint:
    """Rebuild the model of a vitpe checkpoint and load its weights strictly."""
    path = Path(path)
    meta, tensors = read_checkpoint_file(path)
    cfg = _config_of(meta, path.name)
    try:
        need, have = approx_elements(cfg), sum(t.numel() for t in tensors.values())
        if need > 4 * have + 2**20:   # checked before building: a forged config must not allocate gigabytes
            raise CheckpointError(f"{path.name}: its config describes a model of about {need:,} values but the "
                                  f"file holds {have:,}; the config was altered or belongs to another file")
        model = ViT(cfg, init_weights=False)   # every parameter is loaded below (strict)
    except CheckpointError:
        raise
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path.name}: its config cannot build a model: {e}") from None
    metrics = _parse_json(meta, "metrics", path.name)
    history: dict[int, dict[str, torch.Tensor]] = {}
    weights = {}
    enc_shapes = {k: tuple(v.shape) for k, v in model.pos_enc.state_dict().items()}
    for k, v in tensors.items():
        if k.startswith(HISTORY):
            epoch, _, name = k[len(HISTORY):].partition(".")
            if not epoch.isdigit() or enc_shapes.get(name) != tuple(v.shape):
                raise CheckpointError(f"{path.name}: history entry {k!r} {tuple(v.shape)} is not "
                                      f"'history.<epoch>.<parameter of the {cfg.encoding} encoding>' with that "
                                      "parameter's shape; the file was altered or written by another tool")
            history.setdefault(int(epoch), {})[name] = v.to(dtype)
        else:
            weights[k] = v.to(dtype) if v.is_floating_point() else v
    load_weights(model, weights, path.name)
    model.to(device).eval()
    return Checkpoint(model, cfg, metrics, dict(sorted(history.items())), path.stem)


def load_weights(model: torch.nn.Module, weights: Mapping[str, torch.Tensor], name: str) -> None:
    """`load_state_dict(strict=True)` with one message naming every missing, unexpected and
    mis-shaped key."""
    own = model.state_dict()
    weights = dict(weights)
    if isinstance(model, ViT):
        map_timm_pos_embed(model, weights)   # timm layout: before the key checks below
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    shapes = [f"{k}: file {tuple(weights[k].shape)} vs model {tuple(own[k].shape)}"
              for k in sorted(set(own) & set(weights)) if weights[k].shape != own[k].shape]
    problems = []
    if missing:
        problems.append(f"missing keys {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")
    if shapes:
        problems.append(f"wrong shapes {shapes[:8]}")
    if problems:
        raise CheckpointError(f"{name} does not match its model: " + "; ".join(problems))
    model.load_state_dict(weights, strict=True)


def update_metrics(path: str | Path, updates: dict[str, Any]) -> dict[str, Any]:
    """Merge `updates` into a checkpoint's metrics (file and sidecar), atomically."""
    path = Path(path)
    meta, tensors = read_checkpoint_file(path)
    metrics = {**_parse_json(meta, "metrics", path.name), **updates}
    meta["metrics"] = json.dumps(metrics, sort_keys=True)
    atomic_write_bytes(path, st_save(tensors, metadata=meta))
    cfg = _parse_json(meta, "config", path.name)
    atomic_write_bytes(sidecar_path(path), (json.dumps({"config": cfg, "metrics": metrics}, indent=1,
                                                       sort_keys=True) + "\n").encode())
    return metrics


# ----------------------------------------------------------------------------- safe paths
GROUPS = ("long",)   # sub-folders listed after the main checkpoints as "GROUP/NAME" (long: the 50-epoch runs)


def listed_checkpoints(root: str | Path) -> list[str]:
    """What the app lists from folder `root`: its checkpoints, then those of each sub-folder in
    `GROUPS` as `GROUP/NAME` (`long/ape`; other sub-folders, such as `seeds/`, are not listed)."""
    return list_checkpoints(root) + [f"{g}/{n}" for g in GROUPS for n in list_checkpoints(Path(root) / g)]


def in_group(name: str) -> bool:
    """Whether listed name `name` is one of a group's (`long/ape`)."""
    group, sep, _ = name.partition("/")
    return bool(sep) and group in GROUPS


def group_and_stem(name: str) -> tuple[str, str]:
    """(group, file stem) of a listed name: `long/ape` -> ("long", "ape"); a name of any other
    form is its own stem, in no group ("")."""
    group, _, stem = name.partition("/")
    return (group, stem) if in_group(name) else ("", name)


def list_checkpoints(root: str | Path) -> list[str]:
    """Names (file stems) of the checkpoint files directly inside `root`, sorted."""
    root = Path(root)
    if not root.is_dir():
        return []
    names = []
    for p in sorted(root.glob(f"*{SUFFIX}")):
        try:
            names.append(resolve_checkpoint(p.stem, root).stem)
        except CheckpointError:
            continue
    return names


def resolve_checkpoint(name: str, root: str | Path) -> Path:
    """The file for checkpoint `name` inside `root`; refuses (without reading anything) path
    separators, `..`, absolute paths, hidden names and symlinks that leave `root`."""
    if not isinstance(name, str) or not name or len(name) > 128:
        raise CheckpointError("a checkpoint name must be a non-empty string of at most 128 characters")
    if name.endswith(SUFFIX):
        name = name[: -len(SUFFIX)]
    bad = set(name) & set("/\\\x00:") or name.startswith(".") or name != name.strip()
    if bad or Path(name).is_absolute() or ".." in name:
        raise CheckpointError(f"invalid checkpoint name {name!r}: use one of the names listed in the folder")
    root = Path(root).resolve()
    path = root / f"{name}{SUFFIX}"
    try:
        real = path.resolve(strict=True)
    except (FileNotFoundError, RuntimeError, OSError):
        raise CheckpointError(f"no checkpoint named {name!r} in {root.name}/") from None
    if real.parent != root or not real.is_file():
        raise CheckpointError(f"checkpoint {name!r} points outside {root.name}/; refused")
    return real


# ----------------------------------------------------------------------------- timm import
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
    """A plain state dict from .npz, .safetensors or a weights-only torch file (no code runs)."""
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


def import_timm(state_dict: Mapping[str, torch.Tensor] | str | Path, *, heads: int | None = None,
                grid: tuple[int, int] | None = None) -> ViT:
    """The model of timm ViT weights (a state dict or a file): `importers.import_state_dict`
    with `family="timm"`; kept for callers of the first release."""
    from .importers import import_state_dict
    if not isinstance(state_dict, Mapping):
        state_dict = read_state_dict(state_dict)
    return import_state_dict(state_dict, family="timm", heads=heads, grid=grid).model
