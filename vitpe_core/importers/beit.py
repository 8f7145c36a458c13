"""BEiT (arXiv 2106.08254) and data2vec-vision (arXiv 2202.03555) in Hugging Face's layout ->
a vitpe ViT with `rpb_cls` (+ `ape` where the model also has a table).

Both layouts: transformers 5's `save_pretrained` (`beit.layers.N.attention.q_proj`,
`relative_position_bias.relative_position_bias_table`, `shared_position_bias`) and the one the
hub's files and data2vec-vision carry (`encoder.layer.N.attention.attention.query`,
`encoder.relative_position_bias`). Per-layer tables (`use_relative_position_bias`) or one
shared table; the three CLS rows of the table become `rpb_cls`'s `cls_bias`; the key
projection has no bias (zero); LayerScale `lambda_1/2`; the read-out is the mean of the patches
with `pooler.layernorm` (`use_mean_pooling`) or the CLS token after `layernorm`.

An input of another size is computed as transformers' `interpolate_pos_encoding=True` does: the
offset tables resized bilinearly, `ape` bicubic without antialiasing (`ape_antialias=False`).

Deviation: at a grid other than the config's, transformers reshapes a non-square offset table
with its sides swapped before resizing; vitpe resizes it as (2H-1, 2W-1). Square grids (every
released BEiT) agree.
"""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from ..encodings.rpb import resize_rel_table
from ._hf import act, ape_options, config_grid, note_resampled_once, resample_table, target_grid
from .context import Context, Converted
from .keymap import TENSOR, Keys, qkv, strip_prefix, zero_bias

# vitpe name: transformers' (a tuple: transformers 5's, then the hub's / data2vec-vision's)
TOP = {"patch_embed.proj": "embeddings.patch_embeddings.projection", "norm": "layernorm",
       "fc_norm": "pooler.layernorm", "head": "<head>.classifier"}
TOP_TENSORS = {"cls_token": "embeddings.cls_token"}
BLOCK = {"norm1": "layernorm_before", "norm2": "layernorm_after",
         "attn.proj": ("attention.o_proj", "attention.output.dense"),
         "mlp.fc1": ("mlp.fc1", "intermediate.dense"), "mlp.fc2": ("mlp.fc2", "output.dense")}
BLOCK_TENSORS = {"ls1.gamma": "lambda_1", "ls2.gamma": "lambda_2"}
QKV = (("attention.q_proj", "attention.attention.query"), ("attention.k_proj", "attention.attention.key"),
       ("attention.v_proj", "attention.attention.value"))
LAYER = r"(?:layers|encoder\.layer)\.(\d+)\."
LAYER_TABLE = ("relative_position_bias.relative_position_bias_table",
               "attention.attention.relative_position_bias.relative_position_bias_table")
SHARED_TABLE = ("shared_position_bias.relative_position_bias_table",
                "encoder.relative_position_bias.relative_position_bias_table")
DROP = {r"^embeddings\.mask_token$": "Left out `mask_token` (used only for masked pre-training).",
        r"relative_position_index$": None,   # derived buffers of older files
        r"^<head>\.(lm_head|layernorm)\.": "Left out the masked-image-modeling head (`lm_head`, its layernorm): "
                                           "imported as a backbone."}


# ----------------------------------------------------------------------------- tables (timm_beit.py's too)
def split_table(t: Tensor, trained: tuple[int, int], family: str, key: str) -> tuple[Tensor, Tensor]:
    """`((2H-1)(2W-1) + 3, h)` -> offset table `(h, 2H-1, 2W-1)` and `cls_bias (h, 3)`."""
    H, W = trained
    if t.ndim != 2 or t.shape[0] != (2 * H - 1) * (2 * W - 1) + 3:
        raise CheckpointError(f"{family}: {key} has shape {tuple(t.shape)}, not ((2H-1)(2W-1)+3, heads) for the "
                              f"{H}x{W} grid of the config")
    return t[:-3].T.reshape(-1, 2 * H - 1, 2 * W - 1), t[-3:].T


