"""Checkpoint I/O: one self-describing safetensors file per model, loaded strictly.

A checkpoint `NAME.safetensors` holds
* the weights (float16 by default; float32 on request), no `_orig_mod.` / `module.` prefixes;
* per-epoch snapshots of the position-encoding parameters under `history.{epoch}.{name}`
  (the app replays how 2D structure emerges during training);
* metadata (strings): `format` = "vitpe-checkpoint", `format_version`, `config` (ViTConfig
  JSON; a SwinConfig's, marked `"arch": "swin"`, rebuilds a `swin.SwinTransformer`), `metrics`
  (JSON: recipe, accuracy, curves, resolution and translation results...).
Beside it, `NAME.json` repeats config + metrics for humans and diffs.

Loading never executes code (safetensors has no pickle), checks the format and version,
rebuilds the model from its config and loads the weights with `strict=True`. Every refusal
is a `CheckpointError` (a `ValueError`) naming the problem. `resolve_checkpoint` only opens
files inside a given folder (no `..`, absolute paths or symlinks out of it).

This module knows only its own format. Other tools' weights (timm, Hugging Face, RoPE-ViT;
.npz, .pth, foreign .safetensors) are read by `foreign.read_state_dict` and turned into a
vitpe checkpoint by `importers` (`python -m vitpe_core import FILE --out NAME.safetensors`).
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from safetensors import SafetensorError, safe_open   # torch-free until a file is opened with framework="pt"

from .config import ViTConfig, encoding_parts
from .swin.config import ARCH as SWIN_ARCH, SwinConfig

# torch, safetensors.torch, the models and the encodings (which import torch) are imported where they are
# used: the app draws its first page before torch is loaded.
if TYPE_CHECKING:
    import torch

    from .model import ViT

log = logging.getLogger(__name__)

FORMAT = "vitpe-checkpoint"
FORMAT_VERSION = "1"
SUFFIX = ".safetensors"
HISTORY = "history."
MAX_CHECKPOINT_BYTES = 512 * 2**20


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message says why and what to do."""


class NotVitpeCheckpointError(CheckpointError):
    """A readable safetensors file whose metadata does not mark it as a vitpe checkpoint: other
    weights (timm, Hugging Face, ...), which `python -m vitpe_core import` can bring in."""


@dataclass
class Checkpoint:
    model: ViT
    config: ViTConfig
    metrics: dict[str, Any] = field(default_factory=dict)
    history: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # epoch -> pos_enc params
    name: str = ""

    @property
    def header(self) -> CheckpointHeader:
        return CheckpointHeader(self.config, self.metrics, tuple(sorted(self.history)), self.name)


@dataclass(frozen=True)
class CheckpointHeader:
    """What a checkpoint says besides its weights (`read_header`: its file's header alone, no
    torch): what a page needs before, or without, the model."""
    config: ViTConfig
    metrics: dict[str, Any]
    epochs: tuple[int, ...] = ()          # the epochs `history` recorded
    name: str = ""


HELD_INFIX = ".parametrizations."      # a held weight's state-dict name: `<layer>.parametrizations.<name>.original`


def clean_state_dict(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip `torch.compile` (`_orig_mod.`) and DDP (`module.`) prefixes, and name a weight held
    in half precision (`held_precision.hold_weights`) as the layer's own weight."""
    out = {}
    for k, v in sd.items():
        while k.startswith(("_orig_mod.", "module.")):
            k = k.split(".", 1)[1]
        if HELD_INFIX in k and k.endswith(".original"):
            layer, _, name = k.removesuffix(".original").partition(HELD_INFIX)
            k = f"{layer}.{name}"
        out[k] = v
    return out


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`: a crash
    leaves either the old file or the new one, never a torn one."""
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """`atomic_write_bytes` with the temporary file written by `write(its path)`: a big file
    streamed to disk, not first built in memory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb+") as f:
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
                    dtype: torch.dtype | None = None) -> Path:
    """Write `path` (.safetensors) and its `.json` sidecar atomically; floating-point weights in
    `dtype` (None: `torch.float16`)."""
    import torch
    from safetensors.torch import save_file as st_save_file

    path = Path(path)
    if path.suffix != SUFFIX:
        raise ValueError(f"checkpoint files end in {SUFFIX}, got {path.name}")
    dtype = torch.float16 if dtype is None else dtype
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
    # streamed to the file: safetensors' `save` (bytes) would hold the whole file in memory once more
    atomic_write(path, lambda tmp: st_save_file(tensors, str(tmp), metadata=meta))
    sidecar = {"config": model.cfg.to_dict(), "metrics": metrics}
    atomic_write_bytes(sidecar_path(path), (json.dumps(sidecar, indent=1, sort_keys=True) + "\n").encode())
    return path


def history_params(model: ViT) -> dict[str, torch.Tensor]:
    """The position encoding's learned parameters now (what `history` records per epoch)."""
    return {k: v.detach().cpu().clone() for k, v in model.pos_enc.named_parameters()}


def read_checkpoint_file(path: str | Path, *, tensors: bool = True
                         ) -> tuple[dict[str, str], dict[str, torch.Tensor | None]]:
    """Metadata and tensors of a vitpe checkpoint, with every failure a CheckpointError;
    `tensors=False` reads the header only (no tensor is read, nor torch imported: the tensors'
    names map to None)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    size = path.stat().st_size
    if size > MAX_CHECKPOINT_BYTES:
        raise CheckpointError(f"{path.name} is {size / 2**20:.0f} MiB; the limit is "
                              f"{MAX_CHECKPOINT_BYTES / 2**20:.0f} MiB")
    try:
        with safe_open(str(path), framework="pt" if tensors else "np") as f:   # "np": no torch for a header
            meta = f.metadata() or {}
            read = {k: f.get_tensor(k) if tensors else None for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        log.info("safetensors could not read %s: %s", path, e)      # the library's words, for the log only
        raise CheckpointError(f"{path.name} is not a readable safetensors file (truncated, its header damaged, or "
                              "another kind of file): restore it (git checkout, a new download) or save the model "
                              "again") from None
    if meta.get("format") != FORMAT:
        raise NotVitpeCheckpointError(f"{path.name} is a safetensors file but not a vitpe checkpoint (metadata "
                                      f"'format' is {meta.get('format')!r}). To bring in timm / Hugging Face / "
                                      f"RoPE-ViT weights, run `python -m vitpe_core import {path.name} --out "
                                      f"NAME{SUFFIX}` (docs/importing.md).")
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
    if isinstance(cfg, SwinConfig):
        return cfg.approx_elements()
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


