"""Every family's converter, by the family name `detect.narrow` gives: one table, one shape
(`convert(sd, ctx) -> (weights, config, notes)`, context.py)."""
from __future__ import annotations

from typing import Callable, Mapping

from torch import Tensor

from . import beit, clip, dinov2, dinov3, hf_vit, swin, timm, timm_beit, timm_dinov3, timm_eva, timm_rope, timm_swin
from .context import Context, Converted

SWIN_FAMILIES = ("hf-swin", "hf-swinv2", "timm-swin", "timm-swinv2")
CONVERTERS: dict[str, Callable[[Mapping[str, Tensor], Context], Converted]] = {
    "timm": timm.convert, "timm-clip": timm.convert, "timm-siglip": timm.convert, "rope-vit": timm.convert,
    "hf": hf_vit.convert,
    "beit": beit.convert, "data2vec-vision": beit.convert, "dinov2": dinov2.convert, "dinov3": dinov3.convert,
    "clip": clip.convert, "siglip": clip.convert,
    "timm-beit": timm_beit.convert, "timm-eva02": timm_eva.convert, "timm-dinov3": timm_dinov3.convert,
    "timm-rope-vit": timm_rope.convert,
    "hf-swin": swin.convert, "hf-swinv2": swin.convert,
    "timm-swin": timm_swin.convert, "timm-swinv2": timm_swin.convert,
}
