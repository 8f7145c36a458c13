"""timm's `VisionTransformer` key layout (`blocks.N.attn.qkv.weight`) -> a vitpe ViT.

The shared path of the timm (with timm_clip.py's CLIP- and SigLIP-style layers), Hugging Face
ViT and RoPE-ViT families: those are renamed to timm's keys first (hf_vit.py, rope_vit.py).
What a state dict does not say (heads, the grid of a non-square table, the read-out) comes from
the caller; docs/importing.md has the table.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Mapping

import torch

from ..checkpoint import CheckpointError
from ..config import ViTConfig
from ..encodings.absolute import resample_abs_pos_embed
from . import timm_clip, timm_hub
from .context import Context, Converted
from .keymap import LAYER_SCALE_GAMMA
from .refuse import refuse
from .rope_vit import from_rope_vit, rope_freqs

MAX_IMG_SIDE, MAX_PATCHES = 2048, 4096   # a typed image size must not make the server allocate gigabytes
# family -> the `ape` options of its table's rule at another size, where it is not timm's (bicubic, antialiased: the
# encoding's default): naver-ai/rope-vit's forward resamples with `F.interpolate(mode='bicubic', align_corners=False)`
APE_RULES = {"rope-vit": {"ape_interpolation": "bicubic", "ape_antialias": False}}


class GridUnknownError(CheckpointError):
    """The position table's rows fit no grid the keys can decide: the caller must say which
    (`img_size` in pixels, or `grid` in patches). `table` describes the table (rows, prefix
    tokens) for callers that name their own option in their message."""

    def __init__(self, table: str) -> None:
        self.table = table
        super().__init__(f"{table}; pass --img-size H[xW] (the size the table was trained at) to say which grid "
                         "it covers")


def convert(sd: Mapping[str, torch.Tensor], ctx: Context) -> Converted:
    """timm's keys (and DeiT-III's `models_v2` names) -> weights and config; timm's CLIP- and
    SigLIP-style layers and gated MLPs through timm_clip.py."""
    notes: list[str] = []
    deit3_names = any(LAYER_SCALE_GAMMA.match(k) for k in sd)   # facebookresearch/deit's, naver-ai/rope-vit's
    if deit3_names:
        sd = from_rope_vit(sd)
    refuse(sd, ctx.family)
    sd = drop_foreign(sd, notes)
    extra: dict = {}
    if ctx.family in ("timm", "timm-clip", "timm-siglip"):
        extra, sd, ctx = _timm_vit(sd, ctx, notes)
    cfg, sd = _config_at_a_known_grid(sd, ctx, notes, patches_only=deit3_names, extra=extra)
    if "freqs" in sd:
        sd["rope_freqs"] = rope_freqs(sd.pop("freqs"), cfg.heads)
    if "patch_embed.proj.bias" not in sd:
        sd["patch_embed.proj.bias"] = torch.zeros(cfg.dim)
        notes.append("The patch embedding has no bias in the file; a zero bias is equivalent.")
    return sd, cfg, notes


def _timm_vit(sd: dict[str, torch.Tensor], ctx: Context, notes: list[str]
              ) -> tuple[dict, dict[str, torch.Tensor], Context]:
    """A timm `VisionTransformer`'s CLIP- / SigLIP-style layers (timm_clip.py), and the heads and
    size its timm config.json gives where the caller and the keys do not."""
    extra, sd = timm_clip.vit_layers(sd, ctx.config, act=ctx.act, pool=ctx.pool, notes=notes)
    img_size = ctx.img_size
    if img_size is None and "pos_embed" not in sd:   # no table to read the grid from
        img_size = timm_hub.img_size(ctx.config)
    return extra, sd, dataclasses.replace(ctx, heads=ctx.heads or timm_hub.heads(ctx.config), img_size=img_size)


def _config_at_a_known_grid(sd: dict[str, torch.Tensor], ctx: Context, notes: list[str], *, patches_only: bool,
                            extra: dict) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """`timm_config` at `ctx.img_size`; a non-square table the keys leave open is read at the size
    timm's config.json gives, where one lies beside the file (and resampled to `ctx.img_size` where
    that is another size, as timm's checkpoint filter does for a model created at it)."""
    kw = dict(heads=ctx.heads, pool=ctx.pool, notes=notes, eps=ctx.config.get("layer_norm_eps"),
              patches_only=patches_only, extra=extra)
    try:
        return timm_config(sd, ctx.family, img_size=ctx.img_size, **kw)
    except GridUnknownError:
        trained = timm_hub.img_size(ctx.config)
        if trained is None:
            raise
        if ctx.img_size is None:
            return timm_config(sd, ctx.family, img_size=trained, **kw)
        return timm_config(sd, ctx.family, img_size=ctx.img_size, trained_size=trained, **kw)


