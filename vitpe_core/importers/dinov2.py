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
  chooses another. An input of another size resamples the model's table by the same rule
  (`ape_antialias` in the config): the trained table where the import kept it, else the
  resampled one (a note says so).
"""
from __future__ import annotations

from typing import Any, Mapping

from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from ._hf import act, ape_options, config_grid, note_resampled_once, resample_table, size_pair, target_grid
from .context import Context, Converted
from .keymap import PARAMS, TENSOR, Keys, qkv, split_packed_glu, strip_prefix

PREFIXES = ("dinov2_with_registers.", "dinov2.")   # a classifier's backbone
TOP = {"patch_embed.proj": "embeddings.patch_embeddings.projection", "norm": "layernorm",
       "head": "<head>.classifier"}
EMBEDDINGS = {"cls": "embeddings.cls_token", "pos": "embeddings.position_embeddings",
              "reg": "embeddings.register_tokens"}   # read, then placed by `_embeddings`
BLOCK = {"norm1": "norm1", "norm2": "norm2", "attn.proj": ("attention.o_proj", "attention.output.dense"),
         "mlp.fc1": "mlp.fc1", "mlp.fc2": ("mlp.fc2", "mlp.weights_out", "mlp.down_proj"),
         "mlp.fc1_g": "mlp.gate_proj", "mlp.fc1_x": "mlp.up_proj"}
LAYER_SCALE = {"ls1.gamma": "layer_scale1.lambda1", "ls2.gamma": "layer_scale2.lambda1"}
QKV = (("attention.q_proj", "attention.attention.query"), ("attention.k_proj", "attention.attention.key"),
       ("attention.v_proj", "attention.attention.value"))   # transformers 5's, the hub's
PACKED_GLU = "mlp.weights_in"   # the hub's packed SwiGLU input: gate rows, then up rows
DROP = {r"^embeddings\.mask_token$": "Left out `mask_token` (used only for masked pre-training)."}


def processor_size(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """The size the image processor hands the model (`crop_size` when it crops, else `size`)."""
    crop = config.get("crop_size")
    if not config.get("do_center_crop", True) or not crop:
        return None
    if isinstance(crop, dict):
        return (int(crop["height"]), int(crop["width"])) if {"height", "width"} <= set(crop) else None
    return size_pair(crop)


def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    """Map the keys, choose the grid, place the embeddings (the table resampled), configure."""
    notes: list[str] = []
    out, embeddings, depth = _map_keys(sd, ctx.family, notes)
    patch = out["patch_embed.proj.weight"].shape[-1]
    grid, trained = _grids(ctx, patch, embeddings["pos"], notes)
    regs, antialias = _embeddings(out, embeddings, grid, trained, ctx.config, notes)
    note_resampled_once(notes, grid, trained, patch)
    return out, _config(out, ctx, grid, depth, regs, antialias), notes


def _map_keys(sd: Mapping[str, Tensor], family: str, notes: list[str]
              ) -> tuple[dict[str, Tensor], dict[str, Tensor | None], int]:
    """transformers' keys -> the model's by the tables above: (weights, the embeddings `_embeddings`
    places, depth)."""
    stripped, prefix = strip_prefix(sd, PREFIXES)
    keys = Keys(stripped, family, prefix)
    keys.map(TOP)
    embeddings = {name: keys.get(theirs) for name, theirs in EMBEDDINGS.items()}
    keys.drop_all(DROP, notes)
    if "patch_embed.proj.weight" not in keys.out or embeddings["cls"] is None or embeddings["pos"] is None:
        raise CheckpointError(f"{family}: the file lacks the patch embedding, class token or position table")
    layers = keys.layers(r"encoder\.layer\.(\d+)\.")
    for i in layers:
        src, dst = f"encoder.layer.{i}.", f"blocks.{i}."
        qkv(keys, f"{dst}attn.qkv", *[(src + a, src + b) for a, b in QKV])
        keys.map(BLOCK, src=src, dst=dst)
        for p in PARAMS:
            packed = keys.get(f"{src}{PACKED_GLU}.{p}")
            if packed is not None:
                split_packed_glu(keys.out, packed, f"{dst}mlp.", p)
        keys.map(LAYER_SCALE, src=src, dst=dst, params=TENSOR)
    keys.refuse_rest()
    return keys.out, embeddings, len(layers)


def _grids(ctx: Context, patch: int, pos: Tensor, notes: list[str]) -> tuple[tuple[int, int], tuple[int, int]]:
    """(the grid to build, the grid the table was trained on): the processor's crop unless
    `--img-size` says otherwise."""
    trained = config_grid(ctx.config, patch, pos.shape[1] - 1, ctx.family)
    size = ctx.img_size or processor_size(ctx.config)
    if ctx.img_size is None and size is not None and size != tuple(g * patch for g in trained):
        notes.append(f"Imported at the processor's crop size {size[0]}x{size[1]} (the size transformers runs it at); "
                     "pass --img-size for another.")
    return target_grid(size, trained, patch), trained


def _embeddings(out: dict[str, Tensor], embeddings: Mapping[str, Tensor | None], grid: tuple[int, int],
                trained: tuple[int, int], config: Mapping[str, Any], notes: list[str]) -> tuple[int, bool]:
    """The class and register tokens and the table (resampled to `grid`) into `out`; returns the
    number of registers and whether the family's resampling antialiases."""
    cls, pos, reg = embeddings["cls"], embeddings["pos"], embeddings["reg"]
    regs = 0 if reg is None else reg.shape[1]   # a registers model may have none (an empty tensor)
    if regs:
        out["reg_token"] = reg
        out["cls_token"] = cls + pos[:, :1]
        pos = pos[:, 1:]
        notes.append("The table's CLS row is added to `cls_token` (registers get no position; the same sum "
                     "transformers forms at every forward, as timm imports these models).")
    else:
        out["cls_token"] = cls
    antialias = config.get("model_type") == "dinov2_with_registers" or reg is not None   # as its resampling does
    out["pos_embed"] = resample_table(pos, grid, trained, 0 if regs else 1, notes, antialias=antialias)
    return regs, antialias


def _config(out: Mapping[str, Tensor], ctx: Context, grid: tuple[int, int], depth: int, regs: int,
            antialias: bool) -> ViTConfig:
    """The `ViTConfig` of the mapped weights `out`; the classifier must read `[CLS, mean]`."""
    proj = out["patch_embed.proj.weight"]
    patch, dim = proj.shape[-1], proj.shape[0]
    gated = "blocks.0.mlp.fc1_g.weight" in out
    head = out.get("head.weight")
    if head is not None and head.shape[1] != 2 * dim:
        raise CheckpointError(f"{ctx.family}: classifier.weight {tuple(head.shape)} does not read [CLS, mean] "
                              f"(2 x {dim})")
    return ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                     num_classes=0 if head is None else head.shape[0], dim=dim, depth=depth,
                     heads=ctx.heads or ctx.config.get("num_attention_heads") or max(1, dim // 64),
                     mlp_dim=out[f"blocks.0.mlp.{'fc1_g' if gated else 'fc1'}.weight"].shape[0],
                     qkv_bias="blocks.0.attn.qkv.bias" in out, norm_eps=ctx.config.get("layer_norm_eps", 1e-6),
                     encoding="ape", encoding_options=ape_options(antialias), reg_tokens=regs,
                     no_embed_class=bool(regs), layer_scale=True,
                     pool="token" if head is None else "token+avg", mlp="gated" if gated else "mlp",
                     act="silu" if gated else act(ctx.config, ctx.family))
