"""BEiT (arXiv 2106.08254) and data2vec-vision (arXiv 2202.03555) in Hugging Face's layout ->
a vitpe ViT with `rpb_cls` (+ `ape` where the model also has a table).

Both layouts: transformers 5's `save_pretrained` (`beit.layers.N.attention.q_proj`,
`relative_position_bias.relative_position_bias_table`, `shared_position_bias`) and the one the
hub's files and data2vec-vision carry (`encoder.layer.N.attention.attention.query`,
`encoder.relative_position_bias`). Per-layer tables (`use_relative_position_bias`) or one
shared table; the three CLS rows of the table become `rpb_cls`'s `cls_bias`; the key
projection has no bias (zero); LayerScale `lambda_1/2`; the read-out is the mean of the patches
with `pooler.layernorm` (`use_mean_pooling`) or the CLS token after `layernorm`.

Deviation: at a grid other than the config's, transformers reshapes a non-square offset table
with its sides swapped before resizing; vitpe resizes it as (2H-1, 2W-1). Square grids (every
released BEiT) agree.
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from ._hf import act, config_grid, resample_table, target_grid
from .context import Context, Converted
from .keymap import Keys, qkv, strip_prefix, zero_bias

BLOCK = {  # vitpe name: (transformers 5, hub / data2vec-vision)
    "norm1": ("layernorm_before",), "norm2": ("layernorm_after",),
    "attn.proj": ("attention.o_proj", "attention.output.dense"),
    "mlp.fc1": ("mlp.fc1", "intermediate.dense"), "mlp.fc2": ("mlp.fc2", "output.dense"),
}


def _table(t: Tensor, grid: tuple[int, int], family: str, key: str) -> tuple[Tensor, Tensor]:
    """`((2H-1)(2W-1) + 3, h)` -> offset table `(h, 2H-1, 2W-1)` and `cls_bias (h, 3)`."""
    H, W = grid
    if t.ndim != 2 or t.shape[0] != (2 * H - 1) * (2 * W - 1) + 3:
        raise CheckpointError(f"{family}: {key} has shape {tuple(t.shape)}, not ((2H-1)(2W-1)+3, heads) for the "
                              f"{H}x{W} grid of the config")
    return t[:-3].T.reshape(-1, 2 * H - 1, 2 * W - 1), t[-3:].T



def one_table_scheme(tables: list, shared: Tensor | None, n_layers: int, grid: tuple[int, int], family: str,
                     shared_key: str, unit: str) -> list:
    """The `_table`s of every layer, or the one shared table (`shared`, its name in the file
    `shared_key`): never both, and per-layer tables in every layer (`unit`: "layers" / "blocks")."""
    if tables and shared is not None:
        raise CheckpointError(f"{family}: both per-layer and shared relative position bias tables; vitpe's `rpb_cls` "
                              "holds one or the other")
    if shared is not None:
        return [_table(shared, grid, family, shared_key)]
    if tables and len(tables) != n_layers:
        raise CheckpointError(f"{family}: {len(tables)} of {n_layers} {unit} have a relative position bias table")
    return tables

def _table_patches(t: Tensor | None) -> int | None:
    """The patch count of the square grid a `((2s-1)² + 3, h)` table covers (None: no table or no square)."""
    if t is None:
        return None
    side = (round((t.shape[0] - 3) ** 0.5) + 1) // 2
    return side * side if (2 * side - 1) ** 2 + 3 == t.shape[0] else None


def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    config, img_size, heads, notes = ctx.config, ctx.img_size, ctx.heads, []
    sd, prefix = strip_prefix(sd, ("beit.", "data2vec_vision."))
    family = ctx.family   # beit or data2vec-vision (detect.narrow): one layout
    keys = Keys(sd, family, prefix)
    proj = keys.take("patch_embed.proj.weight", "embeddings.patch_embeddings.projection.weight")
    keys.take("patch_embed.proj.bias", "embeddings.patch_embeddings.projection.bias")
    keys.take("cls_token", "embeddings.cls_token")
    pos = keys.get("embeddings.position_embeddings")
    if keys.drop(r"^embeddings\.mask_token$"):
        notes.append("Left out `mask_token` (used only for masked pre-training).")
    keys.drop(r"relative_position_index$")   # derived buffers of older files
    if proj is None or "cls_token" not in keys.out:
        raise CheckpointError(f"{family}: no patch embedding or class token in the file")
    patch, dim = proj.shape[-1], proj.shape[0]
    layers = keys.layers(r"(?:layers|encoder\.layer)\.(\d+)\.")
    shared = keys.get("shared_position_bias.relative_position_bias_table",
                      "encoder.relative_position_bias.relative_position_bias_table")
    first = shared if shared is not None else next((v for k, v in keys.sd.items()
                                                    if k.endswith("relative_position_bias_table")), None)
    grid0 = config_grid(config, patch, pos.shape[1] - 1 if pos is not None else _table_patches(first), family)
    grid = target_grid(img_size, grid0, patch)
    tables = []
    for i in layers:
        s = (f"layers.{i}.", f"encoder.layer.{i}.")
        q = tuple(p + n for p in s for n in ("attention.q_proj", "attention.attention.query"))
        k = tuple(p + n for p in s for n in ("attention.k_proj", "attention.attention.key"))
        v = tuple(p + n for p in s for n in ("attention.v_proj", "attention.attention.value"))
        qkv(keys, f"blocks.{i}.attn.qkv", q, k, v)
        for ours, theirs in BLOCK.items():
            for p in ("weight", "bias"):
                keys.take(f"blocks.{i}.{ours}.{p}", *(f"{a}{t}.{p}" for a in s for t in theirs))
        for n in (1, 2):
            keys.take(f"blocks.{i}.ls{n}.gamma", *(f"{a}lambda_{n}" for a in s))
        t = keys.get(*(f"{a}{r}relative_position_bias.relative_position_bias_table" for a in s
                       for r in ("", "attention.attention.")))
        if t is not None:
            tables.append(_table(t, grid0, family, f"layer {i}'s relative_position_bias_table"))
    tables = one_table_scheme(tables, shared, len(layers), grid0, family, "the shared relative_position_bias_table",
                              "layers")
    for p in ("weight", "bias"):
        keys.take(f"norm.{p}", f"layernorm.{p}")
        keys.take(f"fc_norm.{p}", f"pooler.layernorm.{p}")
        keys.take(f"head.{p}", f"<head>.classifier.{p}")
    if keys.drop(r"^<head>\.(lm_head|layernorm)\."):
        notes.append("Left out the masked-image-modeling head (`lm_head`, its layernorm): imported as a backbone.")
    keys.refuse_rest()
    out = keys.out
    for i in layers:
        zero_bias(keys, f"blocks.{i}.attn.qkv", notes, "")
    encoding = []
    if tables:
        encoding.append("rpb_cls")
        rel = torch.stack([t for t, _ in tables])                       # (L|1, h, 2H-1, 2W-1)
        if grid != grid0:   # as the encoding does at another grid: bilinear, CLS entries kept
            rel = F.interpolate(rel.float(), size=(2 * grid[0] - 1, 2 * grid[1] - 1), mode="bilinear",
                                align_corners=False).to(rel.dtype)
            notes.append(f"The relative position tables were trained on a {grid0[0]}x{grid0[1]} grid; resized to "
                         f"{grid[0]}x{grid[1]} (bilinear, as transformers' interpolate_pos_encoding).")
        out["pos_enc.rel_tables"] = rel
        out["pos_enc.cls_bias"] = torch.stack([c for _, c in tables])  # (L|1, h, 3)
    if pos is not None:
        encoding.append("ape")
        out["pos_embed"] = resample_table(pos, grid, grid0, 1, notes, antialias=False)
    if not encoding:
        notes.append("No position table and no relative position bias: imported as `none`.")
    mean = bool(config.get("use_mean_pooling", "fc_norm.weight" in out))
    if mean and "fc_norm.weight" not in out:
        notes.append("Read-out: the mean of the patch tokens without a norm (the file has no pooler layernorm).")
    n_heads = heads or config.get("num_attention_heads") or (tables[0][0].shape[0] if tables else max(1, dim // 64))
    cfg = ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                    num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0, dim=dim,
                    depth=len(layers), heads=n_heads, mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0],
                    norm_eps=config.get("layer_norm_eps", 1e-12), encoding="+".join(encoding) or "none",
                    encoding_options={"shared": True} if shared is not None else {},
                    layer_scale="blocks.0.ls1.gamma" in out, pool="avg" if mean else "token",
                    fc_norm="fc_norm.weight" in out, final_norm="norm.weight" in out,
                    act=act(config, family))
    return out, cfg, notes
