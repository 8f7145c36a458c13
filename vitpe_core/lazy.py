"""Torch on first use, for the modules the app imports before torch (its first page needs none):
PEP 562 lazy names (`vitpe_core`'s and `vitpe_core.swin`'s public names, imported from their
submodules on first use) and `no_grad` (`@torch.no_grad()` importing torch at the call)."""
from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable


def lazy_names(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for `package`, whose `names` (name -> submodule) are imported on
    first use and then kept in the package's namespace."""
    def __getattr__(name: str) -> Any:
        if name in names:
            value = getattr(importlib.import_module(f".{names[name]}", package), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__


def no_grad(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`@torch.no_grad()` with torch imported at the call, not at the module's import (the app
    imports the modules that use it before torch: its first page needs none)."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.no_grad():
            return fn(*args, **kwargs)

    return run
