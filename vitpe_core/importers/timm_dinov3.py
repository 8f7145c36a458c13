"""DINOv3 in timm's layout (`timm.models.eva.Eva`, `vit_*_dinov3*`: `vit_small_patch16_dinov3`,
`vit_base_patch16_dinov3`, the `*_qkvb` and `*_plus` variants, `vit_7b_patch16_dinov3`) -> a vitpe
ViT with `rope_dinov3`, the same encoding as the Hugging Face importer (dinov3.py).

timm 1.0.31 builds every DINOv3 with `rope_type='dinov3'` (`RotaryEmbeddingDinoV3`): periods
`T^(4k/d)` (`rope_temperature` T = 100), patch centres normalised per axis to `[-1, 1]`, the first
`d/4` frequencies turned by the row and the last `d/4` by the column, on the pairs `(k, k + d/2)`
(`rope_rotate_half=True`): what `rope_dinov3` computes on vitpe's adjacent pairs once each head's
query and key channels are reordered as the HF importer does (`half_to_adjacent`; the scores are
unchanged). The prefix tokens (CLS, then the 4 registers `reg_token`) are not rotated, in both.
Keys: `blocks.N.attn.qkv.weight` with `q_bias` / `v_bias` in the `*_qkvb` models (the key has no
bias: zero), `gamma_1` / `gamma_2` (LayerScale), a plain GELU MLP (`mlp.fc1`, `mlp.fc2`) or SwiGLU
(`mlp.fc1_g`, `mlp.fc1_x`, SiLU; timm's packed `GluMlp` is split too), LayerNorm eps 1e-5, no
position table. The read-out is timm's `global_pool` (the mean of the patch tokens after `norm` by
default, `'token'` the CLS token as upstream DINOv3).

The rotary embedding is a buffer, not in the file, and the keys look like other `Eva` models with
registers (`vit_*_rope_reg*`, whose rotary embedding differs): timm's `config.json` beside the file
must name a DINOv3 architecture. Its `model_args` may set `rope_temperature`; other rotary options
(offset, `xy` indexing, the interleaved layout), post-norm blocks and a position table are refused.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from . import timm_hub
from ._hf import target_grid
from .context import Context, Converted
from .dinov3 import half_to_adjacent
from .keymap import TENSOR, Keys, check_layer_scale, check_rotary_heads, is_packed_glu, zero_bias
from .refuse import refuse
from .timm_beit import LAYER_SCALE, MASK_TOKEN, TOP, take_embedding, take_fc1, take_qkv

FAMILY = "timm-dinov3"
ARCH = r"_dinov3(_|$)"
HEADS = {"vit_7b_patch16_dinov3": 32}   # timm 1.0.31: the one DINOv3 whose heads are not width / 64
DEFAULT_SIZE = (256, 256)              # pretrained_cfg input_size of every DINOv3 in timm 1.0.31
TOP_TENSORS = {"reg_token": "reg_token"}
BLOCK = {n: n for n in ("norm1", "norm2", "attn.proj", "mlp.fc1_g", "mlp.fc1_x", "mlp.fc2")}   # + mlp.fc1 (take_fc1)
DROP = {**MASK_TOKEN,
        r"^blocks\.\d+\.attn\.k_bias$": None,   # a zero buffer
        r"^rope\.": "Left out the rotary embedding's stored buffers (`rope.*`), which are recomputed."}


def is_dinov3(config: Mapping[str, Any] | None) -> bool:
    return bool(re.search(ARCH, timm_hub.architecture(config)))


def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    notes: list[str] = []
    _refuse(sd, ctx.config)
    keys = _map_top(sd, notes)
    heads = _heads(ctx, keys.out["patch_embed.proj.weight"].shape[0])
    layers = keys.layers(r"blocks\.(\d+)\.")
    for i in layers:
        _map_block(keys, i, heads)
    keys.refuse_rest()
    layer_scale = _check_blocks(keys, layers, notes)
    return keys.out, _config(keys.out, ctx, len(layers), heads, layer_scale, notes), notes


def _refuse(sd: Mapping[str, Tensor], config: Mapping[str, Any]) -> None:
    """CheckpointError unless timm's config.json names a DINOv3 whose settings vitpe computes (refuse.py)."""
    if not is_dinov3(config):
        arch = timm_hub.architecture(config)
        raise CheckpointError(f"{FAMILY}: timm's Eva class with register tokens (`reg_token`, `blocks.N.gamma_1`): "
                              "timm's DINOv3 or another Eva (`vit_*_rope_reg*`), whose rotary embeddings differ and "
                              "are not in the file; put timm's config.json (architecture vit_*_dinov3*) beside the file"
                              f"{f' (it names {arch!r})' if arch else ''}")
    refuse(sd, FAMILY, config)


