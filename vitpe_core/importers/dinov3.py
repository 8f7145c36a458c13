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
from .keymap import PARAMS, TENSOR, Keys, check_rotary_heads, qkv, zero_bias

TOP = {"patch_embed.proj": "embeddings.patch_embeddings", "norm": "norm"}
TOP_TENSORS = {"cls_token": "embeddings.cls_token"}
LAYERS = ("model.layer.", "layer.")   # transformers 5's names, the hub's
BLOCK = {"norm1": "norm1", "norm2": "norm2", "attn.proj": "attention.o_proj"}
MLP = {"mlp.fc1": "mlp.up_proj", "mlp.fc2": "mlp.down_proj"}
GATED_MLP = {"mlp.fc1_g": "mlp.gate_proj", "mlp.fc1_x": "mlp.up_proj", "mlp.fc2": "mlp.down_proj"}
LAYER_SCALE = {"ls1.gamma": "layer_scale1.lambda1", "ls2.gamma": "layer_scale2.lambda1"}
ZERO_BIAS = {"attn.proj": "The attention output", "mlp.fc1": "The MLP", "mlp.fc1_g": "The MLP", "mlp.fc1_x": "The MLP",
             "mlp.fc2": "The MLP"}   # layers whose bias the config may leave out (a zero bias, said in a note)
DROP = {r"^embeddings\.mask_token$": "Left out `mask_token` (used only for masked pre-training).",
        r"rope_embeddings\.inv_freq$": None}   # derived from rope_theta


def half_to_adjacent(w: Tensor, heads: int) -> Tensor:
    """Rows of a q/k projection (or its bias), head by head, from "rotate half" channel order
    to adjacent pairs: within each head of `d` rows, `[0, d/2, 1, d/2 + 1, ...]`."""
    d = w.shape[0] // heads
    perm = torch.stack((torch.arange(d // 2), torch.arange(d // 2) + d // 2), dim=1).flatten()   # (d,)
    idx = (torch.arange(heads)[:, None] * d + perm[None]).flatten()                              # (h d,)
    return w[idx]


def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    """Map the embeddings, check the heads, map each block, configure at the config's (or the given) size."""
    notes: list[str] = []
    keys = Keys(sd, ctx.family)
    proj = _map_top(keys, notes)
    patch, dim = proj.shape[-1], proj.shape[0]
    heads = ctx.heads or ctx.config.get("num_attention_heads") or max(1, dim // 64)
    check_rotary_heads(ctx.family, dim, heads)
    layers = keys.layers(r"(?:model\.)?layer\.(\d+)\.")
    for i in layers:
        _map_block(keys, i, heads, notes)
    keys.refuse_rest()
    zero_bias(keys, "patch_embed.proj", notes, "The patch embedding")
    notes.append("Query and key channels reordered from DINOv3's (k, k + d/2) rotation pairs to adjacent pairs: "
                 "the attention is the same.")
    size = size_pair(ctx.config.get("image_size")) or (224, 224)
    grid = target_grid(ctx.img_size, (size[0] // patch, size[1] // patch), patch)
    return keys.out, _config(keys.out, ctx, grid, len(layers), heads), notes


def _map_top(keys: Keys, notes: list[str]) -> Tensor:
    """The embeddings and the final norm; returns the patch embedding's weight."""
    keys.map(TOP)
    keys.map(TOP_TENSORS, params=TENSOR)
    reg = keys.get("embeddings.register_tokens")
    if reg is not None and reg.shape[1]:
        keys.out["reg_token"] = reg
    keys.drop_all(DROP, notes)
    if "patch_embed.proj.weight" not in keys.out or "cls_token" not in keys.out:
        raise CheckpointError(f"{keys.family}: the file lacks the patch embedding or the class token")
    return keys.out["patch_embed.proj.weight"]


def _map_block(keys: Keys, i: int, heads: int, notes: list[str]) -> None:
    """Block `i` by the tables above, query and key rows in vitpe's rotation order, a zero bias
    for each the config leaves out."""
    src, dst = tuple(f"{a}{i}." for a in LAYERS), f"blocks.{i}."
    qkv(keys, f"{dst}attn.qkv", *[tuple(a + f"attention.{n}_proj" for a in src) for n in "qkv"])
    keys.map(BLOCK, src=src, dst=dst)
    gated = any(a + "mlp.gate_proj.weight" in keys.sd for a in src)
    keys.map(GATED_MLP if gated else MLP, src=src, dst=dst)
    keys.map(LAYER_SCALE, src=src, dst=dst, params=TENSOR)
    zero_bias(keys, f"{dst}attn.qkv", notes, "")
    for p in PARAMS:
        _rotate_pairs(keys.out, f"{dst}attn.qkv.{p}", heads)
    for name, what in ZERO_BIAS.items():
        zero_bias(keys, dst + name, notes, what)


def _rotate_pairs(out: dict[str, Tensor], name: str, heads: int) -> None:
    """`out[name]` (packed query/key/value rows) with its query and key rows `half_to_adjacent`."""
    q, k, v = out[name].chunk(3, 0)
    out[name] = torch.cat((half_to_adjacent(q, heads), half_to_adjacent(k, heads), v), 0)


def _config(out: Mapping[str, Tensor], ctx: Context, grid: tuple[int, int], depth: int, heads: int) -> ViTConfig:
    """The `ViTConfig` of the mapped weights `out`."""
    proj = out["patch_embed.proj.weight"]
    patch = proj.shape[-1]
    gated = "blocks.0.mlp.fc1_g.weight" in out
    reg = out.get("reg_token")
    return ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                     num_classes=0, dim=proj.shape[0], depth=depth, heads=heads,
                     mlp_dim=out[f"blocks.0.mlp.{'fc1_g' if gated else 'fc1'}.weight"].shape[0],
                     norm_eps=ctx.config.get("layer_norm_eps", 1e-5), encoding="rope_dinov3",
                     encoding_options={"theta": float(ctx.config.get("rope_theta", 100.0))},
                     reg_tokens=0 if reg is None else reg.shape[1], layer_scale=True, pool="token",
                     mlp="gated" if gated else "mlp", act=act(ctx.config, ctx.family))
