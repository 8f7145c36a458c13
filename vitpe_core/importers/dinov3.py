"""DINOv3 (arXiv 2508.10104) in Hugging Face's layout (`DINOv3ViTModel`) -> a vitpe ViT with
`rope_dinov3`.

Register tokens, LayerScale, a plain (`up_proj`/`down_proj`) or gated (`gate_proj`, SwiGLU with
`hidden_act="silu"`) MLP; query/key/value/output/MLP biases as the config has them (a missing
one is zero); no position table. The output is the CLS token after `norm` (`pooler_output`).

* DINOv3 rotates the channel pairs `(k, k + d/2)` of each head ("rotate half"); vitpe rotates
  adjacent pairs `(2k, 2k+1)`. The import reorders each head's query and key output channels
  (rows of the projection and its bias) to `[0, d/2, 1, d/2+1, ...]`: the rotated pairs are the
  same numbers, so `q·k`, the attention and the outputs are unchanged.
* The file's `layer.N.` (hub) and transformers 5's `model.layer.N.` names are both read.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from ._hf import act, size_pair, target_grid
from .context import Context, Converted
from .keymap import Keys, qkv, zero_bias

BLOCK = {"norm1": "norm1", "norm2": "norm2", "attn.proj": "attention.o_proj"}


def half_to_adjacent(w: Tensor, heads: int) -> Tensor:
    """Rows of a q/k projection (or its bias), head by head, from "rotate half" channel order
    to adjacent pairs: within each head of `d` rows, `[0, d/2, 1, d/2 + 1, ...]`."""
    d = w.shape[0] // heads
    perm = torch.stack((torch.arange(d // 2), torch.arange(d // 2) + d // 2), dim=1).flatten()   # (d,)
    idx = (torch.arange(heads)[:, None] * d + perm[None]).flatten()                              # (h d,)
    return w[idx]


def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    config, img_size, heads, notes = ctx.config, ctx.img_size, ctx.heads, []
    family = ctx.family
    keys = Keys(sd, family)
    proj = keys.take("patch_embed.proj.weight", "embeddings.patch_embeddings.weight")
    keys.take("patch_embed.proj.bias", "embeddings.patch_embeddings.bias")
    keys.take("cls_token", "embeddings.cls_token")
    reg = keys.get("embeddings.register_tokens")
    if reg is not None and reg.shape[1]:
        keys.out["reg_token"] = reg
    if keys.drop(r"^embeddings\.mask_token$"):
        notes.append("Left out `mask_token` (used only for masked pre-training).")
    keys.drop(r"rope_embeddings\.inv_freq$")   # derived from rope_theta
    if proj is None or "cls_token" not in keys.out:
        raise CheckpointError(f"{family}: the file lacks the patch embedding or the class token")
    patch, dim = proj.shape[-1], proj.shape[0]
    n_heads = heads or config.get("num_attention_heads") or max(1, dim // 64)
    if dim % n_heads or (dim // n_heads) % 4:
        raise CheckpointError(f"{family}: width {dim} and {n_heads} heads do not give a head dim divisible by 4")
    layers = keys.layers(r"(?:model\.)?layer\.(\d+)\.")
    for i in layers:
        s = (f"model.layer.{i}.", f"layer.{i}.")
        qkv(keys, f"blocks.{i}.attn.qkv", *[tuple(a + f"attention.{n}_proj" for a in s) for n in "qkv"])
        for ours, theirs in BLOCK.items():
            for p in ("weight", "bias"):
                keys.take(f"blocks.{i}.{ours}.{p}", *(a + f"{theirs}.{p}" for a in s))
        gate = any(a + "mlp.gate_proj.weight" in keys.sd for a in s)
        for ours, theirs in (("fc1_g" if gate else "fc1", "gate_proj" if gate else "up_proj"),
                             ("fc1_x", "up_proj" if gate else None), ("fc2", "down_proj")):
            for p in ("weight", "bias"):
                if theirs:
                    keys.take(f"blocks.{i}.mlp.{ours}.{p}", *(a + f"mlp.{theirs}.{p}" for a in s))
        for n in (1, 2):
            keys.take(f"blocks.{i}.ls{n}.gamma", *(a + f"layer_scale{n}.lambda1" for a in s))
        w = keys.out[f"blocks.{i}.attn.qkv.weight"]
        q, k, v = w.chunk(3, 0)
        keys.out[f"blocks.{i}.attn.qkv.weight"] = torch.cat((half_to_adjacent(q, n_heads),
                                                              half_to_adjacent(k, n_heads), v), 0)
        zero_bias(keys, f"blocks.{i}.attn.qkv", notes, "")
        b = keys.out[f"blocks.{i}.attn.qkv.bias"]
        q, k, v = b.chunk(3, 0)
        keys.out[f"blocks.{i}.attn.qkv.bias"] = torch.cat((half_to_adjacent(q, n_heads),
                                                            half_to_adjacent(k, n_heads), v), 0)
        for name, what in (("attn.proj", "The attention output"), ("mlp.fc1", "The MLP"), ("mlp.fc1_g", "The MLP"),
                           ("mlp.fc1_x", "The MLP"), ("mlp.fc2", "The MLP")):
            zero_bias(keys, f"blocks.{i}.{name}", notes, what)
    for p in ("weight", "bias"):
        keys.take(f"norm.{p}", f"norm.{p}")
    keys.refuse_rest()
    out = keys.out
    zero_bias(keys, "patch_embed.proj", notes, "The patch embedding")
    notes.append("Query and key channels reordered from DINOv3's (k, k + d/2) rotation pairs to adjacent pairs: "
                 "the attention is the same.")
    size = size_pair(config.get("image_size")) or (224, 224)
    grid = target_grid(img_size, (size[0] // patch, size[1] // patch), patch)
    gated = "blocks.0.mlp.fc1_g.weight" in out
    cfg = ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                    num_classes=0, dim=dim, depth=len(layers), heads=n_heads,
                    mlp_dim=out[f"blocks.0.mlp.{'fc1_g' if gated else 'fc1'}.weight"].shape[0],
                    norm_eps=config.get("layer_norm_eps", 1e-5), encoding="rope_dinov3",
                    encoding_options={"theta": float(config.get("rope_theta", 100.0))},
                    reg_tokens=0 if reg is None else reg.shape[1], layer_scale=True, pool="token",
                    mlp="gated" if gated else "mlp", act=act(config, family))
    return out, cfg, notes
