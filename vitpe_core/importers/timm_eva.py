"""EVA-02 in timm's layout (`timm.models.eva.Eva`: `eva02_tiny_*`, `eva02_small_*`) -> a vitpe ViT
with `rope_axial+ape`, a gated MLP (SiLU) and BEiT's query / value biases.

EVA-02 adds a learned table (with a CLS row) and rotates the patch tokens' queries and keys by
timm's `RotaryEmbeddingCat` (θ = 10000; `d/4` frequencies; positions `r·R/H`, `c·C/W` on the
reference grid `ref_feat_shape` (R, C), 16x16 for every `eva02_*`; the CLS token not rotated).
That is `rope_axial` with `theta=10000, ref_grid=(R, C)`, except for the order of the pairs: timm
turns the first `d/4` pairs of a head by the row and the last `d/4` by the column, vitpe the other
way round, so each head's query and key channels swap halves here (a permutation of both, which
leaves every score unchanged). The MLP is timm's packed `GluMlp` (`mlp.fc1` holds gate and
value; the first half gates), split into `fc1_g` / `fc1_x`.

The rotary embedding is a buffer, not in the file, and its reference grid is the architecture's:
timm's `config.json` beside the file must name an `eva02_*` architecture (its `model_args` may
override `ref_feat_shape`). Refused, naming the key: `blocks.N.mlp.norm` (`scale_mlp`: EVA-02
base and large), `blocks.N.attn.norm` (`scale_attn_inner`: the EVA-02 CLIP towers), q/k norms,
separate `q_proj`/`k_proj`/`v_proj` (only the base and large models have them, refused above).
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from . import timm_hub
from ._hf import resample_table, target_grid
from .context import Context, Converted
from .keymap import TENSOR, Keys, check_rotary_heads, is_packed_glu
from .refuse import refuse
from .timm_beit import LAYER_SCALE, MASK_TOKEN, TOP, read_out, take_embedding, take_fc1, take_qkv, trained_grid

FAMILY = "timm-eva02"
REF_GRID = (16, 16)   # ref_feat_shape of every eva02_* architecture in timm 1.0.31 (224 / 14)
BLOCK = {n: n for n in ("norm1", "norm2", "attn.proj", "mlp.fc2")}   # and the packed mlp.fc1, split (take_fc1)
DROP = {**MASK_TOKEN,
        r"^blocks\.\d+\.attn\.k_bias$": None,   # a zero buffer older files keep
        r"^rope\.": "Left out the rotary embedding's stored sines and cosines (`rope.*`), which are recomputed."}


def is_eva02(config: Mapping[str, Any] | None) -> bool:
    return timm_hub.architecture(config).startswith("eva02_")


def swap_halves(w: Tensor, heads: int) -> Tensor:
    """Rows of a `(h·d, ...)` query or key projection with each head's two halves swapped."""
    d = w.shape[0] // heads
    idx = torch.cat([torch.cat((torch.arange(d // 2, d), torch.arange(d // 2))) + h * d for h in range(heads)])
    return w[idx]


def convert(sd: Mapping[str, Tensor], ctx: Context) -> Converted:
    notes: list[str] = []
    _refuse(sd, ctx.config)
    keys, pos = _map_top(sd, notes)
    proj = keys.out["patch_embed.proj.weight"]
    trained = trained_grid(ctx.config, proj.shape[-1], pos, None, ctx.img_size, FAMILY)
    grid = target_grid(ctx.img_size, trained, proj.shape[-1])
    heads = ctx.heads or timm_hub.heads(ctx.config) or max(1, proj.shape[0] // 64)
    check_rotary_heads(FAMILY, proj.shape[0], heads)
    layers = keys.layers(r"blocks\.(\d+)\.")
    for i in layers:
        _map_block(keys, i, heads)
    keys.refuse_rest()
    keys.out["pos_embed"] = resample_table(pos, grid, trained, 1, notes, antialias=True, who="as timm does")
    return keys.out, _config(keys.out, ctx, grid, len(layers), heads, notes), notes


def _refuse(sd: Mapping[str, Tensor], config: Mapping[str, Any]) -> None:
    """CheckpointError unless timm's config.json names an EVA-02 and the keys are its tiny / small layout."""
    if not is_eva02(config):
        arch = timm_hub.architecture(config)
        raise CheckpointError(f"{FAMILY}: timm's Eva computes a rotary embedding that is not in the file; its "
                              "reference grid is the architecture's: put timm's config.json (architecture eva02_*) "
                              f"beside the file{f' (it names {arch!r})' if arch else ''}")
    refuse(sd, FAMILY)
    if not is_packed_glu(sd):
        raise CheckpointError(f"{FAMILY}: blocks.0.mlp.fc1.weight is not a packed SwiGLU (twice fc2's input width): "
                              "not the EVA-02 tiny / small layout vitpe maps")


def _map_top(sd: Mapping[str, Tensor], notes: list[str]) -> tuple[Keys, Tensor]:
    """The keys outside the blocks (TOP, DROP); the position table, which every EVA-02 has."""
    keys = Keys(sd, FAMILY)
    take_embedding(keys, FAMILY)
    pos = keys.get("pos_embed")
    if pos is None:
        raise CheckpointError(f"{FAMILY}: no pos_embed; every EVA-02 has one beside its rotary embedding")
    keys.drop_all(DROP, notes)
    keys.map(TOP)
    return keys, pos


def _map_block(keys: Keys, i: int, heads: int) -> None:
    """Block `i` by BLOCK and LAYER_SCALE, its query and key channels in vitpe's pair order."""
    b = f"blocks.{i}."
    take_qkv(keys, i, FAMILY, lambda t: swap_halves(t, heads), biases_required=True)
    keys.map(BLOCK, src=b, dst=b)
    take_fc1(keys, b, packed=True)
    keys.map(LAYER_SCALE, src=b, dst=b, params=TENSOR)


def _config(out: Mapping[str, Tensor], ctx: Context, grid: tuple[int, int], depth: int, heads: int,
            notes: list[str]) -> ViTConfig:
    ref = timm_hub.model_args(ctx.config).get("ref_feat_shape") or REF_GRID
    ref = (int(ref[0]), int(ref[-1])) if isinstance(ref, (list, tuple)) else (int(ref), int(ref))
    notes.append(f"EVA-02's rotary embedding: rope_axial with theta 10000 on the {ref[0]}x{ref[1]} reference grid "
                 "(ref_feat_shape); each head's query and key channels swap halves (timm turns the row pairs first), "
                 "which leaves every score unchanged.")
    proj = out["patch_embed.proj.weight"]
    patch = proj.shape[-1]
    return ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                     num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0, dim=proj.shape[0],
                     depth=depth, heads=heads, mlp_dim=out["blocks.0.mlp.fc2.weight"].shape[1], norm_eps=1e-6,
                     encoding="rope_axial+ape", encoding_options={"theta": 10000.0, "ref_grid": list(ref)},
                     layer_scale="blocks.0.ls1.gamma" in out, pool=read_out(out, ctx.config, ctx.pool, notes),
                     fc_norm="fc_norm.weight" in out, act="silu", mlp="gated")
