"""Loading the checkpoints a page shows, through `cache`: one that cannot be used is said on
the page (an `st.error` naming it and why) and left out, never raised."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import streamlit as st

from vitpe_core.checkpoint import Checkpoint, CheckpointHeader
from vitpe_core.config import ViTConfig

from . import cache


def _or_error(name: str, get: Callable[..., Any], *args: Any, passes: tuple[type, ...] = ()) -> Any:
    """`get(name, *args)`, or None after an st.error saying why checkpoint `name` cannot be used;
    the errors in `passes` are raised on."""
    try:
        return get(name, *args)
    except passes:
        raise
    except (ValueError, OSError) as e:   # CheckpointError is a ValueError
        st.error(f"Checkpoint {name!r} cannot be used: {e}")
        return None


def load_checkpoint_or_error(name: str) -> Checkpoint | None:
    """The checkpoint, or None after an st.error saying why it cannot be used."""
    return _or_error(name, cache.get_checkpoint)


def header_or_error(name: str) -> CheckpointHeader | None:
    """The checkpoint's config, metrics and recorded epochs without its model (`cache.checkpoint_header`:
    a folder file's header, no torch), or None after an st.error saying why it cannot be used."""
    return _or_error(name, cache.checkpoint_header)


def trace_or_error(name: str, key: str, img=None):
    """`cache.trace` of image `key` through checkpoint `name`, or None after an st.error saying
    why the checkpoint cannot be used (a sound header over weights that do not fit its config is
    found only here, where the page needs the model: `header_or_error` read the header alone). A
    model the store evicted mid-run is raised on: the router says what happened (app.py)."""
    return _or_error(name, cache.trace, key, img, passes=(cache.ModelEvicted,))


def checkpoint_configs(names: Sequence[str]) -> dict[str, ViTConfig]:
    """name -> model config for every checkpoint whose header reads (no model is loaded); an
    st.error for each that does not."""
    read = {name: _or_error(name, cache.checkpoint_config) for name in names}
    return {name: cfg for name, cfg in read.items() if cfg is not None}


def load_checkpoints(names: Sequence[str]) -> dict[str, Checkpoint]:
    """name -> checkpoint for every one that loads; an st.error for each that does not. The
    first visit reads them from disk, behind a spinner that says so."""
    with st.spinner(f"Loading {len(names)} checkpoints (the first visit reads them from disk)…"):
        loaded = {name: load_checkpoint_or_error(name) for name in names}
    return {name: ckpt for name, ckpt in loaded.items() if ckpt is not None}


def load_shown(ref: str, shown: Sequence[str]) -> tuple[dict[str, Checkpoint], list[str], Any]:
    """Load checkpoint `ref` and the `shown` ones, no others: (name -> checkpoint, the shown
    names that loaded, the reference checkpoint: `ref`, else the first that loaded, else None)."""
    ckpts = load_checkpoints(list(dict.fromkeys([ref, *shown])))
    return ckpts, [n for n in shown if n in ckpts], ckpts.get(ref) or next(iter(ckpts.values()), None)
