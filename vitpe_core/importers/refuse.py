"""What no importer maps, in one table: layers vitpe's ViT does not compute, and timm settings
that change what a model computes, each with the families it applies to.

Importing without such a layer would give different outputs, so the file is refused, naming the
key (or the setting) and what it is. `refuse(sd, family, config)` walks the table; each converter
calls it once it knows the file is its family's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..checkpoint import CheckpointError
from . import timm_hub

TIMM_VIT = frozenset({"timm", "hf", "rope-vit", "timm-clip", "timm-siglip"})   # timm's VisionTransformer (timm.py)
TIMM_EVA = frozenset({"timm-beit", "timm-eva02", "timm-dinov3", "timm-rope-vit"})   # timm's Beit and Eva classes
TIMM_ROPE = frozenset({"timm-rope-vit"})                                            # timm's RoPE-ViT port (Eva)


@dataclass(frozen=True)
class Rule:
    """A layer (`keys`: a regex on the state dict's keys) or a timm `model_args` setting (`arg`,
    with the one `value` vitpe computes) that `families` refuse; `what` says what it is."""

    what: str
    families: frozenset[str]
    keys: str | None = None
    arg: str | None = None
    value: Any = None


RULES = (
    Rule("query/key normalisation (qk_norm)", TIMM_VIT, keys=r"\.attn\.(q_norm|k_norm)\."),
    Rule("a gated MLP in xFormers' names (w12, w3)", TIMM_VIT, keys=r"\.mlp\.(w12|w3)\."),
    Rule("a norm inside the MLP (scale_mlp_norm)", TIMM_VIT, keys=r"\.mlp\.norm\."),
    Rule("a norm inside attention (scale_attn_norm)", TIMM_VIT, keys=r"\.attn\.norm\."),
    Rule("a norm after the patch embedding", TIMM_VIT, keys=r"^patch_embed\.norm\."),
    Rule("a multi-layer head", TIMM_VIT, keys=r"^head\.fc\.|^head_drop"),
    Rule("query/key norms or a position table of the attention-pooling head", frozenset({"timm-siglip"}),
         keys=r"^attn_pool\.(q_norm|k_norm|pos_embed)"),
    Rule("a norm inside the MLP (scale_mlp: EVA-02 base and large)", TIMM_EVA, keys=r"^blocks\.\d+\.mlp\.norm\."),
    Rule("a SwiGLU MLP (swiglu_mlp)", TIMM_EVA - {"timm-dinov3"}, keys=r"^blocks\.\d+\.mlp\.fc1_g\."),
    Rule("a norm inside attention", TIMM_EVA, keys=r"^blocks\.\d+\.attn\.(q_norm|k_norm|norm)\."),
    Rule("one of separate query/key/value projections (qkv_fused=False: EVA-02 base and large only, every timm "
         "DINOv3 packs them in attn.qkv)", TIMM_EVA - {"timm-beit"},
         keys=r"^blocks\.\d+\.attn\.(q_proj|k_proj|v_proj)\."),
    Rule("a learned table (pos_embed beside DINOv3's rotary embedding: use_abs_pos_emb)", frozenset({"timm-dinov3"}),
         keys=r"^pos_embed$"),
    *(Rule("a setting of timm's DINOv3", frozenset({"timm-dinov3"}), arg=name, value=value) for name, value in {
        "rope_type": "dinov3", "rope_grid_offset": 0, "rope_grid_indexing": "ij", "rope_rotate_half": True,
        "attn_type": "eva", "use_post_norm": False, "use_abs_pos_emb": False, "use_pre_transformer_norm": False,
        "qk_norm": False, "scale_attn_inner": False, "scale_mlp": False, "no_embed_class": False,
        "class_token": True}.items()),
    Rule("a register token (the `vit_*_rope_reg*` models' layout, another rotary embedding)", TIMM_ROPE,
         keys=r"^reg_token$"),
    Rule("a norm before the blocks (use_pre_transformer_norm)", TIMM_ROPE, keys=r"^norm_pre\."),
    Rule("attention pooling (global_pool='map')", TIMM_ROPE, keys=r"^attn_pool\."),
    Rule("a gate on the attention output", TIMM_ROPE, keys=r"^blocks\.\d+\.attn\.gate\."),
    *(Rule("a setting of timm's RoPE-ViT port", TIMM_ROPE, arg=name, value=value) for name, value in {
        "rope_grid_offset": 0, "rope_grid_indexing": "xy", "rope_rotate_half": False, "ref_feat_shape": None,
        "rope_mrope_section": None, "attn_type": "rope", "use_rot_pos_emb": True, "use_post_norm": False,
        "use_pre_transformer_norm": False, "qk_norm": False, "scale_attn_inner": False, "scale_mlp": False,
        "swiglu_mlp": False, "num_reg_tokens": 0, "num_kv_heads": None, "attn_only_layer_scale": False,
        "dynamic_img_pad": False, "class_token": True}.items()),
)


def refuse(sd: Mapping[str, Any], family: str, config: Mapping[str, Any] | None = None) -> None:
    """CheckpointError naming the first rule of `family` that `sd`'s keys (or timm's `config`) hit."""
    args = timm_hub.model_args(config)
    for rule in RULES:
        if family not in rule.families:
            continue
        if rule.keys is not None:
            hit = sorted(k for k in sd if re.search(rule.keys, k))
            if hit:
                raise CheckpointError(f"{family}: {hit[0]} is {rule.what}, which vitpe's ViT does not compute; "
                                      "importing it without would give different outputs, so it is refused")
        elif rule.arg in args and args[rule.arg] != rule.value and not (rule.value is False and args[rule.arg] is None):
            raise CheckpointError(f"{family}: timm's config.json sets {rule.arg}={args[rule.arg]!r} ({rule.what}: "
                                  f"{rule.value!r}), which vitpe does not compute; refused")
