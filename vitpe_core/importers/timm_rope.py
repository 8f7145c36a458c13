"""timm's port of naver-ai/rope-vit (`timm.models.eva.Eva`: `vit_{small,base,large}_patch16_rope_224`,
`*_rope_ape_224`, `*_rope_mixed_224`, `*_rope_mixed_ape_224`) -> a vitpe ViT with `rope_axial` /
`rope_mixed` (`+ape`), the encodings the original's own files import to (rope_vit.py).

timm builds these with `attn_type='rope'` (`AttentionRope`: one `attn.qkv` with its bias),
`rope_grid_indexing='xy'` and no grid offset, and rotates the adjacent channel pairs `(2k, 2k+1)`
(`rope_rotate_half=False`) of the patch tokens only (the CLS token is not rotated):

* axial (`rope_type='cat'`, `RotaryEmbeddingCat`, `rope_temperature` 100): positions are the integer
  patch indices; 'xy' puts the column first, so the first `d/4` pairs turn by `c·θ_k` and the last
  `d/4` by `r·θ_k`, `θ_k = T^(−k/(d/4))`: `rope_axial` with `theta=T`, channel for channel;
* mixed (`rope_type='mixed'`, `RotaryEmbeddingMixed`): pair `k` of head `h` in block `l` turns by
  `c·fx + r·fy` with the learned `rope.freqs (2, depth, heads, d/2)` = (fx, fy): `rope_mixed`'s
  `rope_freqs (depth, 2, heads, d/2)` is the same tensor with its first two axes swapped.

No query or key channel is reordered. `*_ape_*` adds a patches-only table (`no_embed_class=True`),
resampled at another size by timm's rule (bicubic, antialiased: at import for `img_size=`, as timm's
`checkpoint_filter_fn` does, and at run time, as `dynamic_img_size=True` does). Keys: `cls_token`,
`pos_embed`, `patch_embed.proj`, `gamma_1` / `gamma_2` (LayerScale), `norm1`, `norm2`, `mlp.fc1`,
`mlp.fc2` (exact GELU), LayerNorm eps 1e-6, `norm` and the CLS token (`global_pool='token'`).

The axial rotary embedding is a buffer, not in the file, and its keys are those of the original's
RoPE-Axial: timm's `config.json` beside the file names the architecture (detect.py); without it an
axial file reads as `rope-vit`, which computes the same except the table's rule at another size.
The mixed port's `rope.freqs` says what it is without one. What vitpe does not compute is refused
(refuse.py): another `rope_type`, grid offset or indexing, the half layout, a reference grid,
registers, post-norm blocks, query / key norms, a norm before the blocks or inside the MLP.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from . import timm_hub
from ._hf import resample_table, target_grid
from .context import Context, Converted
from .keymap import TENSOR, Keys, check_layer_scale, check_rotary_heads, zero_bias
from .refuse import refuse
from .timm_beit import LAYER_SCALE, MASK_TOKEN, TOP, read_out, take_embedding

FAMILY = "timm-rope-vit"
ARCH = r"^vit_\w+_patch\d+_rope(_mixed)?(_ape)?_\d+$"   # timm 1.0.31's port; not the `_rope_reg*` models
DEFAULT_SIZE = (224, 224)       # pretrained_cfg input_size of every port architecture in timm 1.0.31
AXIAL_TEMPERATURE = 100.0       # rope_temperature of every axial port architecture (Eva's own default is 10000)
ROPE_TYPES = ("cat", "mixed")   # the axial and the mixed port
FREQS = "rope.freqs"
BLOCK = {n: n for n in ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")}
DROP = {**MASK_TOKEN,
        r"^rope\.(?!freqs$)": "Left out the rotary embedding's stored buffers (`rope.*`), which are recomputed."}


def is_port(config: Mapping[str, Any] | None) -> bool:
    return bool(re.match(ARCH, timm_hub.architecture(config)))


def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    notes: list[str] = []
    mixed = _refuse(sd, ctx.config)
    keys = Keys(sd, FAMILY)
    proj = take_embedding(keys, FAMILY)
    pos, freqs = keys.get("pos_embed"), keys.get(FREQS)
    keys.drop_all(DROP, notes)
    keys.map(TOP)
    layers = keys.layers(r"blocks\.(\d+)\.")
    for i in layers:
        keys.map(BLOCK, src=f"blocks.{i}.", dst=f"blocks.{i}.")
        keys.map(LAYER_SCALE, src=f"blocks.{i}.", dst=f"blocks.{i}.", params=TENSOR)
    keys.refuse_rest()
    _check(keys, layers, notes)
    heads = _heads(ctx, proj.shape[0], freqs)
    if mixed:
        if freqs.shape[1] != len(layers):
            raise CheckpointError(f"{FAMILY}: `{FREQS}` {tuple(freqs.shape)} holds {freqs.shape[1]} blocks' "
                                  f"frequencies for {len(layers)} blocks")
        keys.out["pos_enc.rope_freqs"] = freqs.permute(1, 0, 2, 3).contiguous()   # (depth, 2, heads, d/2)
    patch = proj.shape[-1]
    trained, no_embed_class = _trained(ctx.config, patch, pos)
    grid = target_grid(ctx.img_size, trained, patch)
    if pos is not None:
        keys.out["pos_embed"] = resample_table(pos, grid, trained, 0 if no_embed_class else 1, notes, antialias=True,
                                               who="as timm does")
    return keys.out, _config(keys.out, ctx, grid, len(layers), heads, mixed, no_embed_class, notes), notes


def _refuse(sd: Mapping[str, Tensor], config: Mapping[str, Any]) -> bool:
    """CheckpointError for what vitpe does not compute (refuse.py) or a rotary embedding the keys contradict;
    whether the file is the mixed port (its `rope.freqs`)."""
    refuse(sd, FAMILY, config)
    rope_type = timm_hub.model_args(config).get("rope_type")
    if rope_type is not None and rope_type not in ROPE_TYPES:
        raise CheckpointError(f"{FAMILY}: timm's config.json sets rope_type={rope_type!r}; vitpe computes the port's "
                              f"{' and '.join(map(repr, ROPE_TYPES))} (rope_axial, rope_mixed); refused")
    freqs, arch = sd.get(FREQS), timm_hub.architecture(config)
    mixed = freqs is not None
    said = rope_type or (("mixed" if "_rope_mixed" in arch else "cat") if arch else None)
    if said is not None and (said == "mixed") != mixed:
        raise CheckpointError(f"{FAMILY}: timm's config.json ({arch or 'model_args'}) says RoPE-"
                              f"{'Mixed' if said == 'mixed' else 'Axial'}, but the file {'has' if mixed else 'lacks'} "
                              f"the learned frequencies `{FREQS}`")
    if mixed and (freqs.ndim != 4 or freqs.shape[0] != 2):
        raise CheckpointError(f"{FAMILY}: `{FREQS}` must be (2, depth, heads, head_dim/2), got {tuple(freqs.shape)}")
    return mixed


def _check(keys: Keys, layers: list[int], notes: list[str]) -> None:
    """An MLP in block 0, LayerScale in both branches of every block or none, one final norm; a zero
    patch-embedding bias where the file has none."""
    out = keys.out
    if "blocks.0.mlp.fc1.weight" not in out or "blocks.0.attn.qkv.weight" not in out:
        raise CheckpointError(f"{FAMILY}: block 0 lacks attn.qkv.weight or mlp.fc1.weight")
    check_layer_scale(out, layers, FAMILY)
    if "norm.weight" in out and "fc_norm.weight" in out:
        raise CheckpointError(f"{FAMILY}: both `norm` and `fc_norm` (use_post_transformer_norm with use_fc_norm); "
                              "vitpe's ViT has one or the other")
    zero_bias(keys, "patch_embed.proj", notes, "The patch embedding")


def _heads(ctx: Context, dim: int, freqs: Tensor | None) -> int:
    """`--heads`, else timm's config.json's, else the mixed frequencies' rows, else `dim // 64` (every port
    architecture); checked against the frequencies and for the rotary pairs."""
    heads = ctx.heads or timm_hub.heads(ctx.config) or (freqs.shape[2] if freqs is not None else max(1, dim // 64))
    check_rotary_heads(FAMILY, dim, heads)
    if freqs is not None and tuple(freqs.shape[2:]) != (heads, dim // heads // 2):
        raise CheckpointError(f"{FAMILY}: `{FREQS}` {tuple(freqs.shape)} does not fit {heads} heads of width "
                              f"{dim // heads}")
    return heads


def _trained(config: Mapping[str, Any], patch: int, pos: Tensor | None) -> tuple[tuple[int, int], bool]:
    """(The grid the model was built for: timm's config.json's size, else the square grid of the table, else 224 px;
    whether the table covers the patches only, `no_embed_class`, as every `*_ape_*` port)."""
    size = timm_hub.img_size(config)
    rows = None if pos is None else pos.shape[1]
    if pos is not None and (pos.ndim != 3 or pos.shape[0] != 1):
        raise CheckpointError(f"{FAMILY}: pos_embed must be (1, rows, D), got {tuple(pos.shape)}")
    if size is None and rows is not None:
        for prefix in (0, 1):
            side = int(round((rows - prefix) ** 0.5))
            if side * side == rows - prefix and side:
                return (side, side), prefix == 0
    size = size or DEFAULT_SIZE
    grid = (size[0] // patch, size[1] // patch)
    if rows is None or rows == grid[0] * grid[1]:
        return grid, True
    if rows == grid[0] * grid[1] + 1:
        return grid, False
    raise CheckpointError(f"{FAMILY}: pos_embed has {rows} rows, not the {grid[0]}x{grid[1]} grid of the "
                          f"{size[0]}x{size[1]} px timm's config.json gives (with or without the CLS row)")


def _config(out: Mapping[str, Tensor], ctx: Context, grid: tuple[int, int], depth: int, heads: int, mixed: bool,
            no_embed_class: bool, notes: list[str]) -> ViTConfig:
    proj = out["patch_embed.proj.weight"]
    patch = proj.shape[-1]
    table = "+ape" if "pos_embed" in out else ""
    if mixed:
        encoding, options = "rope_mixed" + table, {}
        notes.append("timm's RoPE-Mixed port: rope_mixed with its learned frequencies (`rope.freqs` (2, depth, heads, "
                     "d/2) as rope_freqs (depth, 2, heads, d/2)); column and row as timm's 'xy' grid gives them.")
    else:
        theta = float(timm_hub.model_args(ctx.config).get("rope_temperature", AXIAL_TEMPERATURE))
        encoding, options = "rope_axial" + table, {"theta": theta, "reciprocal": True}
        notes.append(f"timm's RoPE-Axial port: rope_axial with theta {theta:g} (rope_temperature), its frequencies "
                     "rounded as timm's (1 / theta^(k/(d/4))); the column pairs first, as timm's 'xy' grid turns them.")
    return ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                     num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0, dim=proj.shape[0],
                     depth=depth, heads=heads, mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0],
                     qkv_bias="blocks.0.attn.qkv.bias" in out, norm_eps=1e-6, encoding=encoding,
                     encoding_options=options, no_embed_class=no_embed_class and bool(table),
                     layer_scale="blocks.0.ls1.gamma" in out, pool=read_out(out, ctx.config, ctx.pool, notes),
                     fc_norm="fc_norm.weight" in out, final_norm="norm.weight" in out or "fc_norm.weight" in out,
                     act="gelu")
