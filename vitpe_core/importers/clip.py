"""The vision towers of CLIP (arXiv 2103.00020) and SigLIP (arXiv 2303.15343) in Hugging Face's
layout -> a vitpe ViT with `ape`.

`CLIPVisionModel` / `CLIPModel` / `CLIPForImageClassification` and `SiglipVisionModel` /
`SiglipModel` / `SiglipForImageClassification`; whole CLIP / SigLIP models keep their vision tower
(`vision_model.*`), the text tower and the projections are left out and named.

* CLIP: a class token (`class_embedding`), a patch embedding without bias (zero), a LayerNorm
  before the blocks (`pre_layrnorm` -> `pre_norm`), quick-GELU. The vision model's output is the
  CLS token after `post_layernorm`; the classifier reads the mean of the patch tokens *without*
  `post_layernorm` (`final_norm=False`; the unused norm is left out, named).
* SigLIP: no class token, `post_layernorm` on every token, GELU (tanh). The vision model's output
  is attention pooling (`head` -> `pool="map"`, vitpe's `attn_pool`: `probe` -> `latent`,
  `in_proj` split into `q` and `kv`); the classifier reads the mean of all tokens (its unused
  `head` is left out, named).
* Another size: the table is resampled as `interpolate_pos_encoding=True` does (bicubic, not
  antialiased): once at import for `--img-size`, at run time (`ape_antialias=False`) for an input
  of another size.
"""
from __future__ import annotations

from typing import Mapping

from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from ._hf import act, ape_options, config_grid, note_resampled_once, resample_table, target_grid
from .context import Context, Converted
from .keymap import PARAMS, Keys, qkv, strip_prefix, zero_bias

TOP = {"patch_embed.proj": "embeddings.patch_embedding", "norm_pre": "pre_layrnorm", "norm": "post_layernorm",
       "head": "<head>.classifier"}
