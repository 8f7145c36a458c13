"""Where the weights come from (a file, the `config.json` beside it, or a Hugging Face hub id)
and where they go (`import_checkpoint`: a vitpe checkpoint in the file's own precision)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import torch

from ..checkpoint import CheckpointError, save_checkpoint
from ..foreign import read_state_dict
from .core import Imported, import_state_dict
from .labels import read_labels

HUB_FILES = ("model.safetensors", "pytorch_model.bin")   # the weights, in the order they are tried
HUB_HINT = ("`{source}` is not a file here. Hugging Face hub ids are fetched through the optional "
            "`huggingface_hub` package where a network exists; otherwise download `model.safetensors` and "
            "`config.json` (and `preprocessor_config.json`, if the repository has one) from "
            "https://huggingface.co/{source}/tree/main into one folder and pass the path of `model.safetensors`.")
STORED_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_size(text: str | None) -> tuple[int, int] | None:
    """"224" or "224x320" (height x width) -> (H, W)."""
    if text is None:
        return None
    try:
        parts = [int(p) for p in str(text).lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or min(parts) < 1:
        raise CheckpointError(f"expected an image size such as 224 or 224x320, got {text!r}")
    return parts[0], parts[1]


def resolve_source(source: str) -> tuple[Path, dict[str, Any] | None]:
    """A local weights file (and the HF `config.json` beside it, with `preprocessor_config.json`
    merged in, if any), or a hub id downloaded through `huggingface_hub` where that package and
    a network (or its cache, `HF_HUB_OFFLINE=1`) exist."""
    path = Path(source)
    if path.is_file():
        return path, _configs(path.parent / "config.json", path.parent / "preprocessor_config.json")
    if path.exists() or not re.fullmatch(r"[\w.-]+/[\w.-]+", source):
        raise CheckpointError(f"no weights file at {source!r}")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise CheckpointError(HUB_HINT.format(source=source) + " (`pip install huggingface_hub`)") from None
    try:
        config = Path(hf_hub_download(source, "config.json"))
        weights = None
        for name in HUB_FILES:
            try:
                weights = Path(hf_hub_download(source, name))
                break
            except Exception:   # this repository keeps its weights in the next file, or none
                continue
        if weights is None:
            raise FileNotFoundError(" / ".join(HUB_FILES))
    except Exception as e:   # no network, unknown id, gated repo: say what to do instead
        raise CheckpointError(HUB_HINT.format(source=source) + f" (download failed: {type(e).__name__})") from None
    try:
        pre = Path(hf_hub_download(source, "preprocessor_config.json"))
    except Exception:   # optional
        pre = None
    return weights, _configs(config, pre)


def _configs(config: Path, pre: Path | None) -> dict[str, Any] | None:
    """`config.json` with `preprocessor_config.json` merged in (either may be missing)."""
    cfg = _read_json(config) if config.is_file() else None
    extra = _read_json(pre) if pre is not None and pre.is_file() else None
    if cfg is not None and extra:
        cfg = {**cfg, **extra}
    return cfg


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def import_file(source: str | Path, *, family: str = "auto", img_size=None, name: str | None = None,
                labels: str | Path | None = None, config_beside: bool = True,
                config: Mapping[str, Any] | None = None, **kw) -> Imported:
    """`import_state_dict` of a weights file (.safetensors, .npz, weights-only torch file) or hub id.
    `name`: the file's name in messages (an upload's own, where the bytes sit in a temporary
    file); `labels`: a labels file (`read_labels`) naming the classes; `config_beside=False`
    ignores a `config.json` beside the file (a temporary file's folder is nobody's); `config`: the
    config to use instead (an uploaded `config.json`, or one a hub download returned)."""
    if labels is not None:
        kw["class_names"] = read_labels(labels)
        kw.setdefault("labels_name", Path(labels).name)
    path, beside = resolve_source(str(source))
    if config is None and config_beside:
        config = beside
    size = parse_size(img_size) if isinstance(img_size, str) else img_size
    return import_state_dict(read_state_dict(path, name), family=family, img_size=size, hf_config=config,
                             consume=True, **kw)   # the tensors it read: emptied as their float32 copies are made


def import_checkpoint(source: str | Path, out: str | Path, *, licence: str = "", dtype: str = "source",
                      **kw) -> Imported:
    """`import_file` and save it as a vitpe checkpoint (`out` + its JSON sidecar). The weights
    are stored in the file's own precision (`dtype="source"`, the default: the checkpoint is the
    model the file holds, bit for bit), or in `dtype` ("float32"/"float16"/"bfloat16") when
    asked; a float64 file is stored as float32, the precision the model runs in, with a note.
    The checkpoint's metrics record `source_dtype` and `stored_dtype`. A half-precision file's
    layer weights are loaded and saved in its precision (`hold=True`: never a float32 copy of the
    whole model; in any stored dtype the same values, as the upcast to float32 is exact)."""
    imp = import_file(source, hold=True, **kw)
    stored = stored_dtype(imp, dtype)
    hub_id = not Path(str(source)).exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", str(source))
    metrics = imp.metrics(str(source) if hub_id else Path(str(source)).name, licence)
    metrics["stored_dtype"] = str(stored).removeprefix("torch.")
    save_checkpoint(out, imp.model, metrics=metrics, dtype=stored)
    return imp


def stored_dtype(imp: Imported, dtype: str) -> torch.dtype:
    """The precision `import_checkpoint` stores `imp` in for `dtype` ("source" or a name), with a note."""
    if dtype == "source":
        if imp.source_dtype == torch.float64:
            imp.notes.append("The file holds float64 weights; the model runs and is stored in float32.")
            return torch.float32
        return imp.source_dtype
    if dtype not in STORED_DTYPES:
        raise CheckpointError(f"unknown dtype {dtype!r}; valid: source, {', '.join(STORED_DTYPES)}")
    if STORED_DTYPES[dtype] != imp.source_dtype:
        imp.notes.append(f"Stored as {dtype} on request; the file holds "
                         f"{str(imp.source_dtype).removeprefix('torch.')} (the weights are rounded).")
    return STORED_DTYPES[dtype]
