"""BEiT / BEiT v2 in timm's layout (`timm.models.beit.Beit`: `beit_*`, `beitv2_*`) -> a vitpe ViT
with `rpb_cls` (+ `ape`), the same path as the Hugging Face BEiT importer (beit.py).

timm's names: `blocks.N.attn.qkv.weight` with `q_bias` / `v_bias` (the key has no bias: zero),
`blocks.N.attn.relative_position_bias_table` per layer or `rel_pos_bias.relative_position_bias_table`
shared, `((2H-1)(2W-1) + 3, h)` (the last three rows: CLS->patch, patch->CLS, CLS->CLS, as
BEiT's), `gamma_1` / `gamma_2` (LayerScale), `pos_embed` where `use_abs_pos_emb`, and the read-out:
`fc_norm` after the mean of the patches (timm's default `global_pool='avg'`), or `norm` and the
CLS token (`global_pool='token'`). LayerNorm eps 1e-6 and exact GELU, as every timm BEiT.
`relative_position_index` (a buffer older files keep) is left out; any key no rule places is
refused by name. A packed SwiGLU MLP beside `q_bias` is timm's `Eva` (EVA-02), not a BEiT:
refused here, imported by timm_eva.py where timm's config.json names the architecture.

Another image size: `pos_embed` is resampled as timm does (bicubic, antialiased) and the offset
tables by BEiT's geometric interpolation, as timm's `checkpoint_filter_fn` does for a model created
at that size (`resize_rel_table(mode="geometric")`, timm 1.0.31's `resize_rel_pos_bias_table`; the
CLS entries kept); the encoding gets `table_resize="geometric"`, so an imported model run on another
size resizes its tables by the same rule (timm's `Beit` has no `dynamic_img_size`: that equals timm's
model created at that size). tests/test_import_sizes_timm.py checks both against timm.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from ..encodings.rpb import resize_rel_table
from . import timm_hub
from ._hf import config_grid, resample_table, target_grid
from .beit import encoding_name, per_layer_or_shared, place_rel_tables, split_table, table_heads, table_patches
from .context import Context, Converted
from .keymap import TENSOR, Keys, is_packed_glu, split_packed_glu
from .refuse import refuse

FAMILY = "timm-beit"
# what timm's BEiT and Eva layouts share (timm_eva.py and timm_dinov3.py read these tables too)
EMBEDDING = {"patch_embed.proj": "patch_embed.proj"}
EMBEDDING_TENSORS = {"cls_token": "cls_token"}
TOP = {"norm": "norm", "fc_norm": "fc_norm", "head": "head"}
LAYER_SCALE = {"ls1.gamma": "gamma_1", "ls2.gamma": "gamma_2"}
MASK_TOKEN = {r"^mask_token$": "Left out `mask_token` (used only for masked pre-training)."}
# timm's BEiT's own
BLOCK = {n: n for n in ("norm1", "norm2", "attn.proj", "mlp.fc1", "mlp.fc2")}
SHARED_TABLE = "rel_pos_bias.relative_position_bias_table"
TABLE_RESIZE = "geometric"   # timm's checkpoint_filter_fn: resize_rel_pos_bias_table, BEiT's rule
DROP = {**MASK_TOKEN, r"relative_position_index$|^blocks\.\d+\.attn\.k_bias$": None}   # buffers older files keep


def trained_grid(config: Mapping[str, Any], patch: int, pos: Tensor | None, table: Tensor | None,
                 img_size: tuple[int, int] | None, family: str) -> tuple[int, int]:
    """The grid the position parameters were trained on: timm's config.json's image size, else the
    square grid of the table (`pos_embed` or a relative table), else `img_size` where the table fits it."""
    patches = pos.shape[1] - 1 if pos is not None else table_patches(table)
    if patches is None and table is not None and img_size is not None:   # a non-square table: --img-size
        H, W = img_size[0] // patch, img_size[1] // patch
        if (2 * H - 1) * (2 * W - 1) + 3 == table.shape[0]:
            return H, W
    size = timm_hub.img_size(config)
    return config_grid({"image_size": list(size)} if size else {}, patch, patches, family)


# ----------------------------------------------------------------------------- shared by timm's BEiT and Eva
def take_embedding(keys: Keys, family: str) -> Tensor:
    """The patch embedding and class token of timm's BEiT / Eva layouts (the projection weight,
    checked convolutional)."""
    keys.map(EMBEDDING)
    keys.map(EMBEDDING_TENSORS, params=TENSOR)
    proj = keys.out.get("patch_embed.proj.weight")
    if "cls_token" not in keys.out or proj is None or proj.ndim != 4:
        raise CheckpointError(f"{family}: no convolutional patch embedding or class token in the file")
    return proj


def take_qkv(keys: Keys, i: int, family: str, reorder: Callable[[Tensor], Tensor] | None = None,
             biases_required: bool = False) -> None:
    """Block `i`'s fused `attn.qkv.weight` and its separate `q_bias` / `v_bias` (timm's BEiT and
    Eva: the key has no bias; a zero one is equivalent) as vitpe's `qkv` weight and bias.
    `reorder(t)`: applied to the query and key parts (a rotary layout's channel order)."""
    b = f"blocks.{i}."
    w = keys.get(f"{b}attn.qkv.weight")
    q, v = keys.get(f"{b}attn.q_bias"), keys.get(f"{b}attn.v_bias")
    if biases_required and (w is None or q is None or v is None):
        raise CheckpointError(f"{family}: block {i} lacks attn.qkv.weight, attn.q_bias or attn.v_bias")
    if w is None or (q is None) != (v is None):
        what = "no attn.qkv.weight" if w is None else "only one of attn.q_bias and attn.v_bias"
        raise CheckpointError(f"{family}: block {i} has {what}")
    if reorder is None:
        keys.out[f"{b}attn.qkv.weight"] = w
    else:
        wq, wk, wv = w.chunk(3, dim=0)
        keys.out[f"{b}attn.qkv.weight"] = torch.cat((reorder(wq), reorder(wk), wv))
    if q is not None:
        keys.out[f"{b}attn.qkv.bias"] = torch.cat((q if reorder is None else reorder(q), torch.zeros_like(q), v))


def take_fc1(keys: Keys, b: str, packed: bool) -> None:
    """Block prefix `b`'s `mlp.fc1`: a packed SwiGLU (`packed`: timm's `GluMlp`, gate first) split
    into vitpe's `fc1_g` / `fc1_x`, else as it is."""
    for p in ("weight", "bias"):
        t = keys.get(f"{b}mlp.fc1.{p}")
        if t is not None and packed:
            split_packed_glu(keys.out, t, f"{b}mlp.", p)
        elif t is not None:
            keys.out[f"{b}mlp.fc1.{p}"] = t


def read_out(out: Mapping[str, Tensor], config: Mapping[str, Any], pool: str | None, notes: list[str]) -> str:
    """`pool`, else timm's config.json's `global_pool`, else the mean of the patches where `fc_norm`
    is there (timm's `global_pool='avg'`), else the CLS token."""
    given = pool or timm_hub.arg(config, "global_pool")
    if given:
        if given not in ("token", "avg"):
            raise CheckpointError(f"global_pool {given!r}: vitpe reads a timm BEiT / EVA out by 'token' or 'avg'")
        return given
    if "fc_norm.weight" in out:
        return "avg"
    notes.append("Read-out: the CLS token after `norm` (the keys cannot tell it from the mean without `fc_norm`; "
                 "import with --pool avg if the model was trained so).")
    return "token"


# ----------------------------------------------------------------------------- the converter
def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    notes: list[str] = []
    _refuse(sd)
    keys = Keys(sd, FAMILY)
    patch = take_embedding(keys, FAMILY).shape[-1]
    pos = keys.get("pos_embed")
    keys.drop_all(DROP, notes)
    shared = keys.get(SHARED_TABLE)
    trained = _trained(sd, shared, pos, patch, ctx)
    grid = target_grid(ctx.img_size, trained, patch)
    layers = keys.layers(r"blocks\.(\d+)\.")
    tables = [t for i in layers if (t := _map_block(keys, i, trained)) is not None]
    tables = per_layer_or_shared(tables, shared, len(layers), trained, FAMILY, SHARED_TABLE, "blocks")
    keys.map(TOP)
    keys.refuse_rest()
    if "blocks.0.mlp.fc1.weight" not in keys.out:
        raise CheckpointError(f"{FAMILY}: block 0 lacks mlp.fc1.weight")
    encoding = _place_encodings(keys.out, tables, pos, grid, trained, notes)
    return keys.out, _config(keys.out, ctx, tables, grid, len(layers), encoding, shared is not None, notes), notes


def _refuse(sd: Mapping[str, Tensor]) -> None:
    refuse(sd, FAMILY)
    if is_packed_glu(sd):
        raise CheckpointError(f"{FAMILY}: blocks.0.mlp.fc1.weight is twice as wide as fc2's input (a packed SwiGLU) "
                              "beside attn.q_bias: timm's Eva (EVA-02), not a BEiT. Its rotary embedding is not in the "
                              "file; put timm's config.json (architecture eva02_*) beside it")


def _trained(sd: Mapping[str, Tensor], shared: Tensor | None, pos: Tensor | None, patch: int, ctx: Context
             ) -> tuple[int, int]:
    """The grid the tables were trained on (`trained_grid`), from the first relative table."""
    first = shared if shared is not None else sd.get("blocks.0.attn.relative_position_bias_table")
    if first is None:   # every timm BEiT has one; timm's Eva shares BEiT's names without
        raise CheckpointError(f"{FAMILY}: attn.q_bias / v_bias and no relative position bias table: not a timm BEiT "
                              "but timm's Eva class (EVA, EVA-02 CLIP, the RoPE ViTs, PE, timm's DINOv3), whose rotary "
                              "embedding or post-norm is not in the keys; only EVA-02 tiny / small are imported, with "
                              "timm's config.json (architecture eva02_*) beside the file")
    return trained_grid(ctx.config, patch, pos, first, ctx.img_size, FAMILY)


def _map_block(keys: Keys, i: int, trained: tuple[int, int]) -> tuple[Tensor, Tensor] | None:
    """Block `i` by BLOCK and LAYER_SCALE; its relative position table split (None: it has none)."""
    b = f"blocks.{i}."
    take_qkv(keys, i, FAMILY)
    keys.map(BLOCK, src=b, dst=b)
    keys.map(LAYER_SCALE, src=b, dst=b, params=TENSOR)
    t = keys.get(f"{b}attn.relative_position_bias_table")
    return None if t is None else split_table(t, trained, FAMILY, f"{b}attn.relative_position_bias_table")


def _place_encodings(out: dict[str, Tensor], tables: list[tuple[Tensor, Tensor]], pos: Tensor | None,
                     grid: tuple[int, int], trained: tuple[int, int], notes: list[str]) -> str:
    """The tables at `grid` as timm's checkpoint filter puts them: `pos_embed` resampled, the offset
    tables resized by BEiT's geometric rule (a table a call, as the encoding resizes them); the
    encoding's name."""
    if tables:
        place_rel_tables(out, tables, trained, trained, notes, "")   # as trained: the resize is timm's, below
        if grid != trained:
            rel = out["pos_enc.rel_tables"]
            out["pos_enc.rel_tables"] = torch.stack([resize_rel_table(t, grid, mode=TABLE_RESIZE)
                                                     for t in rel]).to(rel.dtype)
            notes.append(f"The relative position tables were trained on a {trained[0]}x{trained[1]} grid; resized "
                         f"to {grid[0]}x{grid[1]} by BEiT's geometric interpolation, as timm's checkpoint filter "
                         "does.")
    if pos is not None:
        out["pos_embed"] = resample_table(pos, grid, trained, 1, notes, antialias=True, who="as timm does")
    return encoding_name(out, notes)


def _config(out: Mapping[str, Tensor], ctx: Context, tables: list[tuple[Tensor, Tensor]], grid: tuple[int, int],
            depth: int, encoding: str, shared: bool, notes: list[str]) -> ViTConfig:
    proj = out["patch_embed.proj.weight"]
    patch, dim = proj.shape[-1], proj.shape[0]
    return ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                     num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0, dim=dim, depth=depth,
                     heads=ctx.heads or timm_hub.heads(ctx.config) or table_heads(tables, dim),
                     mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0], qkv_bias="blocks.0.attn.qkv.bias" in out,
                     norm_eps=1e-6, encoding=encoding, encoding_options=_options(encoding, shared),
                     layer_scale="blocks.0.ls1.gamma" in out, pool=read_out(out, ctx.config, ctx.pool, notes),
                     fc_norm="fc_norm.weight" in out, act="gelu")


def _options(encoding: str, shared: bool) -> dict:
    """The `rpb_cls` options: one shared table or one per layer, resized at other sizes by timm's rule."""
    if "rpb_cls" not in encoding.split("+"):
        return {}
    return {**({"shared": True} if shared else {}), "table_resize": TABLE_RESIZE}
