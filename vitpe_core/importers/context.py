"""What every family's converter is given beside the state dict, and what it gives back.

Every converter has one shape, `convert(sd, ctx) -> (weights, config, notes)`: `weights` in the
vitpe model's names (in the file's precision; core.py upcasts and loads them), `config` the
`ViTConfig` or `SwinConfig` to build, `notes` what was left out, assumed or resampled.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from torch import Tensor

from ..config import ViTConfig
from ..swin.config import SwinConfig


@dataclass(frozen=True)
class Context:
    """The family (as detected, or given and narrowed: `detect.narrow`), the `config.json` beside
    the file (with `preprocessor_config.json` merged in; `{}` without one) and the caller's options
    that decide what the keys cannot (docs/importing.md)."""

    family: str
    config: Mapping[str, Any] = field(default_factory=dict)
    img_size: tuple[int, int] | None = None   # (H, W) pixels to build the model for; None: the trained size
    heads: int | None = None
    pool: str | None = None
    act: str | None = None
    window: int | None = None                 # a timm Swin-V2's window


Converted = tuple[dict[str, Tensor], Union[ViTConfig, SwinConfig], list[str]]