def read_header(path: str | Path) -> CheckpointHeader:
    """`CheckpointHeader` of a vitpe checkpoint file (no tensor is read, no model built, no torch
    imported); `load_checkpoint` still checks the rest."""
    path = Path(path)
    meta, names = read_checkpoint_file(path, tensors=False)
    epochs = {k[len(HISTORY):].partition(".")[0] for k in names if k.startswith(HISTORY)}
    return CheckpointHeader(_config_of(meta, path.name), _parse_json(meta, "metrics", path.name),
                            tuple(sorted(int(e) for e in epochs if e.isdigit())), path.stem)


def _config_of(meta: dict[str, str], name: str) -> ViTConfig:
    """The metadata's config, its encoding's parts checked against the registry (a Swin's,
    `"arch": "swin"`, is a `SwinConfig`)."""
    try:
        d = _parse_json(meta, "config", name)
        if isinstance(d, dict) and d.get("arch") == SWIN_ARCH:
            return SwinConfig.from_dict(d)
        cfg = ViTConfig.from_dict(d)
        encoding_parts(str(cfg.encoding))
    except CheckpointError:
        raise
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{name}: its config cannot build a model: {e}") from None
    return cfg


def load_checkpoint(path: str | Path, *, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> Checkpoint:
    """Rebuild the model of a vitpe checkpoint and load its weights strictly; floating-point
    weights in `dtype` (None: `torch.float32`)."""
    import torch

    from .model import ViT
    from .swin.model import SwinTransformer

    dtype = torch.float32 if dtype is None else dtype
    path = Path(path)
    meta, tensors = read_checkpoint_file(path)
    cfg = _config_of(meta, path.name)
    try:
        need, have = approx_elements(cfg), sum(t.numel() for t in tensors.values())
        if need > 4 * have + 2**20:   # checked before building: a forged config must not allocate gigabytes
            raise CheckpointError(f"{path.name}: its config describes a model of about {need:,} values but the "
                                  f"file holds {have:,}; the config was altered or belongs to another file")
        arch = SwinTransformer if isinstance(cfg, SwinConfig) else ViT
        model = arch(cfg, init_weights=False)   # every parameter is loaded below (strict)
    except CheckpointError:
        raise
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path.name}: its config cannot build a model: {e}") from None
    metrics = _parse_json(meta, "metrics", path.name)
    history: dict[int, dict[str, torch.Tensor]] = {}
    weights = {}
    enc = getattr(model, "pos_enc", None)   # a Swin has no encoding module, hence no history
    enc_shapes = {k: tuple(v.shape) for k, v in enc.state_dict().items()} if enc is not None else {}
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


def load_weights(model: torch.nn.Module, weights: Mapping[str, torch.Tensor], name: str, assign: bool = False
                 ) -> None:
    """`load_state_dict(strict=True)` with one message naming every missing, unexpected and
    mis-shaped key. `assign`: the model takes the tensors themselves (no copy; a `model.empty_model`
    is filled this way), and none of its tensors may be left on the meta device."""
    own = model.state_dict()
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
    model.load_state_dict(weights, strict=True, assign=assign)
    if assign:
        empty = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
        if empty:
            raise CheckpointError(f"{name}: no values for {empty[:8]} (the model was built without them)")


def update_metrics(path: str | Path, updates: dict[str, Any]) -> dict[str, Any]:
    """Merge `updates` into a checkpoint's metrics (file and sidecar), atomically."""
    from safetensors.torch import save_file as st_save_file

    path = Path(path)
    meta, tensors = read_checkpoint_file(path)
    metrics = {**_parse_json(meta, "metrics", path.name), **updates}
    meta["metrics"] = json.dumps(metrics, sort_keys=True)
    atomic_write(path, lambda tmp: st_save_file(tensors, str(tmp), metadata=meta))
    cfg = _parse_json(meta, "config", path.name)
    atomic_write_bytes(sidecar_path(path), (json.dumps({"config": cfg, "metrics": metrics}, indent=1,
                                                       sort_keys=True) + "\n").encode())
    return metrics


# ----------------------------------------------------------------------------- safe paths
# The study's groups: sub-folders of a checkpoint folder that the app lists after the main
# checkpoints, as "GROUP/NAME". `long/` holds the 50-epoch reruns of main rows (scripts/train_study.sh),
# models of their own worth comparing. Not every sub-folder is a group: `seeds/` holds reruns of
# main rows with another seed, which would list every row twice; the README summarises them
# instead (`report.seeds_line`). Hence a list, not every sub-folder that holds checkpoints.
GROUPS = ("long",)


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
