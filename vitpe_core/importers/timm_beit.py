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

Another image size: `pos_embed` is resampled as timm does (bicubic, antialiased); the offset
tables are resized bilinearly (the `rpb_cls` encoding's rule, transformers'), where timm's
checkpoint filter uses BEiT's geometric interpolation: the outputs then differ from timm's (noted).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from ..encodings.absolute import resample_abs_pos_embed
from . import timm_hub
from ._hf import config_grid, target_grid
from .context import Context, Converted
from .keymap import Keys, is_packed_glu
from .refuse import refuse
from .beit import _table, one_table_scheme

FAMILY = "timm-beit"
def trained_grid(config: Mapping[str, Any], patch: int, pos: Tensor | None, table: Tensor | None,
                 img_size: tuple[int, int] | None, family: str) -> tuple[int, int]:
    """The grid the position parameters were trained on: timm's config.json's image size, else the
    square grid of the table (`pos_embed` or a relative table), else `img_size` where the table fits it."""
    patches = pos.shape[1] - 1 if pos is not None else _square_table(table)
    if patches is None and table is not None and img_size is not None:   # a non-square table: --img-size
        H, W = img_size[0] // patch, img_size[1] // patch
        if (2 * H - 1) * (2 * W - 1) + 3 == table.shape[0]:
            return H, W
    size = timm_hub.img_size(config)
    return config_grid({"image_size": list(size)} if size else {}, patch, patches, family)


def _square_table(t: Tensor | None) -> int | None:
    if t is None:
        return None
    side = (round((t.shape[0] - 3) ** 0.5) + 1) // 2
    return side * side if (2 * side - 1) ** 2 + 3 == t.shape[0] else None



def take_embedding(keys: Keys, family: str, notes: list[str]) -> Tensor:
    """The patch embedding and class token of timm's BEiT / Eva layouts (the projection weight,
    checked convolutional), `mask_token` left out with a note."""
    proj = keys.take("patch_embed.proj.weight", "patch_embed.proj.weight")
    keys.take("patch_embed.proj.bias", "patch_embed.proj.bias")
    if keys.take("cls_token", "cls_token") is None or proj is None or proj.ndim != 4:
        raise CheckpointError(f"{family}: no convolutional patch embedding or class token in the file")
    if keys.drop(r"^mask_token$"):
        notes.append("Left out `mask_token` (used only for masked pre-training).")
    return proj


def take_layer_scale(keys: Keys, b: str) -> None:
    """timm's LayerScale of block prefix `b` (`gamma_1`, `gamma_2`) as vitpe's `ls1` / `ls2`."""
    for n in (1, 2):
        keys.take(f"{b}ls{n}.gamma", f"{b}gamma_{n}")


def take_qkv(keys: Keys, i: int, family: str, reorder=None, biases_required: bool = False) -> None:
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

def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    config, img_size, heads, pool, notes = ctx.config, ctx.img_size, ctx.heads, ctx.pool, []
    refuse(sd, FAMILY)
    if is_packed_glu(sd):
        raise CheckpointError(f"{FAMILY}: blocks.0.mlp.fc1.weight is twice as wide as fc2's input (a packed SwiGLU) "
                              "beside attn.q_bias: timm's Eva (EVA-02), not a BEiT. Its rotary embedding is not in the "
                              "file; put timm's config.json (architecture eva02_*) beside it")
    keys = Keys(sd, FAMILY)
    proj = take_embedding(keys, FAMILY, notes)
    pos = keys.get("pos_embed")
    keys.drop(r"relative_position_index$|^blocks\.\d+\.attn\.k_bias$")   # buffers older files keep
    patch, dim = proj.shape[-1], proj.shape[0]
    layers = keys.layers(r"blocks\.(\d+)\.")
    shared = keys.get("rel_pos_bias.relative_position_bias_table")
    first = shared if shared is not None else sd.get("blocks.0.attn.relative_position_bias_table")
    if first is None:   # every timm BEiT has one; timm's Eva shares BEiT's names without
        raise CheckpointError(f"{FAMILY}: attn.q_bias / v_bias and no relative position bias table: not a timm BEiT "
                              "but timm's Eva class (EVA, EVA-02 CLIP, the RoPE ViTs, PE, timm's DINOv3), whose rotary "
                              "embedding or post-norm is not in the keys; only EVA-02 tiny / small are imported, with "
                              "timm's config.json (architecture eva02_*) beside the file")
    grid0 = trained_grid(config, patch, pos, first, img_size, FAMILY)
    grid = target_grid(img_size, grid0, patch)
    tables = []
    for i in layers:
        b = f"blocks.{i}."
        take_qkv(keys, i, FAMILY)
        keys.keep(*(b + n for n in ("norm1", "norm2", "attn.proj", "mlp.fc1", "mlp.fc2")))
        take_layer_scale(keys, b)
        t = keys.get(f"{b}attn.relative_position_bias_table")
        if t is not None:
            tables.append(_table(t, grid0, FAMILY, f"{b}attn.relative_position_bias_table"))
    tables = one_table_scheme(tables, shared, len(layers), grid0, FAMILY, "rel_pos_bias.relative_position_bias_table",
                              "blocks")
    keys.keep("norm", "fc_norm", "head")
    keys.refuse_rest()
    out = keys.out
    if "blocks.0.mlp.fc1.weight" not in out:
        raise CheckpointError(f"{FAMILY}: block 0 lacks mlp.fc1.weight")
    encoding = []
    if tables:
        encoding.append("rpb_cls")
        rel = torch.stack([t for t, _ in tables])                       # (L|1, h, 2H-1, 2W-1)
        if grid != grid0:
            rel = F.interpolate(rel.float(), size=(2 * grid[0] - 1, 2 * grid[1] - 1), mode="bilinear",
                                align_corners=False).to(rel.dtype)
            notes.append(f"The relative position tables were trained on a {grid0[0]}x{grid0[1]} grid; resized to "
                         f"{grid[0]}x{grid[1]} bilinearly (transformers' rule); timm's checkpoint filter uses BEiT's "
                         "geometric interpolation, so the outputs differ from timm's at this size.")
        out["pos_enc.rel_tables"] = rel
        out["pos_enc.cls_bias"] = torch.stack([c for _, c in tables])  # (L|1, h, 3)
    if pos is not None:
        encoding.append("ape")
        out["pos_embed"] = pos
        if grid != grid0:
            out["pos_embed"] = resample_abs_pos_embed(pos.float(), grid, grid0, 1).to(pos.dtype)
            notes.append(f"The position table was trained on a {grid0[0]}x{grid0[1]} grid; resampled to "
                         f"{grid[0]}x{grid[1]} (bicubic, antialiased, the CLS row kept apart, as timm does).")
    if not encoding:
        notes.append("No position table and no relative position bias: imported as `none`.")
    cfg = ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                    num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0, dim=dim,
                    depth=len(layers), heads=heads or timm_hub.heads(config) or _heads(tables, dim),
                    mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0], qkv_bias="blocks.0.attn.qkv.bias" in out,
                    norm_eps=1e-6, encoding="+".join(encoding) or "none",
                    encoding_options={"shared": True} if shared is not None else {},
                    layer_scale="blocks.0.ls1.gamma" in out, pool=read_out(out, config, pool, notes),
                    fc_norm="fc_norm.weight" in out, act="gelu")
    return out, cfg, notes


def _heads(tables: list[tuple[Tensor, Tensor]], dim: int) -> int:
    return tables[0][0].shape[0] if tables else max(1, dim // 64)


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
