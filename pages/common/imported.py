"""A visitor's imported models on this server: held in memory (`model_store`, a pool of the process's
one memory budget), kept on disk under the sha256 of what was uploaded (`disk_models`, shared with every
process that sees the folder: replicas, a restarted server), one run at a time on a big one
(`model_turns`, `vitpe_core.turns`), and listed per browser session (`uploaded_models`). The caches
(cache.py) load them through `stored_model`; an import (model_import.py) puts them here; a link's
`model=<sha256>` joins a session through `open_shared_model`."""
from __future__ import annotations

import logging
import os
import threading

import streamlit as st

from vitpe_core import membudget
from vitpe_core.checkpoint import Checkpoint, list_checkpoints
from vitpe_core.store import LRUStore, ModelStore, default_model_dir, model_bytes
from vitpe_core.turns import Turns

MAX_MODEL_UPLOAD_MB = 200          # per file (the uploader says so; .streamlit/config.toml allows it)
MAX_SESSION_MODELS = 2             # imported models one browser session lists
MAX_SERVER_MODELS = 4              # held in memory for all sessions together, least recently used out
#                                    (their bytes count against the process's one budget, `membudget`)
MODELS_GONE = "_vitpe_models_gone"   # the session's imported models the store evicted (the import form says so)
EVICTED = "_vitpe_models_evicted"    # every name of this session's imported models the store evicted (`ModelEvicted`)


@st.cache_resource
def model_store() -> LRUStore[Checkpoint]:
    """The server's one store of imported models (shared by content hash, bounded: a pool of
    the process's memory budget)."""
    return LRUStore(MAX_SERVER_MODELS, budget=membudget.shared())


MAX_DISK_MODELS_MB = int(os.environ.get("VITPE_MODEL_STORE_MB", "2048"))   # the model store's cap on disk


@st.cache_resource(max_entries=8, show_spinner=False)
def _load_lock(sha: str):
    return threading.Lock()


@st.cache_resource
def _disk_models(folder: str) -> ModelStore:
    return ModelStore(folder, max_bytes=MAX_DISK_MODELS_MB * 2**20)


def disk_models() -> ModelStore:
    """The imported models on disk (`$VITPE_MODEL_DIR`, default `models/` in the upload folder),
    shared with every process that sees the folder."""
    return _disk_models(str(default_model_dir()))


def stored_model(sha: str) -> Checkpoint | None:
    """The imported model `sha`: from memory, else from disk (then held in memory again), else None."""
    store = model_store()
    ckpt = store.get(sha)
    if ckpt is None:
        with _load_lock(sha):             # one process loads it once, the other sessions wait for it
            ckpt = store.get(sha)
            if ckpt is None and sha in disk_models():
                # room first, as for an import: the file's tensors and the model built from them (about
                # twice the file at most) come out of the budget, not on top of it
                room = min(2 * disk_models().file_bytes(sha), store.max_bytes)
                with store.budget.reserve(room, f"loading imported model {sha[:12]} from disk"):
                    ckpt = disk_models().get(sha)
                membudget.release_freed_memory()         # the file's tensors, spent as the model was built
                if ckpt is not None:
                    store.put(sha, ckpt, model_bytes(ckpt.model))
    return ckpt


BIG_MODEL_MB = 32      # an imported model this big takes a turn: one run at a time loads or uses one


@st.cache_resource
def model_turns() -> Turns:
    """The server's turns for big imported models (`vitpe_core.turns`; app.py gives a run's back at its end)."""
    return Turns(slots=1)


def take_turn(sha: str) -> None:
    """This run's turn before it loads or uses the imported model `sha`, when that is big: a model in use
    stays in memory after the budget evicted it, so two runs on two such models held both."""
    if model_turns().holds():          # once per run: its later models need no size looked up
        return
    nbytes = disk_models().file_bytes(sha)
    if not nbytes and (held := model_store().get(sha)) is not None:
        nbytes = model_bytes(held.model)
    if nbytes >= BIG_MODEL_MB * 2**20:
        from .cache import _spinner
        model_turns().take(f"imported model {sha[:12]}",
                           on_wait=lambda: _spinner("Another visitor's large model is in use; yours comes next…"))


def keep_on_disk(sha: str, ckpt: Checkpoint) -> str | None:
    """Write an imported model to the disk store (in its file's precision); a note if it could not be kept."""
    import torch
    dtype = getattr(torch, str(ckpt.metrics.get("source_dtype", "float32")), torch.float32)
    dtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float32
    try:
        if disk_models().put(sha, ckpt, dtype):
            return None
        return "It is larger than the server's model store on disk: a link to it opens while this server holds it."
    except OSError as e:
        logging.getLogger("vitpe_core.store").warning("model store: %s not kept on disk: %s", sha[:12], e)
        return ("It could not be written to the server's model store on disk: a link to it opens while this server "
                "holds it in memory.")


def uploaded_models() -> dict[str, str]:
    """This session's imported models: name -> sha256 of the uploaded file (only this session
    sees them; the models themselves live in `model_store` and on disk, `disk_models`; ones gone
    from both are dropped here)."""
    mine = st.session_state.setdefault("_vitpe_models", {})
    store = model_store()
    gone = [n for n, sha in mine.items() if sha not in store and sha not in disk_models()]
    for n in gone:
        del mine[n]
    if gone:
        st.session_state[MODELS_GONE] = gone
        st.session_state.setdefault(EVICTED, set()).update(gone)
    return mine


def open_shared_model(name: str, sha: str) -> tuple[str | None, list[str]]:
    """A link's imported model (`ckpt=name&model=sha`) in this session: (its name in this
    session's lists, notes). The model is looked up by content hash in the server's store, so
    a link works for anyone on this server while the store holds the model; its name is the
    store's (never the link's: a link cannot rename a model as a folder checkpoint). None with
    a note when the store no longer holds it."""
    mine = uploaded_models()
    for n, s in mine.items():
        if s == sha:
            return n, []
    take_turn(sha)
    ckpt = stored_model(sha)
    if ckpt is None:
        return None, [f"The imported model of this link ({name[:40]}, {sha[:12]}…) is not on this server any more: "
                      "it was imported on another server, or removed to make room for newer imports. Import the "
                      "weights file again on the Checkpoints page to see it."]
    return _list_in_session(ckpt.name, sha, [])


def _list_in_session(name: str, sha: str, notes: list[str]) -> tuple[str, list[str]]:
    """List the store's model `sha` in this session as `name` (with `_` appended while another
    checkpoint has that name), dropping the session's oldest beyond MAX_SESSION_MODELS."""
    from .cache import checkpoint_root
    mine = uploaded_models()
    while name in mine or name in list_checkpoints(checkpoint_root()):
        name += "_"
    if len(mine) >= MAX_SESSION_MODELS:
        oldest = next(iter(mine))
        del mine[oldest]
        notes.append(f"Removed `{oldest}` from your list: a session keeps at most {MAX_SESSION_MODELS} imported "
                     "models.")
    mine[name] = sha
    return name, notes
