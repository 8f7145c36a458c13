"""A visitor's own model into the server's store, for this browser session: an uploaded weights
file (with, optionally, the `config.json` its library saved beside it and a file naming its
classes), or a Hugging Face hub id downloaded through `huggingface_hub` where a network exists.

The model's key in `imported.model_store` is the sha256 of what decides it: the weights, the
config, the class names and the activation asked for (the same weights with another config are
another model). Errors are `CheckpointError`s naming the visitor's files (never a temporary
file) and what to do; the import form shows them.
"""
from __future__ import annotations

import hashlib
import json
import re
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

import streamlit as st

from vitpe_core import membudget
from vitpe_core.checkpoint import Checkpoint, CheckpointError
from vitpe_core.metrics import sanitize_metrics

from .cache import TIMM_SUFFIXES
from .imported import _list_in_session, keep_on_disk, model_store, stored_model, uploaded_models

MAX_CONFIG_BYTES = 2**20          # a config.json is a few kB
MAX_HUB_MB = 400                  # a hub download held in memory: a ViT-B/16 in float32 (346 MB) fits
HUB_ID = re.compile(r"[\w.-]{1,96}/[\w.-]{1,96}")
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "silu")   # the CLI's --act
COPY_CHUNK = 8 * 2**20            # an upload is copied to its temporary file (and hashed) this much at a time


@st.cache_resource(max_entries=4, show_spinner=False)
def _import_lock(sha: str):
    import threading
    return threading.Lock()


def import_upload(filename: str, data: bytes | BinaryIO, *, family: str = "auto", img_size: str | None = None,
                  heads: int | None = None, licence: str = "", labels: tuple[str, bytes] | None = None,
                  config: tuple[str, bytes] | None = None, act: str | None = None,
                  release: Callable[[], None] | None = None,
                  restore: Callable[[Path], None] | None = None) -> tuple[str, list[str]]:
    """Import an uploaded weights file into this session: (its name in the checkpoint lists,
    notes for the page: what the importer said, which models were evicted). `data`: its bytes, or
    a binary file holding them (an `UploadedFile`); `labels`: an uploaded labels file (name,
    bytes) naming the classes (`importers.parse_labels`); `config`: the uploaded `config.json`
    (name, bytes) of a Hugging Face or timm save (heads, windows, activation, read-out: what the
    keys do not say); `act`: the MLP activation of a bare timm file (the CLI's `--act`). The bytes
    are copied to a file in a temporary folder of its own (so no other file beside it is ever
    read), deleted when the import is over. `release()` is called once that copy is made, before
    the model is built: the caller lets go of the bytes then (the import form: Streamlit's upload
    manager), so that the upload and its float32 model are never both in memory (issue 30: a
    ViT-B/16 in float16 is 173 MB). `restore(copy)` is called with the copy when the import fails
    (the form puts the file back, for another try with other settings)."""
    from vitpe_core.importers import import_file

    suffix = Path(filename).suffix.lower()
    if suffix not in TIMM_SUFFIXES:
        raise CheckpointError(f"{filename}: expected one of {', '.join(TIMM_SUFFIXES)}")
    cfg = None if config is None else parse_config(*config)
    names, parts = _names_and_key(labels, cfg, act)
    with tempfile.TemporaryDirectory(prefix="vitpe-import-") as folder:
        tmp = Path(folder) / f"weights{suffix}"
        digest, size = _copy_hashed(data, tmp)
        del data
        if release is not None:
            release()

        def build():
            return import_file(tmp, family=family, img_size=img_size or None, heads=heads, name=filename,
                               config_beside=False, config=cfg, act=act or None, hold=True, **names)

        try:
            return _into_store(filename, digest, parts, build, licence, room=BUILD_ROOM * size, config=cfg)
        except BaseException:
            if restore is not None:
                restore(tmp)
            raise


def _copy_hashed(data: bytes | BinaryIO, path: Path) -> tuple[Any, int]:
    """Write `data` (bytes, or a binary file read from its start in chunks: never a second copy
    of it in memory) to `path`; its sha256 (a running `hashlib` object) and size."""
    digest, size = hashlib.sha256(), 0
    with open(path, "wb") as out:
        if isinstance(data, (bytes, bytearray, memoryview)):
            digest.update(data)
            size = out.write(data)
        else:
            data.seek(0)
            while chunk := data.read(COPY_CHUNK):
                digest.update(chunk)
                size += out.write(chunk)
    return digest, size


