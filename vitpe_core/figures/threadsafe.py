"""Plotly without a half-imported pandas: `patch_plotly()`, applied when `vitpe_core.figures` is
imported; `plotly_patched()` says whether it holds for every Plotly module loaded.

Plotly asks "is pandas loaded?" with `get_module("pandas", should_load=False)`, a bare
`sys.modules.get` (`_plotly_utils.optional_imports`). A module enters `sys.modules` before its
body runs, so while one thread imports pandas another thread's figure sees a module without
`Series` and fails ("partially initialized module 'pandas' has no attribute 'Series'";
plotly/plotly.py#2433, open). In a Streamlit server every session's script runs in its own
thread of one process: a page importing pandas broke another session's chart (RELIABILITY.md),
and the app had to import pandas (0.3 s of CPU) before any page could draw a chart. narwhals,
which Plotly also uses, made the same check safe upstream (narwhals#4067: a module whose
`__spec__._initializing` is set counts as not loaded, as CPython's own import system reads it);
`patch_plotly` gives Plotly's `get_module` that rule, and nothing else changes.

It replaces `get_module` in `_plotly_utils.optional_imports` (modules imported later bind the
safe one) and in every Plotly module already loaded that bound the original by name. Idempotent.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

_PLOTLY_PACKAGES = ("plotly", "_plotly_utils")


def _loaded(name: str) -> ModuleType | None:
    """Module `name` if it has finished importing, else None (also while another thread imports it)."""
    module = sys.modules.get(name)
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def _safe(original: Any) -> Any:
    def get_module(name: str, should_load: bool = True) -> Any:
        if not should_load:
            return _loaded(name)
        return original(name, should_load)

    get_module.__doc__ = original.__doc__
    get_module._vitpe_safe = True        # type: ignore[attr-defined]
    get_module._vitpe_original = original   # type: ignore[attr-defined]
    return get_module


def patch_plotly() -> int:
    """Make Plotly's "is this module loaded?" ignore a module still being imported; returns how
    many bindings were replaced (0 when already patched)."""
    from _plotly_utils import optional_imports

    original = optional_imports.get_module
    if getattr(original, "_vitpe_safe", False):
        original = original._vitpe_original
    safe = optional_imports.get_module if getattr(optional_imports.get_module, "_vitpe_safe", False) \
        else _safe(original)
    replaced = 0
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".", 1)[0] not in _PLOTLY_PACKAGES:
            continue
        if getattr(module, "get_module", None) is original:
            module.get_module = safe
            replaced += 1
    return replaced


def plotly_patched() -> bool:
    """Whether every loaded Plotly module's `get_module` is the safe one."""
    mods = [m for n, m in list(sys.modules.items()) if m is not None and n.split(".", 1)[0] in _PLOTLY_PACKAGES]
    return all(getattr(m.get_module, "_vitpe_safe", False) for m in mods if callable(getattr(m, "get_module", None)))