def per_layer_or_shared(tables: list, shared: Tensor | None, n_layers: int, trained: tuple[int, int], family: str,
                        shared_key: str, unit: str) -> list:
    """The `split_table`s of every layer, or the one shared table (`shared`, its name in the file
    `shared_key`): never both, and per-layer tables in every layer (`unit`: "layers" / "blocks")."""
    if tables and shared is not None:
        raise CheckpointError(f"{family}: both per-layer and shared relative position bias tables; vitpe's `rpb_cls` "
                              "holds one or the other")
    if shared is not None:
        return [split_table(shared, trained, family, shared_key)]
    if tables and len(tables) != n_layers:
        raise CheckpointError(f"{family}: {len(tables)} of {n_layers} {unit} have a relative position bias table")
    return tables


def table_patches(t: Tensor | None) -> int | None:
    """The patch count of the square grid a `((2s-1)² + 3, h)` table covers (None: no table or no square)."""
    if t is None:
        return None
    side = (round((t.shape[0] - 3) ** 0.5) + 1) // 2
    return side * side if (2 * side - 1) ** 2 + 3 == t.shape[0] else None


def place_rel_tables(out: dict[str, Tensor], tables: list[tuple[Tensor, Tensor]], grid: tuple[int, int],
                     trained: tuple[int, int], notes: list[str], how: str) -> None:
    """`pos_enc.rel_tables (L|1, h, 2H-1, 2W-1)` and `pos_enc.cls_bias (L|1, h, 3)` of the split
    tables; at a grid other than `trained` the offset tables resized bilinearly (the `rpb_cls`
    encoding's rule; the CLS entries kept), noted with `how` after the sizes."""
    rel = torch.stack([t for t, _ in tables])
    if grid != trained:
        # a table a call, as the encoding resizes them (a (1, L·h) batch rounds otherwise in the last bit)
        rel = torch.stack([resize_rel_table(t, grid, mode="bilinear") for t in rel]).to(rel.dtype)
        notes.append(f"The relative position tables were trained on a {trained[0]}x{trained[1]} grid; resized to "
                     f"{grid[0]}x{grid[1]}{how}")
    out["pos_enc.rel_tables"] = rel
    out["pos_enc.cls_bias"] = torch.stack([c for _, c in tables])


def encoding_name(out: Mapping[str, Tensor], notes: list[str]) -> str:
    """`rpb_cls` where the tables are placed, `ape` where `pos_embed` is, `none` (noted) without either."""
    encoding = (["rpb_cls"] if "pos_enc.rel_tables" in out else []) + (["ape"] if "pos_embed" in out else [])
    if not encoding:
        notes.append("No position table and no relative position bias: imported as `none`.")
    return "+".join(encoding) or "none"


