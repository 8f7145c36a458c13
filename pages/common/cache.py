"""Cached computations for the Streamlit app (Streamlit's caches around `vitpe_core`).

* Models: `st.cache_resource(max_entries=16)`, keyed by the checkpoint file's resolved path
  and modification time (a retrained checkpoint is reloaded), loaded through
  `checkpoint.resolve_checkpoint` (only files inside the folder) and `load_checkpoint`.
* Arrays: `st.cache_data`, bounded, keyed by (checkpoint name, file mtime, image id or upload
  sha256, ...). A trace of one image (one forward pass) is cached per (checkpoint, image);
  selecting another patch only slices its arrays (`analysis.patch_maps`).

The checkpoint folder is `$VITPE_CHECKPOINTS`, default `checkpoints/` in the repository root
(next to app.py).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import streamlit as st
import torch
from PIL import Image

from vitpe_core import analysis
from vitpe_core.checkpoint import (Checkpoint, CheckpointError, import_timm, list_checkpoints, load_checkpoint,
                         resolve_checkpoint, sanitize_metrics)
from vitpe_core.gallery import gallery_image
from vitpe_core.inputs import class_names, dataset_of, image_key, model_input  # noqa: F401 (re-exported for pages)
from vitpe_core.model import ViT

ENV_VAR = "VITPE_CHECKPOINTS"
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "checkpoints"
TIMM_SUFFIXES = (".npz", ".safetensors", ".pth", ".pt", ".bin")


def checkpoint_root() -> Path:
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value).expanduser() if value else DEFAULT_ROOT


def checkpoint_names() -> list[str]:
    """Checkpoint names in the folder (read on every run: a glob, no file is opened)."""
    return list_checkpoints(checkpoint_root())


# ----------------------------------------------------------------------------- models
@st.cache_resource(max_entries=16, show_spinner="Loading checkpoint…")
def _load(path: str, mtime_ns: int) -> Checkpoint:
    ckpt = load_checkpoint(path)
    ckpt.metrics, problems = sanitize_metrics(ckpt.metrics)   # pages may rely on the shapes train writes
    if problems:
        ckpt.metrics["metrics_problems"] = problems
    return ckpt


def _file(name: str) -> tuple[str, int]:
    path = resolve_checkpoint(name, checkpoint_root())
    return str(path), path.stat().st_mtime_ns


def get_checkpoint(name: str) -> Checkpoint:
    """The checkpoint `name` of the folder; raises `CheckpointError` (a ValueError)."""
    return _load(*_file(name))


# ----------------------------------------------------------------------------- traces
@st.cache_data(max_entries=64, show_spinner=False)
def _trace(path: str, mtime_ns: int, key: str, _img: Image.Image | None) -> analysis.Trace:
    ckpt = _load(path, mtime_ns)
    img = _img if _img is not None else gallery_image(key)
    x = model_input(img, ckpt.config.img_size, dataset_of(ckpt))
    return analysis.trace_image(ckpt.model, x)


def trace(name: str, key: str, img: Image.Image | None = None) -> analysis.Trace:
    """The trace of image `key` (a gallery id, or `image_key(img)` with `img` for uploads)."""
    return _trace(*_file(name), key, img)


@st.cache_data(max_entries=256, show_spinner=False)
def _positional(path: str, mtime_ns: int, key: str, patch: tuple[int, int],
                _img: Image.Image | None) -> tuple[str, np.ndarray] | None:
    ckpt = _load(path, mtime_ns)
    return analysis.positional_component(ckpt.model, _trace(path, mtime_ns, key, _img), patch)


def positional(name: str, key: str, patch: tuple[int, int], img: Image.Image | None = None
               ) -> tuple[str, np.ndarray] | None:
    """`analysis.positional_component`: (label, `(L, h, H, W)`) or None for `none`."""
    return _positional(*_file(name), key, tuple(patch), img)


@st.cache_data(max_entries=256, show_spinner=False)
def _stats(path: str, mtime_ns: int, key: str, _img: Image.Image | None) -> dict[str, np.ndarray]:
    return analysis.attention_stats(_trace(path, mtime_ns, key, _img))


def attention_stats(name: str, key: str, img: Image.Image | None = None) -> dict[str, np.ndarray]:
    return _stats(*_file(name), key, img)


# ----------------------------------------------------------------------------- tables
def has_table(name: str) -> bool:
    return "table" in get_checkpoint(name).model.pos_enc.hooks


def _similarity_of(model: ViT, params: dict | None = None) -> dict[str, Any] | None:
    table = analysis.position_table(model, params=params)
    if table is None:
        return None
    sim = analysis.cosine_similarity(table)                              # (N, N)
    return {"sim": sim.astype(np.float32), "grid": model.cfg.grid,
            "score": analysis.structure_score(sim, model.cfg.grid)}


@st.cache_data(max_entries=256, show_spinner=False)
def _similarity(path: str, mtime_ns: int, epoch: int | None) -> dict[str, Any] | None:
    ckpt = _load(path, mtime_ns)
    params = None if epoch is None else ckpt.history[epoch]
    return _similarity_of(ckpt.model, params)


def similarity(name: str, epoch: int | None = None) -> dict[str, Any] | None:
    """`{"sim": (N, N), "grid": (H, W), "score": structure_score}` of the table (at `epoch`
    from the training history, or the final one); None without a table."""
    return _similarity(*_file(name), epoch)


def structure_scores() -> dict[str, dict[str, float]]:
    """name -> structure score of the final table, for every loadable checkpoint with a table."""
    rows = {}
    for name in checkpoint_names():
        try:
            res = similarity(name) if has_table(name) else None
        except (ValueError, OSError):
            res = None
        if res is not None:
            rows[name] = res["score"]
    return rows


@st.cache_data(max_entries=64, show_spinner=False)
def _structure_history(path: str, mtime_ns: int) -> dict[int, dict[str, float]]:
    ckpt = _load(path, mtime_ns)
    out = {}
    for epoch in ckpt.history:
        res = _similarity(path, mtime_ns, epoch)
        if res is not None:
            out[epoch] = res["score"]
    return out


def structure_history(name: str) -> dict[int, dict[str, float]]:
    """epoch -> structure score of the table recorded at that epoch."""
    return _structure_history(*_file(name))


@st.cache_data(max_entries=4, show_spinner="Importing the timm checkpoint…")
def _timm_similarity(sha: str, suffix: str, _data: bytes) -> dict[str, Any]:
    fd, tmp = tempfile.mkstemp(suffix=suffix, prefix="vitpe-timm-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_data)
        model = import_timm(tmp)
    finally:
        Path(tmp).unlink(missing_ok=True)
    res = _similarity_of(model)
    assert res is not None  # import_timm always builds an `ape` model
    res["config"] = model.cfg.to_dict()
    return res


def timm_similarity(filename: str, data: bytes) -> dict[str, Any]:
    """Similarity of an uploaded timm ViT checkpoint's `pos_embed` (.npz, .safetensors,
    .pth/.pt/.bin); raises `CheckpointError`. The upload is written to a temporary file for
    `checkpoint.import_timm` and deleted at once."""
    suffix = Path(filename).suffix.lower()
    if suffix not in TIMM_SUFFIXES:
        raise CheckpointError(f"{filename!r}: expected one of {', '.join(TIMM_SUFFIXES)}")
    return _timm_similarity(hashlib.sha256(data).hexdigest(), suffix, data)

