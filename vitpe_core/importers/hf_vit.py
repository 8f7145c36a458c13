"""Hugging Face `ViTModel` / `ViTForImageClassification` keys (transformers 4 names, as files on
the hub carry them, and transformers 5's) -> timm's keys, then timm.py's converter."""
from __future__ import annotations

import re
import dataclasses
from typing import Any, Mapping

import torch

from ..checkpoint import CheckpointError
from . import timm
from ._hf import size_pair
from .context import Context, Converted

HF4_LAYER = {"q": "attention.attention.query", "k": "attention.attention.key", "v": "attention.attention.value",
             "o": "attention.output.dense", "norm1": "layernorm_before", "norm2": "layernorm_after",
             "fc1": "intermediate.dense", "fc2": "output.dense"}
HF5_LAYER = {"q": "attention.q_proj", "k": "attention.k_proj", "v": "attention.v_proj", "o": "attention.o_proj",
             "norm1": "layernorm_before", "norm2": "layernorm_after", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}


def convert(sd: Mapping[str, torch.Tensor], ctx: Context) -> Converted:
    """The weights renamed to timm's (`from_hf`) and converted as timm's, with the config's heads
    and the size its table was trained at."""
    notes: list[str] = []
    sd, hf = from_hf(dict(sd), ctx.config, notes)
    ctx = dataclasses.replace(ctx, heads=ctx.heads or hf["heads"], img_size=ctx.img_size or size_pair(hf["image_size"]))
    weights, cfg, more = timm.convert(sd, ctx)
    return weights, cfg, notes + more


def from_hf(sd: dict[str, torch.Tensor], config: Mapping[str, Any], notes: list[str]
             ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Hugging Face `ViTModel` / `ViTForImageClassification` keys -> timm keys."""
    if config.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"hidden_act {config['hidden_act']!r}: only 'gelu' (exact) is supported")
    pre = "vit." if any(k.startswith("vit.") for k in sd) else ""
    out, used = {}, set()

    def take(src: str, dst: str) -> None:
        if src in sd:
            out[dst] = sd[src]
            used.add(src)

    take(f"{pre}embeddings.cls_token", "cls_token")
    take(f"{pre}embeddings.position_embeddings", "pos_embed")
    take(f"{pre}embeddings.mask_token", "mask_token")
    for p in ("weight", "bias"):
        take(f"{pre}embeddings.patch_embeddings.projection.{p}", f"patch_embed.proj.{p}")
        take(f"{pre}layernorm.{p}", f"norm.{p}")
        take(f"classifier.{p}", f"head.{p}")
    # Files on the hub (transformers 4) name layers `encoder.layer.N.*`; transformers 5 `layers.N.*`.
    layer_re = rf"{re.escape(pre)}(?:encoder\.layer|layers)\.(\d+)\."
    layers = sorted({int(m.group(1)) for k in sd if (m := re.match(layer_re, k))})
    for i in layers:
        for src, names in ((f"{pre}encoder.layer.{i}.", HF4_LAYER), (f"{pre}layers.{i}.", HF5_LAYER)):
            for p in ("weight", "bias"):
                qkv = [sd.get(f"{src}{names[n]}.{p}") for n in ("q", "k", "v")]
                if all(t is not None for t in qkv):
                    out[f"blocks.{i}.attn.qkv.{p}"] = torch.cat(qkv, 0)
                    used.update(f"{src}{names[n]}.{p}" for n in ("q", "k", "v"))
                for ours, theirs in (("attn.proj", "o"), ("norm1", "norm1"), ("norm2", "norm2"),
                                     ("mlp.fc1", "fc1"), ("mlp.fc2", "fc2")):
                    take(f"{src}{names[theirs]}.{p}", f"blocks.{i}.{ours}.{p}")
    pooler = [k for k in sd if k.startswith(f"{pre}pooler.")]
    if pooler:
        used |= set(pooler)
        notes.append("Left out the Hugging Face pooler (dense + tanh), which ViTForImageClassification does not use.")
    rest = sorted(set(sd) - used)
    if rest:
        raise CheckpointError(f"Hugging Face ViT keys vitpe cannot place: {rest[:6]}")
    return out, {"heads": config.get("num_attention_heads"), "image_size": config.get("image_size")}