BLOCK = {"norm1": "layer_norm1", "norm2": "layer_norm2", "attn.proj": "self_attn.out_proj",
         "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
POOL_HEAD = {"attn_pool.proj": "head.attention.out_proj", "attn_pool.norm": "head.layernorm",
             "attn_pool.mlp.fc1": "head.mlp.fc1", "attn_pool.mlp.fc2": "head.mlp.fc2"}
DROP = {r"^embeddings\.position_ids$": None}   # the index buffer older files kept (arange)
OTHER_TOWER = r"^<head>\.(text_model\.|text_projection|visual_projection|logit_scale|logit_bias)"


def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    """Refuse SigLIP 2, map the keys (the read-out with them), resample the table, configure; `ctx.family` is
    clip or siglip (detect.py)."""
    if str(ctx.config.get("model_type", "")).startswith("siglip2"):
        raise CheckpointError("SigLIP 2 (NaFlex: a linear patch embedding, variable resolution) is not a ViT vitpe "
                              "computes; only SigLIP's fixed-resolution vision tower is imported")
    notes: list[str] = []
    vision = ctx.config.get("vision_config") or ctx.config
    out, pos, pool, depth = _map_keys(sd, ctx.family, notes)
    patch = out["patch_embed.proj.weight"].shape[-1]
    prefix_rows = int("cls_token" in out)
    trained = config_grid(vision, patch, pos.shape[0] - prefix_rows, ctx.family)
    grid = target_grid(ctx.img_size, trained, patch)
    out["pos_embed"] = resample_table(pos[None], grid, trained, prefix_rows, notes, antialias=False)
    note_resampled_once(notes, grid, trained, patch)
    if pool == "avg" and "head.weight" not in out:
        notes.append("Read-out: the mean of the tokens (the vision model has no pooling head).")
    return out, _config(out, ctx, vision, grid, depth, pool), notes


def _map_keys(sd: Mapping[str, Tensor], family: str, notes: list[str]
              ) -> tuple[dict[str, Tensor], Tensor, str, int]:
    """transformers' keys -> the model's by the tables above: (weights, the position table to
    resample, the read-out, depth); the other tower is left out, named."""
    stripped, prefix = strip_prefix(sd, ("vision_model.",))
    keys = Keys(stripped, family, prefix)
    keys.map(TOP)
    pos = keys.get("embeddings.position_embedding.weight")
    keys.drop_all(DROP, notes)
    cls = keys.get("embeddings.class_embedding")
    proj = keys.out.get("patch_embed.proj.weight")
    if proj is None or proj.ndim != 4 or pos is None:
        raise CheckpointError(f"{family}: the file lacks a convolutional patch embedding or the position table")
    if cls is not None:
        keys.out["cls_token"] = cls.reshape(1, 1, -1)
    layers = keys.layers(r"encoder\.layers\.(\d+)\.")
    for i in layers:
        src, dst = f"encoder.layers.{i}.", f"blocks.{i}."
        qkv(keys, f"{dst}attn.qkv", *[(f"{src}self_attn.{n}_proj",) for n in "qkv"])
        keys.map(BLOCK, src=src, dst=dst)
    pool = _read_out(keys, proj.shape[0], cls is not None, notes)
    other = keys.drop(OTHER_TOWER)
    if other:
        notes.append(f"Left out the rest of the {family.upper()} model (text tower, projections, logit scale): "
                     f"{len(other)} tensors; imported is its vision tower.")
    keys.refuse_rest()
    zero_bias(keys, "patch_embed.proj", notes, "The patch embedding")
    return keys.out, pos, pool, len(layers)


def _read_out(keys: Keys, dim: int, class_token: bool, notes: list[str]) -> str:
    """The pool of what the file is: a classifier reads the mean (without CLIP's `post_layernorm`),
    a CLIP vision model its CLS token, a SigLIP vision model its attention-pooling head."""
    classifier = "head.weight" in keys.out
    pool = "avg" if classifier else "token" if class_token else "map" if "head.probe" in keys.sd else "avg"
    if pool == "map":
        _attention_pool(keys, dim)
    elif keys.drop(r"^head\."):
        notes.append("Left out the attention-pooling `head`, which the classifier does not use (it reads the mean "
                     "of the tokens).")
    if classifier and class_token and keys.out.pop("norm.weight", None) is not None:
        keys.out.pop("norm.bias", None)
        notes.append("Left out `post_layernorm`, which CLIPForImageClassification does not use (it reads the mean "
                     "of the patch tokens before it).")
    return pool


def _attention_pool(keys: Keys, dim: int) -> None:
    """SigLIP's `head` (torch's MultiheadAttention with a learned probe) -> vitpe's `attn_pool`."""
    keys.take("attn_pool.latent", "head.probe")
    for p in PARAMS:
        packed = keys.get(f"head.attention.in_proj_{p}")
        if packed is None:
            raise CheckpointError(f"siglip: the attention-pooling head has no in_proj_{p}")
        keys.out[f"attn_pool.q.{p}"], keys.out[f"attn_pool.kv.{p}"] = packed[:dim], packed[dim:]
    keys.map(POOL_HEAD)


def _config(out: Mapping[str, Tensor], ctx: Context, vision: Mapping, grid: tuple[int, int], depth: int,
            pool: str) -> ViTConfig:
    """The `ViTConfig` of the mapped weights `out` and the vision config `vision`."""
    proj = out["patch_embed.proj.weight"]
    patch, dim = proj.shape[-1], proj.shape[0]
    clip = ctx.family == "clip"
    return ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                     num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0, dim=dim, depth=depth,
                     heads=ctx.heads or vision.get("num_attention_heads") or max(1, dim // 64),
                     mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0],
                     norm_eps=vision.get("layer_norm_eps", 1e-5 if clip else 1e-6), encoding="ape",
                     encoding_options=ape_options(False),
                     class_token="cls_token" in out, pool=pool, pre_norm="norm_pre.weight" in out,
                     final_norm="norm.weight" in out,
                     act=act(vision, ctx.family, "quick_gelu" if clip else "gelu_pytorch_tanh"))
