"""Cached computations for the Streamlit app: the app's caches around `vitpe_core`, in one memory budget.

* One memory budget for the whole process (`vitpe_core.membudget.shared()`, `$VITPE_CACHE_MB`,
  its default's arithmetic in membudget.py): every cache below and the imported-model store are
  pools of it, each entry counted in bytes (`membudget.estimate_bytes`), and the least recently
  used entry of any pool goes first; `budget_sizes` reports each pool (the "Server status"
  panel). The caches hand every caller the same object (no copy per rerun as `st.cache_data`
  made), with its numpy arrays read-only.
* Models: a checkpoint name stands for a `ModelRef` (`model_ref`): a file of the folder (its
  resolved path and modification time: a retrained checkpoint is reloaded) or a model this
  server imported (the uploaded file's sha256). Files load through
  `checkpoint.resolve_checkpoint` (only files inside the folder) and `load_checkpoint` into the
  "checkpoints" pool (at most 16); imported models come from pages/common/imported.py (in memory,
  on disk, taking turns when big).
* Arrays, keyed by (`ModelRef`, image id or upload sha256, ...). A trace of one image (one
  forward pass) is cached per (checkpoint, image); selecting another patch only slices its
  arrays (`analysis.patch_maps`). A compact model's trace is about 1 MiB and kept as it is; an
  imported ViT-B/16's (21–85 MiB in float32) is kept in float16 (`analysis.compact_trace`:
  logits, and attention, bias and bias parts of every layer and head, which the pages and their
  downloads show; nothing else) and recomputed when the budget has evicted it. A Swin's trace
  (`swin_trace`, every block's windows) is kept the same way, in the same pool.

The checkpoint folder is `$VITPE_CHECKPOINTS`, default `checkpoints/` in the repository root
(next to app.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import streamlit as st
from PIL import Image
from streamlit.logger import setup_formatter

from vitpe_core import analysis, membudget, stored_trace
from vitpe_core.checkpoint import (Checkpoint, CheckpointError, CheckpointHeader, group_and_stem, listed_checkpoints,
                                   load_checkpoint, read_config, read_header, resolve_checkpoint)
from vitpe_core.config import ViTConfig
from vitpe_core.gallery import gallery_image
from vitpe_core.inputs import checkpoint_input, class_names, dataset_of, image_key, model_crop  # noqa: F401
from vitpe_core.metrics import sanitize_metrics
from vitpe_core.swin.explore import SwinTrace, trace_image as swin_trace_image
from vitpe_core.views import position_hooks

from . import warmup
from .imported import EVICTED, stored_model, take_turn, uploaded_models

if TYPE_CHECKING:
    from vitpe_core.model import ViT

# The server log says what the memory budget and the model store keep and evict, and which run waited for a
# big model's turn (Streamlit's format; the records still propagate, so tests' log capture sees them)
for _name in ("vitpe_core.membudget", "vitpe_core.store", "vitpe_core.turns"):
    if not hasattr(logging.getLogger(_name), "streamlit_console_handler"):
        logging.getLogger(_name).setLevel(logging.INFO)
        setup_formatter(logging.getLogger(_name))
membudget.tune_allocator()           # what the budget evicts leaves the process (glibc)

ENV_VAR = "VITPE_CHECKPOINTS"
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "checkpoints"
TIMM_SUFFIXES = (".npz", ".safetensors", ".pth", ".pt", ".bin")


def checkpoint_root() -> Path:
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value).expanduser() if value else DEFAULT_ROOT


def checkpoint_names() -> list[str]:
    """Checkpoint names in the folder and its groups (`vitpe_core.checkpoint.listed_checkpoints`:
    read on every run, a glob, no file is opened), then the models this browser session imported
    (`uploaded_models`)."""
    return listed_checkpoints(checkpoint_root()) + list(uploaded_models())


def count_text() -> str:
    """How many checkpoints the lists hold, as the sidebar and the Checkpoints page both say it:
    "14 checkpoints in the folder + 1 imported in this session" (imported models are held in
    the server's memory for this session, never written to the folder)."""
    folder, imported = len(listed_checkpoints(checkpoint_root())), len(uploaded_models())
    text = f"{folder} checkpoint{'s' * (folder != 1)} in the folder"
    return text + (f" + {imported} imported in this session" if imported else "")


def _folder_of(name: str) -> tuple[Path, str]:
    """(folder, file stem) of a listed name: `long/ape` -> (root/long, "ape"); a name of any
    other form is looked up in the root (where `resolve_checkpoint` refuses separators)."""
    group, stem = group_and_stem(name)
    return checkpoint_root() / group, stem


# ----------------------------------------------------------------------------- the memory budget
def _spinner(text: str | None):
    """`st.spinner(text)` inside a script run; nothing elsewhere (the warm-up thread, tests)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx
    return st.spinner(text) if text and get_script_run_ctx(suppress_warning=True) is not None \
        else contextlib.nullcontext()


def budgeted(pool: str, *, max_items: int | None = None, spinner: str | None = None):
    """Decorator: the function's results cached in pool `pool` of the process's memory budget
    (`membudget.Pool.memoize`: keyed by the arguments not named `_...`), at most `max_items`
    of them; `spinner` is shown while a missing result is computed."""
    def deco(fn):
        memo = membudget.shared().pool(pool, max_items=max_items).memoize(fn)
        if spinner is None:
            return memo

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with _spinner(spinner) if not memo.is_cached(*args, **kwargs) else contextlib.nullcontext():
                return memo(*args, **kwargs)
        wrapper.clear, wrapper.pool, wrapper.is_cached = memo.clear, memo.pool, memo.is_cached
        return wrapper
    return deco


def budget_sizes() -> tuple[int, int, dict[str, dict[str, int]]]:
    """(bytes held, the budget's bytes, pool name -> {"entries", "bytes", "evictions"})."""
    b = membudget.shared()
    return b.total, b.max_bytes, b.sizes()


# ----------------------------------------------------------------------------- models
@budgeted("checkpoints", max_items=16, spinner="Loading checkpoint…")
def _load_file(path: str, mtime_ns: int) -> Checkpoint:
    ckpt = load_checkpoint(path)
    ckpt.metrics = _sanitized(ckpt.metrics)
    return ckpt


def _sanitized(metrics: dict) -> dict:
    """A file's metrics in the shapes train writes (pages may rely on them); what did not fit is
    said in `metrics_problems`."""
    metrics, problems = sanitize_metrics(metrics)
    if problems:
        metrics["metrics_problems"] = problems
    return metrics


class ModelRef(NamedTuple):
    """The model a checkpoint name stands for, as the caches' key (a tuple of plain values: the
    caches hash it by value): a file of the folder (`key` its resolved path, `mtime_ns` its
    modification time) or a model imported on this server (`key` the uploaded file's sha256)."""
    kind: Literal["file", "imported"]
    key: str
    mtime_ns: int = 0

    @property
    def is_file(self) -> bool:
        return self.kind == "file"


def model_ref(name: str) -> ModelRef:
    """The model checkpoint `name` stands for: this session's imported model of that name, else
    the folder's file; raises `CheckpointError` (a ValueError) or OSError for a missing file."""
    uploads = uploaded_models()
    if name in uploads:
        return ModelRef("imported", uploads[name])
    try:
        path = resolve_checkpoint(*reversed(_folder_of(name)))
    except CheckpointError:
        if name in st.session_state.get(EVICTED, ()):
            raise ModelEvicted(name) from None
        raise
    return ModelRef("file", str(path), path.stat().st_mtime_ns)


class ModelEvicted(CheckpointError):
    """This session's imported model `name` left the server's store (another import needed the
    room), possibly in the middle of a page run that had started drawing it: the router
    (app.py) says so instead of the page's traceback."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"The imported model {name!r} was removed from the server to make room for a newer "
                         "import while this page was drawn. Import its weights file again on the Checkpoints "
                         "page, or pick another checkpoint.")


def load_model(ref: ModelRef) -> Checkpoint:
    """The checkpoint `ref` refers to: a file through the model cache, an imported model from
    the store; raises `CheckpointError` (a ValueError) once the store has evicted it. On a cold
    server it first waits for the warm-up's torch import (`warmup.wait_for_torch`, said on the page)."""
    warmup.wait_for_torch()
    if ref.is_file:
        return _load_file(ref.key, ref.mtime_ns)
    take_turn(ref.key)
    ckpt = stored_model(ref.key)
    if ckpt is None:
        raise ModelEvicted(f"{ref.key[:12]}…")
    return ckpt


def get_checkpoint(name: str) -> Checkpoint:
    """The checkpoint `name` of the folder or of this session's uploads; raises
    `CheckpointError` (a ValueError)."""
    return load_model(model_ref(name))


@budgeted("configs", max_items=256)
def _config_file(path: str, mtime_ns: int) -> ViTConfig:
    return read_config(path)


@budgeted("headers", max_items=256)
def _header_file(path: str, mtime_ns: int) -> CheckpointHeader:
    header = read_header(path)
    return dataclasses.replace(header, metrics=_sanitized(header.metrics))


def checkpoint_header(name: str) -> CheckpointHeader:
    """What a page needs of checkpoint `name` besides its model (config, metrics, recorded
    epochs), without loading it: a folder file's header only (no torch), an imported model from
    memory. Raises `CheckpointError` (a ValueError) or OSError."""
    ref = model_ref(name)
    return _header_file(ref.key, ref.mtime_ns) if ref.is_file else load_model(ref).header


def checkpoint_config(name: str) -> ViTConfig:
    """The model config of checkpoint `name` without loading it (a folder file's header only;
    an imported model is in memory already); raises `CheckpointError` (a ValueError)."""
    ref = model_ref(name)
    return _config_file(ref.key, ref.mtime_ns) if ref.is_file else load_model(ref).config


# ----------------------------------------------------------------------------- traces
TRACE_CACHE_ENTRIES = 64          # traces kept at most (their bytes count against the one budget)


@budgeted("traces", max_items=TRACE_CACHE_ENTRIES)
def _trace(ref: ModelRef, key: str, _img: Image.Image | None) -> analysis.Trace:
    if _img is None and ref.is_file and (stored := stored_trace.read_trace(ref.key, key)) is not None:
        return stored        # the checkpoint's first gallery image, traced when it was saved: no model, no torch
    ckpt = load_model(ref)
    img = _img if _img is not None else gallery_image(key)
    x = checkpoint_input(img, ckpt)
    with traced_room(ckpt.model, x):
        return analysis.trace_image(ckpt.model, x, compact=True)


def traced_room(model, x):
    """Room in the memory budget while a big model traces `x` (`analysis.trace_room`), made before it
    runs, so that its float32 record comes out of the budget, not on top of it; nothing for a small one."""
    room = analysis.trace_room(model, tuple(x.shape[-2:]))
    if room <= 2 * analysis.COMPACT_ABOVE:
        return contextlib.nullcontext()
    return membudget.shared().reserve(min(room, membudget.shared().max_bytes // 2), "tracing a big model")


def has_stored_trace(name: str, key: str) -> bool:
    """Whether folder checkpoint `name` has its trace of gallery image `key` stored beside it (current)."""
    ref = model_ref(name)
    return ref.is_file and stored_trace.is_current(ref.key, key)


def trace(name: str, key: str, img: Image.Image | None = None) -> analysis.Trace:
    """The trace of image `key` (a gallery id, or `image_key(img)` with `img` for uploads); a
    folder checkpoint's first gallery image from the trace stored beside it (`vitpe_core.stored_trace`)."""
    return _trace(model_ref(name), key, img)


@budgeted("traces", max_items=TRACE_CACHE_ENTRIES)
def _swin_trace(ref: ModelRef, key: str, _img: Image.Image | None) -> SwinTrace:
    ckpt = load_model(ref)
    x = checkpoint_input(_img if _img is not None else gallery_image(key), ckpt)
    return swin_trace_image(ckpt.model, x)


def swin_trace(name: str, key: str, img: Image.Image | None = None) -> SwinTrace:
    """`trace` for a Swin: `swin.explore.trace_image` (every block's windows, bias, attention)."""
    return _swin_trace(model_ref(name), key, img)


@budgeted("positional views", max_items=256)
def _positional(ref: ModelRef, key: str, patch: tuple[int, int],
                _img: Image.Image | None) -> tuple[str, np.ndarray] | None:
    return analysis.positional_component(load_model(ref).model, _trace(ref, key, _img), patch)


def positional(name: str, key: str, patch: tuple[int, int], img: Image.Image | None = None
               ) -> tuple[str, np.ndarray] | None:
    """`analysis.positional_component`: (label, `(L, h, H, W)`) or None for `none`."""
    return _positional(model_ref(name), key, tuple(patch), img)


@budgeted("attention stats", max_items=256)
def _stats(ref: ModelRef, key: str, _img: Image.Image | None) -> dict[str, np.ndarray]:
    return analysis.attention_stats(_trace(ref, key, _img))


def attention_stats(name: str, key: str, img: Image.Image | None = None) -> dict[str, np.ndarray]:
    return _stats(model_ref(name), key, img)


# ----------------------------------------------------------------------------- tables
def has_table(name: str) -> bool:
    return "table" in position_hooks(get_checkpoint(name).model)     # a Swin has none


def _similarity_of(model: ViT, params: dict | None = None) -> dict[str, Any] | None:
    table = analysis.position_table(model, params=params)
    if table is None:
        return None
    sim = analysis.cosine_similarity(table)                              # (N, N)
    return {"sim": sim.astype(np.float32), "grid": model.cfg.grid,
            "score": analysis.structure_score(sim, model.cfg.grid)}


@budgeted("similarity", max_items=256)
def _similarity(ref: ModelRef, epoch: int | None) -> dict[str, Any] | None:
    ckpt = load_model(ref)
    params = None if epoch is None else ckpt.history[epoch]
    return _similarity_of(ckpt.model, params)


def similarity(name: str, epoch: int | None = None) -> dict[str, Any] | None:
    """`{"sim": (N, N), "grid": (H, W), "score": structure_score}` of the table (at `epoch`
    from the training history, or the final one); None without a table."""
    return _similarity(model_ref(name), epoch)


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


@budgeted("structure history", max_items=64)
def _structure_history(ref: ModelRef) -> dict[int, dict[str, float]]:
    ckpt = load_model(ref)
    out = {}
    for epoch in ckpt.history:
        res = _similarity(ref, epoch)
        if res is not None:
            out[epoch] = res["score"]
    return out


def structure_history(name: str) -> dict[int, dict[str, float]]:
    """epoch -> structure score of the table recorded at that epoch."""
    return _structure_history(model_ref(name))


def structure_runs(names: list[str]) -> dict[str, tuple[list[int], list[float]]]:
    """name -> (recorded epochs, Spearman structure score at each), for names with a history."""
    runs = {}
    for name in names:
        hist = structure_history(name)
        if hist:
            runs[name] = (sorted(hist), [hist[e]["spearman"] for e in sorted(hist)])
    return runs


# ----------------------------------------------------------------------------- how position is encoded
@budgeted("position analysis", max_items=64)
def _position(ref: ModelRef) -> dict[str, np.ndarray]:
    from vitpe_core import positional
    if ref.is_file:
        cached = positional.read_cache(ref.key)
        if cached is not None:
            return cached
    _, arrays = positional.analyze(load_model(ref))
    if ref.is_file:
        try:
            positional.write_cache(ref.key, arrays)     # `python -m vitpe_core analyze` writes the same file
        except OSError:
            pass                                     # a read-only folder: the in-memory cache still serves
    return arrays


def position_analysis(name: str) -> dict[str, np.ndarray]:
    """`positional.analyze`'s arrays for a checkpoint (kind, kernel, offset_kernel, spread,
    relative_score, mean_distance, entropy): from the cache file beside it when it is current,
    else computed on the gallery image set (seconds for the shipped models) and cached."""
    return _position(model_ref(name))

