"""Which family a state dict is: its keys, and `config.json`'s `model_type` where one lies beside it."""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

import torch

from ..checkpoint import CheckpointError
from .keymap import LAYER_SCALE_GAMMA
from .timm_dinov3 import is_dinov3
from .timm_rope import FREQS, is_port

FAMILIES = ("timm", "hf", "rope-vit", "beit", "data2vec-vision", "dinov2", "dinov3", "clip", "siglip", "timm-beit",
            "timm-eva02", "timm-dinov3", "timm-rope-vit", "swin")   # what a caller may name; `narrow` gives the variant
HF_FAMILIES = ("beit", "data2vec-vision", "dinov2", "dinov3", "clip", "siglip")   # importers/<family>.py
MODEL_TYPES = {"vit": "hf", "beit": "beit", "data2vec-vision": "data2vec-vision", "dinov2": "dinov2",
               "dinov2_with_registers": "dinov2", "dinov3_vit": "dinov3", "clip": "clip",
               "clip_vision_model": "clip", "siglip": "siglip", "siglip_vision_model": "siglip"}
ONE_LAYOUT = {"data2vec-vision": "beit"}   # one layout, two names
SWIN_MODEL_TYPES = {"swin": 1, "swinv2": 2}
TIMM_SWIN_MARKERS = re.compile(r"^layers\.\d+\.blocks\.\d+\.attn\.(relative_position_bias_table|cpb_mlp\.0\.weight|"
                               r"logit_scale)$")   # timm's and Microsoft's layout (timm_swin.py)
SWIN_MARKERS = re.compile(   # transformers' layout (importers/swin.py), or timm's
    r"layers\.\d+\.blocks\.\d+\.attention\.(self\.relative_position_bias_table|"
    r"relative_position_bias\.relative_position_bias_table|self\.continuous_position_bias_mlp)|"
    + TIMM_SWIN_MARKERS.pattern)

# Keys only one family has (checked before the older, looser timm / HF ViT rules).
MARKERS = {
    "timm-beit": r"^blocks\.\d+\.attn\.(q_bias|v_bias|relative_position_bias_table|q_proj\.weight)$|"
                 r"^rel_pos_bias\.relative_position_bias_table$",   # timm's Beit (and Eva: EVA-02)
    "beit": r"(^|\.)relative_position_bias_table$|\.lambda_[12]$|^beit\.|^data2vec_vision\.",
    "dinov2": r"\.layer_scale1\.lambda1$|^(dinov2|dinov2_with_registers)\.",
    "dinov3": r"^(model\.)?layer\.\d+\.|^embeddings\.patch_embeddings\.weight$",
    "clip": r"(^|\.)pre_layrnorm\.|(^|\.)embeddings\.class_embedding$",
    "siglip": r"(^|\.)head\.probe$|(^|\.)post_layernorm\.",
}


def detect_family(sd: Mapping[str, torch.Tensor], config: Mapping[str, Any] | None = None) -> str:
    """The family whose key layout `sd` has (and `config`'s `model_type`, when given, agrees
    with); CheckpointError naming the deciding keys otherwise."""
    keys = list(sd)
    if is_swin(config if config and "model_type" in config else keys):
        return "swin"   # first: a Swin's keys hold `relative_position_bias_table` too, which reads as BEiT's
    if is_rope_vit_port(sd, config):
        return "timm-rope-vit"   # timm's Eva: the original RoPE-ViT's names, its axial rotation not in the keys
    if is_dinov3(config) and any(re.match(r"blocks\.\d+\.attn\.qkv\.weight$", k) for k in keys):
        return "timm-dinov3"   # timm's Eva: timm ViT's or BEiT's names, a rotary embedding the keys do not show
    if eva_with_registers(sd):
        return "timm-dinov3"   # registers and DeiT-III's LayerScale names: timm's Eva (refused without its config)
    marked = {f: [k for k in keys if re.search(p, k)] for f, p in MARKERS.items()}
    if marked["timm-beit"]:   # timm's names of BEiT's table are not Hugging Face's
        marked["beit"] = [k for k in marked["beit"] if not k.startswith(("blocks.", "rel_pos_bias."))]
    if marked["dinov3"] or marked["beit"]:
        marked["dinov2"] = [k for k in marked["dinov2"] if k.startswith(("dinov2.", "dinov2_with_registers."))]
    if marked["clip"]:
        marked["siglip"] = []
    hits = [f for f, ks in marked.items() if ks]
    typed = MODEL_TYPES.get(str((config or {}).get("model_type", "")))
    if len(hits) > 1:
        raise CheckpointError(f"ambiguous layout: keys of several families ({', '.join(hits)}): "
                              + "; ".join(f"{f}: {marked[f][:3]}" for f in hits) + ". Pass --family")
    family = hits[0] if hits else _older_family(keys, sd)
    if typed and ONE_LAYOUT.get(typed, typed) != ONE_LAYOUT.get(family, family):
        raise CheckpointError(f"config.json beside the file says model_type {config['model_type']!r} ({typed}) but the "
                              f"keys are {family}'s (e.g. {(marked.get(family) or keys)[:2]}); pass --family")
    if family == "beit" and (typed == "data2vec-vision" or any(k.startswith("data2vec_vision.") for k in keys)):
        return "data2vec-vision"
    if family == "timm-beit" and str((config or {}).get("architecture", "")).startswith("eva02_"):
        return "timm-eva02"   # timm's Eva: BEiT's query / value biases, a rotary embedding the keys do not show
    return family


