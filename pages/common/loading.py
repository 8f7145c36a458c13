"""Loading the checkpoints a page shows, through `cache`: one that cannot be used is said on
the page (an `st.error` naming it and why) and left out, never raised."""
from __future__ import annotations

from typing import Any, Sequence

import streamlit as st

from vitpe_core.checkpoint import Checkpoint, CheckpointHeader
from vitpe_core.config import ViTConfig

from . import cache


def load_checkpoint_or_error(name: str) -> Checkpoint | None:
    """The checkpoint, or None after an st.error saying why it cannot be used."""
    try:
        return cache.get_checkpoint(name)
    except (ValueError, OSError) as e:   # CheckpointError is a ValueError
        st.error(f"Checkpoint {name!r} cannot be used: {e}")
        return None


def header_or_error(name: str) -> CheckpointHeader | None:
    """The checkpoint's config, metrics and recorded epochs without its model (`cache.checkpoint_header`:
    a folder file's header, no torch), or None after an st.error saying why it cannot be used."""
    try:
        return cache.checkpoint_header(name)
    except (ValueError, OSError) as e:   # CheckpointError is a ValueError
        st.error(f"Checkpoint {name!r} cannot be used: {e}")
        return None


def trace_or_error(name: str, key: str, img=None):
    """`cache.trace` of image `key` through checkpoint `name`, or None after an st.error saying
    why the checkpoint cannot be used (a sound header over weights that do not fit its config is
    found only here, where the page needs the model: `header_or_error` read the header alone)."""
    try:
        return cache.trace(name, key, img)
    except cache.ModelEvicted:      # the router says what happened (app.py)
        raise
    except (ValueError, OSError) as e:   # CheckpointError is a ValueError
        st.error(f"Checkpoint {name!r} cannot be used: {e}")
        return None


def checkpoint_configs(names: Sequence[str]) -> dict[str, ViTConfig]:
    """name -> model config for every checkpoint whose header reads (no model is loaded); an
    st.error for each that does not."""
    configs = {}
    for name in names:
        try:
            configs[name] = cache.checkpoint_config(name)
        except (ValueError, OSError) as e:   # CheckpointError is a ValueError
            st.error(f"Checkpoint {name!r} cannot be used: {e}")
    return configs


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