def import_hub(hub_id: str, *, family: str = "auto", img_size: str | None = None, heads: int | None = None,
               licence: str = "", labels: tuple[str, bytes] | None = None, act: str | None = None
               ) -> tuple[str, list[str]]:
    """Download a Hugging Face hub model (`owner/name`: `model.safetensors` and `config.json`,
    `importers.resolve_source`) and import it into this session as `import_upload` does. Where
    no network exists the error names the files to download and upload instead."""
    from vitpe_core.importers import import_file, resolve_source

    hub_id = hub_id.strip()
    if not HUB_ID.fullmatch(hub_id):
        raise CheckpointError(f"{hub_id[:80]!r} is not a Hugging Face hub id: write it as owner/name, e.g. "
                              "microsoft/beit-base-patch16-224")
    weights, cfg = resolve_source(hub_id)
    size = weights.stat().st_size
    if size > MAX_HUB_MB * 2**20:
        raise CheckpointError(f"{hub_id}'s weights are {size / 2**20:.0f} MB, more than this server holds for one "
                              f"visitor ({MAX_HUB_MB} MB): import it from a shell with `python -m vitpe_core import "
                              f"{hub_id} --out checkpoints/NAME.safetensors` (--half halves it)")
    names, parts = _names_and_key(labels, cfg, act)
    label = hub_id.replace("/", "__")

    def build():
        return import_file(weights, family=family, img_size=img_size or None, heads=heads, name=hub_id,
                           config_beside=False, config=cfg, act=act or None, hold=True, **names)

    with open(weights, "rb") as f:                  # read in chunks: never held whole for its key
        digest = hashlib.file_digest(f, "sha256")
    return _into_store(f"{label}{weights.suffix}", digest, parts, build, licence, room=BUILD_ROOM * size,
                       source=hub_id, config=cfg)


