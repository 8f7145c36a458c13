"""timm's `VisionTransformer` with the layers of CLIP and SigLIP (`vit_*clip*`, `vit_*siglip*`)
and with gated MLPs (`vit_giant_patch14_dinov2`): what they add to the plain timm path (timm.py).

* CLIP-style (`pre_norm=True`): `norm_pre` -> `pre_norm`; the patch embedding has no bias (zero);
  LayerNorm eps 1e-5 (every timm CLIP architecture builds `nn.LayerNorm`). Family `timm-clip`.
* SigLIP-style (`global_pool='map'`): `attn_pool` (timm's `AttentionPoolLatent`: `latent`, `q`,
  `kv`, `proj`, `norm`, `mlp`) has vitpe's names already -> `pool="map"`. Family `timm-siglip`.
* Gated MLPs: timm's `SwiGLU` (`mlp.fc1_g`, `mlp.fc1_x`) has vitpe's names; `SwiGLUPacked`
  (`mlp.fc1` of twice the hidden width; the first half gates, `gate_last=False`) is split.

None of these record their activation: quick-GELU, GELU, GELU (tanh) and SiLU give the same keys.
It comes from `--act`, timm's `config.json` beside the file (timm_hub.py) or is refused, naming
the layer that made it necessary. Refused too: q/k norms in the pooling head, its own position
table, and more than one latent query.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from ..checkpoint import CheckpointError
from . import timm_hub
from .keymap import is_packed_glu, split_packed_glu

POOLS = {"token": "token", "avg": "avg", "map": "map"}   # timm global_pool -> ViTConfig.pool
# timm 1.0.31 architectures of its Eva class (models/eva.py) that share timm ViT key names
EVA_ARCHS = r"^eva02_|^eva_giant|_rope_|_rope$|^vit_pe_|_dinov3(_|$)|_lingbot$|_sapiens2$"


def vit_layers(sd: dict[str, torch.Tensor], config: Mapping[str, Any] | None, *, act: str | None,
               pool: str | None, notes: list[str]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(ViTConfig fields, `sd` with packed gated MLPs split) of a timm-named ViT (`detect.narrow` names
    its family by the same layers: timm-clip with `norm_pre`, timm-siglip with `attn_pool`)."""
    arch = timm_hub.architecture(config)
    if re.search(EVA_ARCHS, arch):
        raise CheckpointError(f"timm's config.json names architecture {arch!r}: timm's Eva class, whose rotary "
                              "embedding (or post-norm) is not in the keys of this timm-ViT-named file; refused "
                              "(EVA-02 tiny / small, timm's DINOv3 and its RoPE-ViT port `vit_*_patch16_rope_*` are "
                              "imported as their own families, detected from the config.json)")
    norm_pre = "norm_pre.weight" in sd
    attn_pool = sorted(k for k in sd if k.startswith("attn_pool."))
    gated = sorted(k for k in sd if re.match(r"blocks\.\d+\.mlp\.fc1_[gx]\.", k))
    packed = not gated and is_packed_glu(sd)
    decided = ("a pre-norm before the blocks (CLIP-style: `norm_pre.weight`)" if norm_pre else
               f"attention pooling (global_pool='map': `{attn_pool[0]}`)" if attn_pool else
               f"a gated MLP (SwiGLU: `{gated[0]}`)" if gated else
               "a packed gated MLP (SwiGLU: `blocks.0.mlp.fc1.weight` holds twice the hidden width)" if packed else "")
    act = timm_hub.resolve_act(config, act, needed=bool(decided), what=f"this timm ViT has {decided}", notes=notes)
    extra: dict[str, Any] = {}
    if act is not None:
        extra["act"] = act
    if norm_pre:
        extra.update(pre_norm=True, norm_eps=1e-5)
    pool = _pool(sd, config, pool, bool(attn_pool))
    if pool is not None:
        extra["pool"] = pool
    if gated or packed:
        extra["mlp"] = "gated"
    if packed:
        sd = _split_packed(sd)
        notes.append("The packed gated MLP (`mlp.fc1`) is split into gate and value halves (`fc1_g`, `fc1_x`), "
                     "as timm's SwiGLUPacked reads it.")
    return extra, sd


def _pool(sd: Mapping[str, torch.Tensor], config: Mapping[str, Any] | None, pool: str | None, attn_pool: bool
          ) -> str | None:
    """The read-out the layers (attention pooling) or timm's config.json (`global_pool`) decide,
    where the caller's `pool` does not; None: the keys' default (timm.py)."""
    if attn_pool:
        _check_pool_head(sd)
        if pool not in (None, "map"):
            raise CheckpointError(f"--pool {pool}: this model reads out by attention pooling (`attn_pool.*`)")
        return "map"
    if pool is None and config:
        given = timm_hub.arg(config, "global_pool")
        if isinstance(given, str) and given:
            if given not in POOLS:
                raise CheckpointError(f"timm's config.json says global_pool {given!r}; vitpe reads out by "
                                      f"{sorted(POOLS)} only")
            return POOLS[given]
    return None


def _check_pool_head(sd: Mapping[str, torch.Tensor]) -> None:
    """Its query / key norms and position table are refused by refuse.py."""
    latent = sd.get("attn_pool.latent")
    if latent is None or latent.ndim != 3 or latent.shape[1] != 1 or "attn_pool.q.weight" not in sd:
        shape = None if latent is None else tuple(latent.shape)
        raise CheckpointError(f"this attention-pooling head (attn_pool.latent {shape}) is not one learned query "
                              "with a query projection (`attn_pool.q`), the only one vitpe's `attn_pool` computes")


def _split_packed(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        m = re.match(r"(blocks\.\d+\.mlp\.)fc1\.(weight|bias)$", k)
        if m:
            split_packed_glu(out, v, m.group(1), m.group(2))
        else:
            out[k] = v
    return out