def is_rope_vit_port(sd: Mapping[str, torch.Tensor], config: Mapping[str, Any] | None) -> bool:
    """timm's port of naver-ai/rope-vit: timm's config.json names a `vit_*_patch16_rope*_224` architecture (the
    axial port's keys are the original RoPE-Axial's), or the keys hold the mixed port's `rope.freqs` (timm's
    `RotaryEmbeddingMixed`, which only the port builds; a timm-ViT path would leave it out as foreign)."""
    eva = any(re.match(r"blocks\.\d+\.attn\.qkv\.weight$", k) for k in sd)
    return eva and (is_port(config) or FREQS in sd)


def eva_with_registers(sd: Mapping[str, torch.Tensor]) -> bool:
    """The keys of timm's `Eva` with register tokens: `reg_token` and `blocks.N.gamma_1`, no relative
    table or `freqs` (RoPE-ViT names LayerScale `gamma_1` too, but has no registers)."""
    return ("reg_token" in sd and any(LAYER_SCALE_GAMMA.match(k) for k in sd)
            and not any(k.endswith("relative_position_bias_table") or k == "freqs" for k in sd))


def is_swin(config_or_keys: Mapping[str, Any] | Iterable[str] | None) -> bool:
    """Whether a Hugging Face `config.json` (its `model_type`) or a state dict's keys are a Swin
    or Swin-V2 in transformers' layout, or in timm's (or Microsoft's)."""
    if config_or_keys is None:
        return False
    if isinstance(config_or_keys, Mapping) and "model_type" in config_or_keys:
        return config_or_keys.get("model_type") in SWIN_MODEL_TYPES
    return any(SWIN_MARKERS.search(str(k)) for k in config_or_keys)


def narrow(family: str, sd: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> str:
    """The variant of layout `family` that `sd` is, as imported and recorded: a BEiT layout's
    data2vec-vision, a timm ViT's CLIP- or SigLIP-style layers, a Swin's version and layout."""
    if family == "swin":
        if not is_swin(config if "model_type" in config else sd):
            raise CheckpointError("--family swin: the file has no Swin keys (layers.N.blocks.M.attention...) and "
                                  "config.json no swin/swinv2 model_type")
        layout = "timm-swin" if any(TIMM_SWIN_MARKERS.match(k) for k in sd) else "hf-swin"
        v2 = any("continuous_position_bias_mlp" in k or ".attn.cpb_mlp." in k for k in sd)
        return layout + ("v2" if v2 else "")
    if family in ("beit", "data2vec-vision"):
        data2vec = config.get("model_type") == "data2vec-vision" or any(k.startswith("data2vec_vision.") for k in sd)
        return "data2vec-vision" if data2vec else "beit"
    if family == "timm":
        return ("timm-clip" if "norm_pre.weight" in sd else
                "timm-siglip" if any(k.startswith("attn_pool.") for k in sd) else "timm")
    return family


def _older_family(keys: list[str], sd: Mapping[str, torch.Tensor]) -> str:
    """timm, Hugging Face ViT or RoPE-ViT, from their keys."""
    hf = [k for k in keys if k.startswith(("vit.embeddings.", "embeddings.patch_embeddings.",
                                           "embeddings.position_embeddings"))]
    rope = [k for k in keys if LAYER_SCALE_GAMMA.match(k) or k == "freqs"]
    timm = [k for k in keys if re.match(r"blocks\.\d+\.attn\.qkv\.weight$", k)]
    found = {"hf": hf, "rope-vit": rope, "timm": timm if not rope else []}
    hits = [f for f, ks in found.items() if ks]
    if len(hits) == 1:
        family = hits[0]
        if family == "rope-vit" and "freqs" not in sd and "pos_embed" in sd:
            raise CheckpointError(
                "ambiguous layout: DeiT-III names (`blocks.N.gamma_1`) with a `pos_embed` and no `freqs` are either "
                "RoPE-ViT's RoPE-Axial + APE or a plain DeiT-III from facebookresearch/deit; pass --family rope-vit "
                "(rotary axial + table) or --family timm (table only)")
        return family
    if not hits:
        raise CheckpointError(f"unknown layout: none of the keys names a timm ViT (`blocks.N.attn.qkv.weight`), a "
                              f"Hugging Face ViT (`vit.embeddings.*`), BEiT, DINOv2/v3, CLIP, SigLIP or a RoPE-ViT "
                              f"(`blocks.N.gamma_1`, `freqs`); first keys: {keys[:6]}")
    raise CheckpointError(f"ambiguous layout: keys of several families ({', '.join(hits)}): "
                          + "; ".join(f"{f}: {found[f][:3]}" for f in hits) + ". Pass --family")
