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
"""
from __future__ import annotations

from typing import Mapping

from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from ._hf import act, config_grid, resample_table, target_grid
from .context import Context, Converted
from .keymap import Keys, qkv, strip_prefix, zero_bias

BLOCK = {"norm1": "layer_norm1", "norm2": "layer_norm2", "attn.proj": "self_attn.out_proj",
         "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
POOL_HEAD = {"attn_pool.proj": "head.attention.out_proj", "attn_pool.norm": "head.layernorm",
             "attn_pool.mlp.fc1": "head.mlp.fc1", "attn_pool.mlp.fc2": "head.mlp.fc2"}
OTHER_TOWER = r"^<head>\.(text_model\.|text_projection|visual_projection|logit_scale|logit_bias)"


def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    config, img_size, heads, notes = ctx.config, ctx.img_size, ctx.heads, []
    sd, prefix = strip_prefix(sd, ("vision_model.",))
    vc = config.get("vision_config") or config
    family = ctx.family   # clip or siglip (detect.py)
    keys = Keys(sd, family, prefix)
    if str(config.get("model_type", "")).startswith("siglip2"):
        raise CheckpointError("SigLIP 2 (NaFlex: a linear patch embedding, variable resolution) is not a ViT vitpe "
                              "computes; only SigLIP's fixed-resolution vision tower is imported")
    proj = keys.take("patch_embed.proj.weight", "embeddings.patch_embedding.weight")
    keys.take("patch_embed.proj.bias", "embeddings.patch_embedding.bias")
    pos = keys.get("embeddings.position_embedding.weight")
    keys.drop(r"^embeddings\.position_ids$")   # the index buffer older files kept (arange)
    cls = keys.get("embeddings.class_embedding")
    if proj is None or proj.ndim != 4 or pos is None:
        raise CheckpointError(f"{family}: the file lacks a convolutional patch embedding or the position table")
    patch, dim = proj.shape[-1], proj.shape[0]
    if cls is not None:
        keys.out["cls_token"] = cls.reshape(1, 1, -1)
    layers = keys.layers(r"encoder\.layers\.(\d+)\.")
    for i in layers:
        s = f"encoder.layers.{i}."
        qkv(keys, f"blocks.{i}.attn.qkv", *[(f"{s}self_attn.{n}_proj",) for n in "qkv"])
        for ours, theirs in BLOCK.items():
            for p in ("weight", "bias"):
                keys.take(f"blocks.{i}.{ours}.{p}", f"{s}{theirs}.{p}")
    for p in ("weight", "bias"):
        keys.take(f"norm_pre.{p}", f"pre_layrnorm.{p}")
        keys.take(f"norm.{p}", f"post_layernorm.{p}")
        keys.take(f"head.{p}", f"<head>.classifier.{p}")
    classifier = "head.weight" in keys.out
    pool = "avg" if classifier else "token" if cls is not None else "map" if "head.probe" in keys.sd else "avg"
    if pool == "map":
        _attention_pool(keys, dim)
    elif keys.drop(r"^head\."):
        notes.append("Left out the attention-pooling `head`, which the classifier does not use (it reads the mean "
                     "of the tokens).")
    if classifier and cls is not None and keys.out.pop("norm.weight", None) is not None:
        keys.out.pop("norm.bias", None)
        notes.append("Left out `post_layernorm`, which CLIPForImageClassification does not use (it reads the mean "
                     "of the patch tokens before it).")
    other = keys.drop(OTHER_TOWER)
    if other:
        notes.append(f"Left out the rest of the {family.upper()} model (text tower, projections, logit scale): "
                     f"{len(other)} tensors; imported is its vision tower.")
    keys.refuse_rest()
    out = keys.out
    zero_bias(keys, "patch_embed.proj", notes, "The patch embedding")
    P = int(cls is not None)
    grid0 = config_grid(vc, patch, pos.shape[0] - P, family)
    grid = target_grid(img_size, grid0, patch)
    out["pos_embed"] = resample_table(pos[None], grid, grid0, P, notes, antialias=False)
    if pool == "avg" and not classifier:
        notes.append("Read-out: the mean of the tokens (the vision model has no pooling head).")
    cfg = ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                    num_classes=out["head.weight"].shape[0] if classifier else 0, dim=dim, depth=len(layers),
                    heads=heads or vc.get("num_attention_heads") or max(1, dim // 64),
                    mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0],
                    norm_eps=vc.get("layer_norm_eps", 1e-5 if family == "clip" else 1e-6), encoding="ape",
                    class_token=cls is not None, pool=pool, pre_norm="norm_pre.weight" in out,
                    final_norm="norm.weight" in out,
                    act=act(vc, family, "quick_gelu" if family == "clip" else "gelu_pytorch_tanh"))
    return out, cfg, notes


def _attention_pool(keys: Keys, dim: int) -> None:
    """SigLIP's `head` (torch's MultiheadAttention with a learned probe) -> vitpe's `attn_pool`."""
    keys.take("attn_pool.latent", "head.probe")
    for p in ("weight", "bias"):
        packed = keys.get(f"head.attention.in_proj_{p}")
        if packed is None:
            raise CheckpointError(f"siglip: the attention-pooling head has no in_proj_{p}")
        keys.out[f"attn_pool.q.{p}"], keys.out[f"attn_pool.kv.{p}"] = packed[:dim], packed[dim:]
        for ours, theirs in POOL_HEAD.items():
            keys.take(f"{ours}.{p}", f"{theirs}.{p}")