def parse_config(name: str, data: bytes) -> dict[str, Any]:
    """An uploaded `config.json` as a dict, or a CheckpointError saying what it is not."""
    if len(data) > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{name} is larger than {MAX_CONFIG_BYTES // 2**20} MiB: not a model's config.json")
    try:
        cfg = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise CheckpointError(f"{name} is not JSON: upload the config.json that was saved beside the weights "
                              "(save_pretrained, or timm's hub folder)") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{name} holds JSON but not an object: a model's config.json is one")
    return cfg


def _names_and_key(labels, cfg, act) -> tuple[dict[str, Any], list[bytes]]:
    """The class-name arguments of the import, and the bytes besides the weights that its key hashes."""
    from vitpe_core.importers import parse_labels
    if act and act not in ACTIVATIONS:
        raise CheckpointError(f"unknown activation {act!r}; valid: {', '.join(ACTIVATIONS)}")
    names = None if labels is None else parse_labels(_text_of(*labels), labels[0])
    extra = {} if names is None else {"class_names": names, "labels_name": labels[0]}
    parts = [b"\0labels\0" + "\n".join(names).encode()] if names is not None else []
    if cfg is not None:
        parts.append(b"\0config\0" + json.dumps(cfg, sort_keys=True).encode())
    if act:
        parts.append(b"\0act\0" + act.encode())
    return extra, parts


# What an import's build takes beside the server, per byte of its file: the read tensors and the
# model made of them. tests/test_import_memory.py measures the rise in a fresh process: 1.13x a
# float32 file, 1.29x a float16 one held in float16 (2.34x when the float32 model was built first).
BUILD_ROOM = 1.5


def _into_store(filename: str, digest, parts: list[bytes], build: Callable, licence: str, room: float,
                source: str | None = None, config: dict[str, Any] | None = None) -> tuple[str, list[str]]:
    """The model `build()` imports, under the sha256 of the weights (`digest`, a `hashlib` object
    fed with them) followed by `parts`, in the server's store (built once for every session that
    brings the same bytes) and in this session's list, named by `upload_name` (`config`: the
    config.json it came with)."""
    for part in parts:
        digest.update(part)
    sha = digest.hexdigest()
    mine = uploaded_models()
    if sha in mine.values():
        return next(n for n, s in mine.items() if s == sha), ["Already imported in this session."]
    store, notes = model_store(), []
    with _import_lock(sha):
        ckpt = stored_model(sha)                 # in memory, or stored on disk by an earlier import
        if ckpt is None:
            # room for the model while it is built: the least recently used entries go now, not after
            # the import's peak, and stay out until it is stored. `build` imports with `hold=True`: a
            # half-precision file's weights are held as the file has them, computed in float32.
            from vitpe_core.store import model_bytes
            with store.budget.reserve(min(int(room), store.max_bytes), f"importing {filename}"):
                imp = build()
            metrics, _ = sanitize_metrics(imp.metrics(source or filename, licence))
            ckpt = Checkpoint(imp.model, imp.model.cfg, metrics, {}, upload_name(filename, config, imp.family))
            notes += imp.notes
            evicted = store.put(sha, ckpt, model_bytes(imp.model))
            del imp
            kept = keep_on_disk(sha, ckpt)      # a link opens it on any process seeing the folder, after a restart
            if kept:
                notes.append(kept)
            membudget.release_freed_memory()     # the import's buffers
            if evicted:
                notes.append(f"The server made room by removing {len(evicted)} model(s) imported earlier "
                             "(least recently used).")
    return _list_in_session(ckpt.name, sha, notes)


# What libraries call the weights file in a saved folder (save_pretrained, timm's hub folder,
# open_clip, a training script's own): a name that says nothing of the model. Issue 44 (5): two
# `save_pretrained` folders became `model-upload` and `model-upload_`.
GENERIC_STEM = re.compile(r"(pytorch_|open_clip_(pytorch_)?|tf_|flax_)?(model|weights?|checkpoint|ckpt|state_dict|"
                          r"params|last|best|final)([._-]?(fp16|bf16|fp32|half|float16|bfloat16|float32|ema|best|"
                          r"last|final|\d+))*", re.IGNORECASE)
NAME_CHARS = 48              # of an imported model's name, before "-upload"


def _safe_name(text: str) -> str:
    """`text` in the characters a checkpoint name may hold everywhere it goes (file names, the
    URL's `ckpt=`, Markdown code): ASCII letters, digits and `_ . + -`; the rest become `_`, and
    a leading `.` or `-` (a hidden file, a command-line option) is dropped."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", text).lstrip(".-")


def _config_origin(config: dict[str, Any] | None) -> str:
    """The folder or hub repository a `config.json` says its model came from, if it says: the
    last part of transformers 4's `_name_or_path` (a hub id or the folder it was loaded from),
    or of timm's `pretrained_cfg.hf_hub_id`; "" if neither."""
    if not config:
        return ""
    pre = config.get("pretrained_cfg")
    for origin in (config.get("_name_or_path"), pre.get("hf_hub_id") if isinstance(pre, dict) else None):
        if isinstance(origin, str) and origin.strip().strip("/\\"):
            return re.split(r"[/\\]", origin.strip().rstrip("/\\"))[-1]
    return ""


def upload_name(filename: str, config: dict[str, Any] | None, family: str) -> str:
    """An imported model's name in the checkpoint lists (and in links, and in the report's file
    name): the file's stem where it names the model (`vit_tiny_patch16_224.npz` ->
    `vit_tiny_patch16_224-upload`); for a weights file a library named (`model.safetensors` of a
    `save_pretrained` folder, `pytorch_model.bin`, `open_clip_pytorch_model.bin`, ...) what the
    model is: `config.json`'s `model_type` (Hugging Face) or `architecture` (timm), else the
    imported family, with the folder the config names (`_name_or_path`) or else the file's stem:
    `swinv2-model-upload`, `beit-pytorch_model-upload`. Safe as a file name and in a URL
    (`_safe_name`); `imported._list_in_session` keeps it unique in the session."""
    stem = _safe_name(Path(filename).stem)
    if stem.strip("_") and not GENERIC_STEM.fullmatch(stem):
        return f"{stem[:NAME_CHARS]}-upload"
    from vitpe_core.importers.timm_hub import architecture
    config = config if isinstance(config, dict) else {}
    kind = config.get("model_type")
    kind = _safe_name(kind if isinstance(kind, str) and kind.strip() else architecture(config) or family)
    origin = _safe_name(_config_origin(config)).strip("_")
    if origin and re.sub(r"[^a-z0-9]", "", kind.lower()) in re.sub(r"[^a-z0-9]", "", origin.lower()):
        name = origin                      # microsoft/swinv2-tiny-patch4-window8-256: says it already
    else:
        name = "-".join(part for part in (kind, origin or stem.strip("_")) if part)
    return f"{name[:NAME_CHARS] or 'model'}-upload"


def _text_of(name: str, data: bytes) -> str:
    from vitpe_core.importers import MAX_LABELS_BYTES
    if len(data) > MAX_LABELS_BYTES:
        raise CheckpointError(f"{name} is larger than {MAX_LABELS_BYTES // 2**20} MiB: not a labels file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{name} is not UTF-8 text: give one class name per line, or JSON such as "
                              "config.json's id2label") from None