def _map_top(sd: Mapping[str, Tensor], notes: list[str]) -> Keys:
    """The keys outside the blocks: the embedding, TOP, TOP_TENSORS (the registers) and DROP."""
    keys = Keys(sd, FAMILY)
    take_embedding(keys, FAMILY)
    keys.map(TOP_TENSORS, params=TENSOR)
    keys.drop_all(DROP, notes)
    keys.map(TOP)
    return keys


def _heads(ctx: Context, dim: int) -> int:
    """`--heads`, else timm's config.json's, else the architecture's, else `dim // 64`; checked for the rotary pairs."""
    heads = ctx.heads or timm_hub.heads(ctx.config) or HEADS.get(timm_hub.architecture(ctx.config)) or max(1, dim // 64)
    check_rotary_heads(FAMILY, dim, heads)
    return heads


def _map_block(keys: Keys, i: int, heads: int) -> None:
    """Block `i` by BLOCK and LAYER_SCALE, its query and key channels in vitpe's pair order; a
    packed `mlp.fc1` (timm's `GluMlp`: twice fc2's input width) split."""
    b = f"blocks.{i}."
    take_qkv(keys, i, FAMILY, lambda t: half_to_adjacent(t, heads))
    keys.map(BLOCK, src=b, dst=b)
    take_fc1(keys, b, packed=is_packed_glu(keys.sd, b))
    keys.map(LAYER_SCALE, src=b, dst=b, params=TENSOR)


def _check_blocks(keys: Keys, layers: list[int], notes: list[str]) -> bool:
    """An MLP input projection in block 0, LayerScale in both branches of every block or none (returns
    whether there is LayerScale); a zero patch-embedding bias where the file has none."""
    if "blocks.0.mlp.fc1_g.weight" not in keys.out and "blocks.0.mlp.fc1.weight" not in keys.out:
        raise CheckpointError(f"{FAMILY}: block 0 lacks mlp.fc1.weight (or fc1_g / fc1_x)")
    zero_bias(keys, "patch_embed.proj", notes, "The patch embedding")
    return check_layer_scale(keys.out, layers, FAMILY)


def _config(out: Mapping[str, Tensor], ctx: Context, depth: int, heads: int, layer_scale: bool, notes: list[str]
            ) -> ViTConfig:
    proj = out["patch_embed.proj.weight"]
    patch = proj.shape[-1]
    size = timm_hub.img_size(ctx.config) or DEFAULT_SIZE
    grid = target_grid(ctx.img_size, (size[0] // patch, size[1] // patch), patch)
    theta = float(timm_hub.model_args(ctx.config).get("rope_temperature", 100.0))
    notes.append(f"timm's DINOv3 rotary embedding: rope_dinov3 with theta {theta:g}; each head's query and key "
                 "channels reordered from timm's (k, k + d/2) rotation pairs to adjacent pairs (the attention is the "
                 "same).")
    gated = "blocks.0.mlp.fc1_g.weight" in out
    reg = out.get("reg_token")
    return ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                     num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0, dim=proj.shape[0],
                     depth=depth, heads=heads,
                     mlp_dim=out[f"blocks.0.mlp.{'fc1_g' if gated else 'fc1'}.weight"].shape[0],
                     qkv_bias="blocks.0.attn.qkv.bias" in out, norm_eps=1e-5, encoding="rope_dinov3",
                     encoding_options={"theta": theta}, reg_tokens=0 if reg is None else reg.shape[1],
                     layer_scale=layer_scale, pool=_read_out(out, ctx.config, ctx.pool, notes),
                     fc_norm="fc_norm.weight" in out, act="silu" if gated else "gelu", mlp="gated" if gated else "mlp")


def _read_out(out: Mapping[str, Tensor], config: Mapping[str, Any], pool: str | None, notes: list[str]) -> str:
    """`pool`, else timm's config.json's `global_pool`, else timm's default for its DINOv3s: the mean."""
    given = pool or timm_hub.arg(config, "global_pool")
    if given in ("token", "avg"):
        return given
    if given:
        raise CheckpointError(f"global_pool {given!r}: vitpe reads timm's DINOv3 out by 'token' or 'avg'")
    notes.append("Read-out: the mean of the patch tokens after `norm` (timm's default for its DINOv3 architectures; "
                 "upstream DINOv3 reads the CLS token: import with --pool token for that).")
    return "avg"
