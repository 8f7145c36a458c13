"""The eval transform of an imported model: each family's default (timm's `resolve_data_config`
for timm's weights, each Hugging Face family's image processor), then what the files beside the
weights say (timm's `pretrained_cfg`, `preprocessor_config.json`), then the caller's overrides."""
from __future__ import annotations

from typing import Any, Mapping

from ..checkpoint import CheckpointError
from . import timm_hub
from .detect import HF_FAMILIES

IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
INCEPTION = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}
CLIP = {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]}
NORMS = {"imagenet": IMAGENET, "inception": INCEPTION, "clip": CLIP}
DEFAULT_PREPROCESS = {   # family -> normalisation and centre-crop fraction (resize shorter side to size / crop_pct)
    "timm": {**IMAGENET, "crop_pct": 0.875, "interpolation": "bicubic"},
    "hf": {**INCEPTION, "crop_pct": 1.0, "interpolation": "bilinear"},
    "rope-vit": {**IMAGENET, "crop_pct": 1.0, "interpolation": "bicubic"},
    "beit": {**INCEPTION, "crop_pct": 1.0, "interpolation": "bicubic"},
    "data2vec-vision": {**INCEPTION, "crop_pct": 1.0, "interpolation": "bicubic"},
    "dinov2": {**IMAGENET, "crop_pct": 0.875, "interpolation": "bicubic"},
    "dinov3": {**IMAGENET, "crop_pct": 1.0, "interpolation": "bilinear"},
    "clip": {**CLIP, "crop_pct": 1.0, "interpolation": "bicubic"},
    "siglip": {**INCEPTION, "crop_pct": 1.0, "interpolation": "bicubic"},
    "hf-swin": {**IMAGENET, "crop_pct": 0.875, "interpolation": "bicubic"},   # Swin's (timm, microsoft)
    "hf-swinv2": {**IMAGENET, "crop_pct": 0.875, "interpolation": "bicubic"},
    # timm's layouts of the other families (timm's config.json's pretrained_cfg replaces these where it lies beside)
    "timm-beit": {**INCEPTION, "crop_pct": 0.9, "interpolation": "bicubic"},
    "timm-eva02": {**CLIP, "crop_pct": 0.9, "interpolation": "bicubic"},
    "timm-dinov3": {**IMAGENET, "crop_pct": 1.0, "interpolation": "bicubic"},
    "timm-rope-vit": {**IMAGENET, "crop_pct": 0.9, "interpolation": "bicubic"},   # the port's pretrained_cfg
    "timm-clip": {**CLIP, "crop_pct": 1.0, "interpolation": "bicubic"},
    "timm-siglip": {**INCEPTION, "crop_pct": 1.0, "interpolation": "bicubic"},
    "timm-swin": {**IMAGENET, "crop_pct": 0.9, "interpolation": "bicubic"},
    "timm-swinv2": {**IMAGENET, "crop_pct": 0.9, "interpolation": "bicubic"},
}
PIL_RESAMPLE = {2: "bilinear", 3: "bicubic"}   # image processors' `resample` (PIL's codes)


def check_norm(norm: str | None) -> None:
    if norm and norm not in NORMS:
        raise CheckpointError(f"unknown norm {norm!r}; valid: {sorted(NORMS)}")


def eval_transform(family: str, config: Mapping[str, Any], norm: str | None, crop_pct: float | None
                   ) -> dict[str, Any]:
    """The family's eval transform, with what timm's or the image processor's config says where it
    lies beside the file, and `norm` / `crop_pct` given by the caller over both."""
    pre = dict(DEFAULT_PREPROCESS[family])
    if family.startswith("timm"):
        pre.update(timm_hub.preprocess(config))
    elif "image_mean" in config and "image_std" in config:
        pre.update(mean=list(config["image_mean"]), std=list(config["image_std"]))
    if family in HF_FAMILIES:   # their crop and resampling: the image processor's
        pre.update(processor_crop(config))
    if norm:   # checked by core before converting: `check_norm`
        pre.update(NORMS[norm])
    if crop_pct is not None:
        if not 0.1 <= crop_pct <= 1.0:
            raise CheckpointError(f"crop_pct must lie in [0.1, 1], got {crop_pct}")
        pre["crop_pct"] = float(crop_pct)
    return pre


def processor_crop(config: Mapping[str, Any]) -> dict[str, Any]:
    """`crop_pct` and `interpolation` of a `preprocessor_config.json` (resize the shorter side,
    then centre-crop), where it says them; `{}` otherwise."""
    out: dict[str, Any] = {}
    size, crop = config.get("size"), config.get("crop_size")
    if config.get("do_center_crop") and isinstance(size, dict) and "shortest_edge" in size and isinstance(crop, dict):
        out["crop_pct"] = round(float(crop.get("height", size["shortest_edge"])) / float(size["shortest_edge"]), 4)
    elif config.get("do_center_crop") is False:
        out["crop_pct"] = 1.0
    if config.get("resample") in PIL_RESAMPLE:
        out["interpolation"] = PIL_RESAMPLE[config["resample"]]
    return out
