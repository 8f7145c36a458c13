"""naver-ai/rope-vit (and facebookresearch/deit `models_v2`) keys -> timm's keys: `gamma_N` to
LayerScale, RoPE-Mixed's learned `freqs` to vitpe's `rope_freqs`.

At another input size RoPE-ViT recomputes its rotations for the grid (integer positions: vitpe's
`rope_axial` / `rope_mixed` do the same) and resamples its patches-only table with
`F.interpolate(mode='bicubic', align_corners=False)`, without antialiasing: timm.py gives the
`rope-vit` family that rule (`APE_RULES`: at import for `img_size=`, and as the `ape` options the
model keeps for an input of another size)."""
from __future__ import annotations

import re

import torch

from ..checkpoint import CheckpointError

GAMMA = re.compile(r"(blocks\.\d+)\.gamma_([12])$")   # `models_v2`'s LayerScale -> timm's `lsN.gamma`
TRAINING_GRID = ("freqs_t_x", "freqs_t_y")            # the training grid's integer positions: recomputed per grid


def from_rope_vit(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """facebookresearch/deit `models_v2` names (DeiT-III, and naver-ai/rope-vit built on it) ->
    timm names; RoPE-Mixed's `freqs` stay for `rope_freqs` once the heads are known."""
    out = {}
    for k, v in sd.items():
        if m := GAMMA.match(k):
            out[f"{m.group(1)}.ls{m.group(2)}.gamma"] = v
        elif k not in TRAINING_GRID:
            out[k] = v
    freqs = out.get("freqs")
    if freqs is not None and (freqs.ndim != 3 or freqs.shape[0] != 2):
        raise CheckpointError(f"RoPE-Mixed `freqs` must be (2, depth, heads*d/2), got {tuple(freqs.shape)}")
    return out


def rope_freqs(freqs: torch.Tensor, heads: int) -> torch.Tensor:
    """RoPE-ViT's `(2, L, h*d/2)` learned frequencies -> vitpe's `rope_freqs (L, 2, h, d/2)`."""
    _, depth, width = freqs.shape
    if width % heads:
        raise CheckpointError(f"freqs width {width} is not divisible by {heads} heads: pass --heads")
    return freqs.reshape(2, depth, heads, width // heads).permute(1, 0, 2, 3).contiguous()
