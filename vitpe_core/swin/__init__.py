"""Swin and Swin-V2: a hierarchical window-attention model of its own (the architecture demands
it: patch merging, shifted windows), with the same `trace` idea as the ViT's.

* `config`: `SwinConfig` (stored in a checkpoint with `"arch": "swin"`).
* `model`: `SwinTransformer`, `forward(images, trace=[])` records per block the window layout,
  the relative bias (Swin's table / Swin-V2's CPB output `16 sigmoid`) and the attention weights.
* `windows`: what the bias explorer draws for a patch: its window's bias and attention rows on the
  stage's grid, with the window grid and the shift (`window_rows`).
* `convert`: Hugging Face `save_pretrained` weights -> `SwinTransformer` (`import_swin`, `is_swin`);
  imported on its own (`from vitpe_core.swin.convert import import_swin`), since it reads
  `checkpoint`, which builds Swin models from this package. `timm_layout`: timm's (and
  Microsoft's) key names and what timm computes differently (`check_windows`), read by `convert`.
"""
from __future__ import annotations

from .config import SwinConfig
from .model import SwinTransformer

__all__ = ["SwinConfig", "SwinTransformer"]
