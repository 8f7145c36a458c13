"""Swin and Swin-V2: a hierarchical window-attention model of its own (the architecture demands
it: patch merging, shifted windows), with the same `trace` idea as the ViT's.

* `config`: `SwinConfig` (stored in a checkpoint with `"arch": "swin"`).
* `model`: `SwinTransformer`, `forward(images, trace=[])` records per block the window layout,
  the relative bias (Swin's table / Swin-V2's CPB output `16 sigmoid`) and the attention weights.
* `windows`: what the bias explorer draws for a patch: its window's bias and attention rows on the
  stage's grid, with the window grid and the shift (`window_rows`).
* `explore`: what the app shows of a Swin checkpoint.

Importing Swin weights (Hugging Face's, timm's, Microsoft's) is the importers' job like every
other family's (`vitpe_core/importers/swin.py`, `timm_swin.py`); nothing here imports them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:   # the same names, for type checkers and editors
    from .config import SwinConfig
    from .model import SwinTransformer

# Imported on first use (PEP 562), as `vitpe_core`'s names are: `vitpe_core.swin.config` and
# `vitpe_core.swin.explore` import without torch (the app draws its first page before torch is loaded).
_LAZY = {"SwinConfig": "config", "SwinTransformer": "model"}

__all__ = ["SwinConfig", "SwinTransformer"]


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