def drop_foreign(sd: dict[str, torch.Tensor], notes: list[str]) -> dict[str, torch.Tensor]:
    """Tensors outside every model namespace (e.g. `pretrained_in1k.*` kept beside fine-tuned
    weights, `_notes`) are left out and named; anything inside one stays and must match."""
    model_roots = {"cls_token", "dist_token", "reg_token", "pos_embed", "patch_embed", "blocks", "norm", "fc_norm",
                   "head", "head_dist", "freqs", "mask_token", "norm_pre", "attn_pool"}
    foreign = sorted({k.split(".")[0] for k in sd} - model_roots)
    if foreign:
        notes.append(f"Left out tensors outside the model: {', '.join(f'{r}.*' for r in foreign)}.")
    dropped = {k for k in sd if k.split(".")[0] in foreign}
    if "mask_token" in sd:
        notes.append("Left out `mask_token` (used only for masked pre-training).")
        dropped.add("mask_token")
    return {k: v for k, v in sd.items() if k not in dropped}


def _square(n: int) -> int | None:
    s = math.isqrt(n)
    return s if s * s == n and n > 0 else None


def timm_config(sd: dict[str, torch.Tensor], family: str, *, img_size, heads, pool, notes, eps,
                patches_only: bool = False, extra: dict | None = None, trained_size: tuple[int, int] | None = None
                ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """The config the timm-named `sd` describes, and `sd` with its table resampled to `img_size`.
    `extra`: ViTConfig fields the keys do not decide (timm_clip.py: `pre_norm`, `act`, `mlp`,
    `norm_eps`, and `pool` where the layers or timm's config.json say it). `trained_size`: the
    size the table was trained at, read where neither `img_size` nor a square grid fits its rows."""
    extra = dict(extra or {})
    given_pool, given_eps = extra.pop("pool", None), extra.pop("norm_eps", None)
    proj = _patch_embedding(sd)
    dim, patch = proj.shape[0], proj.shape[-1]
    depth = 1 + max(int(k.split(".")[1]) for k in sd if re.match(r"blocks\.\d+\.", k))
    class_token, dist_token = "cls_token" in sd, "dist_token" in sd
    reg = sd["reg_token"].shape[1] if "reg_token" in sd else 0
    sd, grid, no_embed_class = _table(sd, family, int(class_token) + int(dist_token) + reg, patch, img_size, notes,
                                      patches_only=patches_only or "blocks.0.ls1.gamma" in sd,
                                      trained_size=trained_size, models_v2=patches_only)
    fc_norm = "fc_norm.weight" in sd
    pool = _pool(pool or given_pool, class_token, fc_norm, notes)
    heads = heads or max(1, dim // 64)
    if dim % heads:
        raise CheckpointError(f"width {dim} is not divisible by {heads} heads: pass --heads")
    head = sd.get("head.weight")
    cfg = ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=proj.shape[1],
                    num_classes=0 if head is None else head.shape[0], dim=dim, depth=depth, heads=heads,
                    mlp_dim=sd["blocks.0.mlp.fc2.weight"].shape[1], qkv_bias="blocks.0.attn.qkv.bias" in sd,
                    norm_eps=eps or given_eps or (1e-12 if family == "hf" else 1e-6),
                    encoding=_encoding(family, sd, "pos_embed" in sd),
                    encoding_options=_encoding_options(family, sd, "pos_embed" in sd),
                    class_token=class_token, dist_token=dist_token, reg_tokens=reg, no_embed_class=no_embed_class,
                    layer_scale="blocks.0.ls1.gamma" in sd, pool=pool, fc_norm=fc_norm, **extra)
    return cfg, sd


def _patch_embedding(sd: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """`patch_embed.proj.weight`, once the keys every timm ViT has are there."""
    need = ["patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc2.weight"]
    missing = [k for k in need if k not in sd]
    if missing:
        raise CheckpointError(f"not a ViT state dict: missing {missing}")
    proj = sd["patch_embed.proj.weight"]
    if proj.ndim != 4 or proj.shape[-1] != proj.shape[-2]:
        raise CheckpointError(f"patch_embed.proj.weight must be (D, C, p, p), got {tuple(proj.shape)}")
    return proj


def _table(sd: dict[str, torch.Tensor], family: str, prefix: int, patch: int, img_size, notes: list[str], *,
           patches_only: bool, trained_size: tuple[int, int] | None = None, models_v2: bool = False
           ) -> tuple[dict[str, torch.Tensor], tuple[int, int], bool]:
    """(`sd` with its table resampled to `img_size`'s grid, that grid, whether the table covers the
    patches only) of a model with `prefix` tokens; the grid is the table's without `img_size`.
    `models_v2`: facebookresearch/deit's `models_v2` names (DeiT-III, RoPE-ViT), whose table never
    has prefix rows (it is added to the patches before the CLS token joins them)."""
    pos = sd.get("pos_embed")
    if pos is None and not ("freqs" in sd or family == "rope-vit"):
        notes.append("No position table and no rotary frequencies: imported as `none` (no position encoding).")
    check_img_size(img_size, patch)
    trained, no_embed_class = _grid(pos, prefix, patch, img_size, patches_only=patches_only, trained_size=trained_size,
                                    models_v2=models_v2)
    grid = trained if img_size is None else (img_size[0] // patch, img_size[1] // patch)
    if grid is None:
        raise CheckpointError("no position table to read the grid from: pass --img-size H[xW]")
    if trained is not None and trained != grid:   # as timm's checkpoint_filter_fn does at a new img_size
        rows = 0 if no_embed_class else prefix
        rule = APE_RULES.get(family)
        mode, antialias = (rule["ape_interpolation"], rule["ape_antialias"]) if rule else ("bicubic", True)
        sd = {**sd, "pos_embed": resample_abs_pos_embed(pos.float(), grid, trained, rows, mode=mode,
                                                        antialias=antialias)}
        notes.append(_resampled_note(family, trained, grid, patch))
    return sd, grid, no_embed_class


def _resampled_note(family: str, trained: tuple[int, int], grid: tuple[int, int], patch: int) -> str:
    if family != "rope-vit":
        return (f"The table was trained on a {trained[0]}x{trained[1]} grid; resampled to "
                f"{grid[0]}x{grid[1]} (bicubic, prefix rows kept apart, as timm does).")
    return (f"The table was trained on a {trained[0]}x{trained[1]} grid; resampled to {grid[0]}x{grid[1]} (bicubic, "
            "not antialiased, as RoPE-ViT's forward does). At an input size other than "
            f"{grid[0] * patch}x{grid[1] * patch} px this model resamples the resampled table where RoPE-ViT resamples "
            f"the trained one (not the same numbers): import at {trained[0] * patch}x{trained[1] * patch} to run at "
            "every size as the original does.")


def _pool(pool: str | None, class_token: bool, fc_norm: bool, notes: list[str]) -> str:
    """The read-out given, else the one the keys suggest (with a note where they cannot tell)."""
    if pool is not None:
        return pool
    if class_token and not fc_norm:
        notes.append("Read-out: the CLS token (timm's default; the keys cannot tell it from average pooling "
                     "without fc_norm: import with pool='avg' if the model was trained so).")
    return "avg" if fc_norm or not class_token else "token"


def _grid(pos: torch.Tensor | None, prefix: int, patch: int, img_size, patches_only: bool,
          trained_size: tuple[int, int] | None = None, models_v2: bool = False
          ) -> tuple[tuple[int, int] | None, bool]:
    """(grid the table was trained on, whether it covers the patches only). A table of
    `prefix + N` or `N` rows (`models_v2`: `N` only); N equal to `img_size`'s grid (non-square
    tables), else square, else equal to `trained_size`'s grid (a non-square table imported at
    another size)."""
    if pos is None:
        return None, False
    if pos.ndim != 3 or pos.shape[0] != 1:
        raise CheckpointError(f"pos_embed must be (1, rows, D), got {tuple(pos.shape)}")
    rows = pos.shape[1]
    if img_size is not None:
        fits = _fits(rows, prefix, (img_size[0] // patch, img_size[1] // patch), models_v2)
        if fits:
            return fits
    # timm's register models, DeiT-III (LayerScale) and RoPE-ViT (`models_v2` names) keep their
    # table for the patches only (no_embed_class); plain ViTs include the prefix rows. Only those
    # readings are tried: any other needs the user's --img-size.
    readings = [0, prefix] if prefix > 1 or patches_only else [prefix]
    for prefix_rows in readings:
        side = _square(rows - prefix_rows) if rows > prefix_rows else None
        if side:
            return (side, side), prefix_rows == 0 and prefix > 0
    trained_grid = (trained_size[0] // patch, trained_size[1] // patch) if trained_size else None
    fits = _fits(rows, prefix, trained_grid, models_v2) if trained_grid else None
    if fits:
        return fits
    raise GridUnknownError(f"pos_embed has {rows} rows with {prefix} prefix token(s): not a square grid of patches")


def _fits(rows: int, prefix: int, grid: tuple[int, int], patches_only: bool = False
          ) -> tuple[tuple[int, int], bool] | None:
    """(`grid`, whether the table covers the patches only) where `rows` are `grid`'s patches with the
    `prefix` rows or without (`patches_only`: without only); None where neither."""
    for prefix_rows in (0,) if patches_only else dict.fromkeys((prefix, 0)):
        if rows - prefix_rows == grid[0] * grid[1]:
            return grid, prefix_rows == 0 and prefix > 0
    return None


def _encoding(family: str, sd: Mapping[str, torch.Tensor], has_table: bool) -> str:
    if family == "rope-vit":
        rope = "rope_mixed" if "freqs" in sd else "rope_axial"
        return rope + ("+ape" if has_table else "")
    return "ape" if has_table else "none"


def _encoding_options(family: str, sd: Mapping[str, torch.Tensor], has_table: bool) -> dict:
    """The table's rule at another size where the family's is not timm's (`APE_RULES`); RoPE-Axial's frequencies
    rounded as RoPE-ViT's `compute_axial_cis` rounds them (`1 / 100^(4k/d)`: rope_axial's `reciprocal`)."""
    options = dict(APE_RULES.get(family, {})) if has_table else {}
    if family == "rope-vit" and "freqs" not in sd:
        options["reciprocal"] = True
    return options


def check_img_size(img_size: tuple[int, int] | None, patch: int) -> None:
    """CheckpointError unless `img_size` (or None) is a multiple of `patch` and not too large."""
    if img_size is None:
        return
    if img_size[0] % patch or img_size[1] % patch:
        raise CheckpointError(f"--img-size {img_size} must be a multiple of the patch size {patch}")
    if max(img_size) > MAX_IMG_SIDE or (img_size[0] // patch) * (img_size[1] // patch) > MAX_PATCHES:
        raise CheckpointError(f"--img-size {img_size} is too large: at most {MAX_IMG_SIDE} px a side and "
                              f"{MAX_PATCHES} patches (attention maps grow with the square of the patch count)")
