"""PEP 562 lazy names: a package's public names imported from their submodules on first use
(`vitpe_core`'s and `vitpe_core.swin`'s), so that importing the package does not import torch."""
from __future__ import annotations

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
