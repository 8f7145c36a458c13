"""DINOv2 (arXiv 2304.07193) and DINOv2 with registers (arXiv 2309.16588) in Hugging Face's
layout -> a vitpe ViT with `ape`.

LayerScale (`layer_scale1.lambda1`), the plain or SwiGLU MLP (`use_swiglu_ffn`: transformers 5's
`gate_proj/up_proj/down_proj`, the hub's packed `weights_in/weights_out`), register tokens. The
classifier reads `[CLS, mean of the patches]` (`pool="token+avg"`); a backbone's output is the
CLS token after `layernorm` (its `pooler_output`).

* Registers sit between CLS and the patches and get no position: the table's CLS row is added
  to `cls_token` at import (as timm does for these models: the same sum the model forms at every
  forward) and the table keeps the patch rows (`no_embed_class`).
* The table is trained at the config's `image_size` (518 for the released models) and the model
  is used at the processor's crop (224), transformers resampling the table at every forward
  (bicubic; antialiased with registers, not without). The import resamples it once to the processor's
  crop size when `preprocessor_config.json` gives one, else keeps the config's size; `--img-size`
  chooses another.
"""
from __future__ import annotations

from typing import Any, Mapping

from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from ._hf import act, config_grid, resample_table, size_pair, target_grid
from .context import Context, Converted
from .keymap import Keys, qkv, strip_prefix

BLOCK = {"norm1": ("norm1",), "norm2": ("norm2",), "attn.proj": ("attention.o_proj", "attention.output.dense"),
         "mlp.fc1": ("mlp.fc1",), "mlp.fc2": ("mlp.fc2", "mlp.weights_out", "mlp.down_proj"),
         "mlp.fc1_g": ("mlp.gate_proj",), "mlp.fc1_x": ("mlp.up_proj",)}


def processor_size(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """The size the image processor hands the model (`crop_size` when it crops, else `size`)."""
    crop = config.get("crop_size")
    if not config.get("do_center_crop", True) or not crop:
        return None
    if isinstance(crop, dict):
        return (int(crop["height"]), int(crop["width"])) if {"height", "width"} <= set(crop) else None
    return size_pair(crop)


def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    config, img_size, heads, notes = ctx.config, ctx.img_size, ctx.heads, []
    sd, prefix = strip_prefix(sd, ("dinov2_with_registers.", "dinov2."))
    family = ctx.family
    keys = Keys(sd, family, prefix)
    proj = keys.take("patch_embed.proj.weight", "embeddings.patch_embeddings.projection.weight")
    keys.take("patch_embed.proj.bias", "embeddings.patch_embeddings.projection.bias")
    cls = keys.get("embeddings.cls_token")
    pos = keys.get("embeddings.position_embeddings")
    reg = keys.get("embeddings.register_tokens")
    if keys.drop(r"^embeddings\.mask_token$"):
        notes.append("Left out `mask_token` (used only for masked pre-training).")
    if proj is None or cls is None or pos is None:
        raise CheckpointError(f"{family}: the file lacks the patch embedding, class token or position table")
    patch, dim = proj.shape[-1], proj.shape[0]
    layers = keys.layers(r"encoder\.layer\.(\d+)\.")
    for i in layers:
        s = f"encoder.layer.{i}."
        qkv(keys, f"blocks.{i}.attn.qkv", *[(s + a, s + b) for a, b in (
            ("attention.q_proj", "attention.attention.query"), ("attention.k_proj", "attention.attention.key"),
            ("attention.v_proj", "attention.attention.value"))])
        for ours, theirs in BLOCK.items():
            for p in ("weight", "bias"):
                keys.take(f"blocks.{i}.{ours}.{p}", *(f"{s}{t}.{p}" for t in theirs))
        for p in ("weight", "bias"):   # the hub's packed SwiGLU input: gate rows, then up rows
            packed = keys.get(f"{s}mlp.weights_in.{p}")
            if packed is not None:
                keys.out[f"blocks.{i}.mlp.fc1_g.{p}"], keys.out[f"blocks.{i}.mlp.fc1_x.{p}"] = packed.chunk(2, 0)
        for n in (1, 2):
            keys.take(f"blocks.{i}.ls{n}.gamma", f"{s}layer_scale{n}.lambda1")
    for p in ("weight", "bias"):
        keys.take(f"norm.{p}", f"layernorm.{p}")
        keys.take(f"head.{p}", f"<head>.classifier.{p}")
    keys.refuse_rest()
    out = keys.out
    grid0 = config_grid(config, patch, pos.shape[1] - 1, family)
    size = img_size or processor_size(config)
    if img_size is None and size is not None and size != tuple(g * patch for g in grid0):
        notes.append(f"Imported at the processor's crop size {size[0]}x{size[1]} (the size transformers runs it at); "
                     "pass --img-size for another.")
    grid = target_grid(size, grid0, patch)
    R = 0 if reg is None else reg.shape[1]   # a registers model may have none (an empty tensor)
    if R:
        out["reg_token"] = reg
        out["cls_token"] = cls + pos[:, :1]
        pos = pos[:, 1:]
        notes.append("The table's CLS row is added to `cls_token` (registers get no position; the same sum "
                     "transformers forms at every forward, as timm imports these models).")
    else:
        out["cls_token"] = cls
    registers = config.get("model_type") == "dinov2_with_registers" or reg is not None   # its resampling antialiases
    out["pos_embed"] = resample_table(pos, grid, grid0, 0 if R else 1, notes, antialias=registers)
    gated = "blocks.0.mlp.fc1_g.weight" in out
    head = out.get("head.weight")
    if head is not None and head.shape[1] != 2 * dim:
        raise CheckpointError(f"{family}: classifier.weight {tuple(head.shape)} does not read [CLS, mean] (2 x {dim})")
    cfg = ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                    num_classes=0 if head is None else head.shape[0], dim=dim, depth=len(layers),
                    heads=heads or config.get("num_attention_heads") or max(1, dim // 64),
                    mlp_dim=out[f"blocks.0.mlp.{'fc1_g' if gated else 'fc1'}.weight"].shape[0],
                    qkv_bias="blocks.0.attn.qkv.bias" in out, norm_eps=config.get("layer_norm_eps", 1e-6),
                    encoding="ape", reg_tokens=R, no_embed_class=bool(R), layer_scale=True,
                    pool="token" if head is None else "token+avg", mlp="gated" if gated else "mlp",
                    act="silu" if gated else act(config, family))
    return out, cfg, notes