def table_heads(tables: list[tuple[Tensor, Tensor]], dim: int) -> int:
    """The heads the tables have, else `dim // 64`."""
    return tables[0][0].shape[0] if tables else max(1, dim // 64)


# ----------------------------------------------------------------------------- the converter
def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    notes: list[str] = []
    keys, pos = _map_top(sd, ctx.family, notes)   # beit or data2vec-vision (detect.narrow): one layout
    shared = keys.get(*SHARED_TABLE)
    trained, grid = _grids(keys, pos, shared, ctx)
    layers = keys.layers(LAYER)
    tables = [t for i in layers if (t := _map_block(keys, i, trained)) is not None]
    tables = per_layer_or_shared(tables, shared, len(layers), trained, ctx.family,
                                 "the shared relative_position_bias_table", "layers")
    keys.refuse_rest()
    for i in layers:
        zero_bias(keys, f"blocks.{i}.attn.qkv", notes, "")
    encoding = _place_encodings(keys.out, tables, pos, grid, trained, notes)
    return keys.out, _config(keys.out, ctx, tables, grid, len(layers), encoding, shared is not None, notes), notes


def _map_top(sd: Mapping[str, Tensor], family: str, notes: list[str]) -> tuple[Keys, Tensor | None]:
    """The keys outside the blocks by TOP and DROP; the position table (None: the model has none)."""
    stripped, prefix = strip_prefix(sd, ("beit.", "data2vec_vision."))
    keys = Keys(stripped, family, prefix)
    keys.map(TOP)
    keys.map(TOP_TENSORS, params=TENSOR)
    keys.drop_all(DROP, notes)
    if "patch_embed.proj.weight" not in keys.out or "cls_token" not in keys.out:
        raise CheckpointError(f"{family}: no patch embedding or class token in the file")
    return keys, keys.get("embeddings.position_embeddings")


def _grids(keys: Keys, pos: Tensor | None, shared: Tensor | None, ctx: Context
           ) -> tuple[tuple[int, int], tuple[int, int]]:
    """The grid the tables were trained on (the config's, else the tables' square) and the one to build for."""
    patch = keys.out["patch_embed.proj.weight"].shape[-1]
    first = shared if shared is not None else next((v for k, v in keys.sd.items()
                                                    if k.endswith("relative_position_bias_table")), None)
    trained = config_grid(ctx.config, patch, pos.shape[1] - 1 if pos is not None else table_patches(first),
                          ctx.family)
    return trained, target_grid(ctx.img_size, trained, patch)


def _map_block(keys: Keys, i: int, trained: tuple[int, int]) -> tuple[Tensor, Tensor] | None:
    """Layer `i` by BLOCK and QKV; its relative position table split (None: it has none)."""
    src, dst = (f"layers.{i}.", f"encoder.layer.{i}."), f"blocks.{i}."
    qkv(keys, f"{dst}attn.qkv", *(tuple(s + n for s in src for n in names) for names in QKV))
    keys.map(BLOCK, src=src, dst=dst)
    keys.map(BLOCK_TENSORS, src=src, dst=dst, params=TENSOR)
    t = keys.get(*(s + n for s in src for n in LAYER_TABLE))
    return None if t is None else split_table(t, trained, keys.family, f"layer {i}'s relative_position_bias_table")


def _place_encodings(out: dict[str, Tensor], tables: list[tuple[Tensor, Tensor]], pos: Tensor | None,
                     grid: tuple[int, int], trained: tuple[int, int], notes: list[str]) -> str:
    """The tables at `grid`, as transformers' `interpolate_pos_encoding` resizes them; the encoding's name."""
    if tables:
        place_rel_tables(out, tables, grid, trained, notes, " (bilinear, as transformers' interpolate_pos_encoding).")
    if pos is not None:
        out["pos_embed"] = resample_table(pos, grid, trained, 1, notes, antialias=False)
    if tables or pos is not None:
        note_resampled_once(notes, grid, trained, out["patch_embed.proj.weight"].shape[-1], "tables")
    return encoding_name(out, notes)


def _options(encoding: str, shared: bool) -> dict[str, object]:
    """`rpb_cls`'s (one shared table) and `ape`'s (transformers' resampling: bicubic, not antialiased)."""
    return {**({"shared": True} if shared else {}), **(ape_options(False) if "ape" in encoding.split("+") else {})}


def _config(out: Mapping[str, Tensor], ctx: Context, tables: list[tuple[Tensor, Tensor]], grid: tuple[int, int],
            depth: int, encoding: str, shared: bool, notes: list[str]) -> ViTConfig:
    mean = bool(ctx.config.get("use_mean_pooling", "fc_norm.weight" in out))
    if mean and "fc_norm.weight" not in out:
        notes.append("Read-out: the mean of the patch tokens without a norm (the file has no pooler layernorm).")
    proj = out["patch_embed.proj.weight"]
    patch, dim = proj.shape[-1], proj.shape[0]
    return ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                     num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0, dim=dim, depth=depth,
                     heads=ctx.heads or ctx.config.get("num_attention_heads") or table_heads(tables, dim),
                     mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0], norm_eps=ctx.config.get("layer_norm_eps", 1e-12),
                     encoding=encoding, encoding_options=_options(encoding, shared),
                     layer_scale="blocks.0.ls1.gamma" in out, pool="avg" if mean else "token",
                     fc_norm="fc_norm.weight" in out, final_norm="norm.weight" in out, act=act(ctx.config, ctx.family))
