"""Hugging Face `ViTModel` / `ViTForImageClassification` keys (transformers 4 names, as files on
the hub carry them, and transformers 5's) -> timm's keys, then timm.py's converter at the config's
image size. Another size is resampled as transformers' `interpolate_pos_encoding=True` does
(bicubic, not antialiased; timm antialiases): once at import for `--img-size`, at run time
(`ape_antialias=False`) for an input of another size."""
from __future__ import annotations

import re
import dataclasses
from typing import Any, Mapping

import torch

from ..checkpoint import CheckpointError
from . import timm
from ._hf import ape_options, note_resampled_once, resample_table, size_pair, target_grid
from .context import Context, Converted
from .keymap import PARAMS, TENSOR, Keys

# A layer's names in each layout: files on the hub (transformers 4) `encoder.layer.N.*`, transformers 5 `layers.N.*`.
HF4_LAYER = {"q": "attention.attention.query", "k": "attention.attention.key", "v": "attention.attention.value",
             "o": "attention.output.dense", "norm1": "layernorm_before", "norm2": "layernorm_after",
             "fc1": "intermediate.dense", "fc2": "output.dense"}
HF5_LAYER = {"q": "attention.q_proj", "k": "attention.k_proj", "v": "attention.v_proj", "o": "attention.o_proj",
             "norm1": "layernorm_before", "norm2": "layernorm_after", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}
LAYOUTS = (("encoder.layer.", HF4_LAYER), ("layers.", HF5_LAYER))   # both read, layer by layer; the latter wins

# timm's names: their names, inside the backbone's `vit.` prefix (where the file has one) ...
TOP = {"patch_embed.proj": "embeddings.patch_embeddings.projection", "norm": "layernorm"}
TOP_TENSORS = {"cls_token": "embeddings.cls_token", "pos_embed": "embeddings.position_embeddings",
               "mask_token": "embeddings.mask_token"}   # timm.drop_foreign leaves the mask token out, with its note
HEAD = {"head": "classifier"}   # ... and outside it
BLOCK = {"attn.proj": "o", "norm1": "norm1", "norm2": "norm2", "mlp.fc1": "fc1", "mlp.fc2": "fc2"}   # ours: a layout's
DROP = {r"pooler\.": "Left out the Hugging Face pooler (dense + tanh), which ViTForImageClassification does not use."}
WHO = "Hugging Face ViT"   # what the refusal of keys no rule takes calls the file


def convert(sd: Mapping[str, torch.Tensor], ctx: Context) -> Converted:
    """The weights renamed to timm's (`from_hf`) and converted as timm's, with the config's heads
    and the size its table was trained at."""
    notes: list[str] = []
    sd, hf = from_hf(dict(sd), ctx.config, notes)
    trained = size_pair(hf["image_size"])
    weights, cfg, more = timm.convert(sd, dataclasses.replace(ctx, heads=ctx.heads or hf["heads"],
                                                              img_size=trained or ctx.img_size))
    notes += more
    grid = target_grid(ctx.img_size, cfg.grid, cfg.patch_size)
    options = dict(cfg.encoding_options)
    if "pos_embed" in weights:   # transformers' rule, not timm's
        options.update(ape_options(False))
        if grid != cfg.grid:
            rows = 0 if cfg.no_embed_class else cfg.num_prefix
            weights["pos_embed"] = resample_table(weights["pos_embed"], grid, cfg.grid, rows, notes, antialias=False)
            note_resampled_once(notes, grid, cfg.grid, cfg.patch_size)
    return weights, dataclasses.replace(cfg, img_size=(grid[0] * cfg.patch_size, grid[1] * cfg.patch_size),
                                        encoding_options=options), notes


def from_hf(sd: dict[str, torch.Tensor], config: Mapping[str, Any], notes: list[str]
            ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Hugging Face `ViTModel` / `ViTForImageClassification` keys -> timm keys, by the tables above;
    a key no rule takes is refused."""
    if config.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"hidden_act {config['hidden_act']!r}: only 'gelu' (exact) is supported")
    pre = "vit." if any(k.startswith("vit.") for k in sd) else ""
    keys = Keys(sd, WHO)
    keys.map(TOP, src=pre)
    keys.map(TOP_TENSORS, src=pre, params=TENSOR)
    keys.map(HEAD)
    for i in keys.layers(rf"{re.escape(pre)}(?:encoder\.layer|layers)\.(\d+)\."):
        for layer, names in LAYOUTS:
            src = f"{pre}{layer}{i}."
            _qkv(keys, src, names, f"blocks.{i}.attn.qkv")
            keys.map({ours: names[theirs] for ours, theirs in BLOCK.items()}, src=src, dst=f"blocks.{i}.")
    keys.drop_all({f"^{re.escape(pre)}{pattern}": note for pattern, note in DROP.items()}, notes)
    keys.refuse_rest()
    return keys.out, {"heads": config.get("num_attention_heads"), "image_size": config.get("image_size")}


def _qkv(keys: Keys, src: str, names: Mapping[str, str], dst: str) -> None:
    """A layer's query, key and value of one parameter -> `dst`, where the file has all three
    (else they stay unplaced, and are refused)."""
    for p in PARAMS:
        parts = [f"{src}{names[n]}.{p}" for n in "qkv"]
        if all(n in keys.sd for n in parts):
            keys.out[f"{dst}.{p}"] = torch.cat([keys.get(n) for n in parts], 0)
