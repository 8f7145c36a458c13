"""timm's Swin / Swin-V2 (`SwinTransformer`, `SwinTransformerV2`: `swin_*`, `swinv2_*`) and the
original Microsoft files -> the names of vitpe's `SwinTransformer`, and the Hugging Face-style
config `swin.swin_config` builds it from. Families `timm-swin`, `timm-swinv2`.

timm's names are the model's own (`layers.S.blocks.I.attn.qkv`, `relative_position_bias_table`;
Swin-V2's `q_bias`, `v_bias`, `logit_scale`, `cpb_mlp`), with two differences: timm merges patches
at the *start* of stages 1.. (`layers.S.downsample`, S >= 1), the model (like Microsoft's files
and transformers) at the end of stages ..S-1; and its classifier is `head.fc`. Buffers timm
recomputes (`relative_position_index`, `relative_coords_table`, `attn_mask`, `k_bias`) are left out.

From the keys: depths, heads per stage (the bias tables' columns; Swin-V2: `logit_scale`), the
embedding width, the MLP ratio, qkv biases, and Swin's window per stage (a table of `(2w-1)^2`
rows). From timm's config.json beside the file (timm_hub.py), `--window` or `--img-size`: the image
size (else the architecture name's, else 224, noted) and Swin-V2's window (required: a CPB has no
window in its shape) and pretrained windows (`model_args`, else the `*_window12to16_*` family's,
else none).

Checked exact (`check_windows`, refused otherwise, naming the stage): timm rolls a shifted stage
before padding it to whole windows, transformers (and this model) after; timm clamps each axis
of a window to the grid separately. They agree where no shifted stage needs padding and every
stage's window is square; timm's standard models (224/7, 384/12, Swin-V2 256/8, 256/16, 192/12)
satisfy both. A Swin stage whose window would shrink below its table (another `--img-size`) is
refused too: timm resizes such a table (BEiT's geometric interpolation), this model does not.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from ..checkpoint import CheckpointError
from ..swin.config import SwinConfig, stage_grid
from . import timm_hub
from .context import Context, Converted
from .swin import stage_tables, swin_config

BUFFERS = re.compile(r"\.(relative_position_index|relative_coords_table|attn_mask|k_bias)$")
BLOCK = re.compile(r"^layers\.(\d+)\.blocks\.(\d+)\.(norm1|norm2|attn\.(qkv|proj|cpb_mlp\.[02])|mlp\.fc[12])\."
                   r"(weight|bias)$|^layers\.(\d+)\.blocks\.(\d+)\.attn\.(relative_position_bias_table|q_bias|v_bias|"
                   r"logit_scale)$")
DOWNSAMPLE = re.compile(r"^layers\.(\d+)\.downsample\.(norm\.weight|norm\.bias|reduction\.weight)$")
TOP = {"patch_embed.proj.weight", "patch_embed.proj.bias", "patch_embed.norm.weight", "patch_embed.norm.bias",
       "norm.weight", "norm.bias", "absolute_pos_embed"}


def convert(sd: Mapping[str, torch.Tensor], ctx: Context) -> Converted:
    """The weights in the model's names, checked against timm's windows (`check_windows`), with
    the config `swin.swin_config` builds from what the keys, timm's config.json and the options say."""
    notes: list[str] = []
    version = 2 if ctx.family.endswith("v2") else 1
    weights, native = _map_keys(sd, version, notes, ctx.family)
    cfg = swin_config(_hf_like(weights, version, ctx, notes), weights, version, ctx.family, notes)
    check_windows(cfg, ctx.family)
    if not native:
        notes.append("timm's layout: the patch merging at the start of stage s (layers.s.downsample) is the model's "
                     "at the end of stage s-1; head.fc is the head.")
    return weights, cfg, notes


def _hf_like(weights: Mapping[str, torch.Tensor], version: int, ctx: Context, notes: list[str]) -> dict[str, Any]:
    """The Hugging Face-style config `swin_config` reads, from the keys, timm's config.json
    (`ctx.config`) and the options."""
    name, config, img_size, window = ctx.family, ctx.config, ctx.img_size, ctx.window
    stages = 1 + max(int(k.split(".")[1]) for k in weights if k.startswith("layers."))
    depths = [1 + max((int(k.split(".")[3]) for k in weights if k.startswith(f"layers.{s}.blocks.")), default=-1)
              for s in range(stages)]
    proj = weights.get("patch_embed.proj.weight")
    if proj is None or proj.ndim != 4 or 0 in depths:
        raise CheckpointError(f"{name}: no patch embedding (patch_embed.proj.weight) or a stage without blocks")

    def need(key: str) -> torch.Tensor:
        if key not in weights:
            raise CheckpointError(f"{name}: missing {key}")
        return weights[key]

    dims = [need(f"layers.{s}.blocks.0.norm1.weight").shape[0] for s in range(stages)]
    if dims != [proj.shape[0] * 2 ** s for s in range(stages)]:
        raise CheckpointError(f"{name}: stage widths {dims}: vitpe's Swin doubles the width at every stage "
                              f"({proj.shape[0]}, {2 * proj.shape[0]}, ...)")
    heads, tables, ratios = [], stage_tables(weights), set()
    for s in range(stages):
        b = f"layers.{s}.blocks.0.attn."
        if version == 1:
            need(b + "relative_position_bias_table")
        heads.append(int(tables[s].shape[1] if version == 1 else need(b + "logit_scale").shape[0]))
        for i in range(depths[s]):
            ratios.add(need(f"layers.{s}.blocks.{i}.mlp.fc1.weight").shape[0] / dims[s])
    if len(ratios) != 1:
        raise CheckpointError(f"{name}: MLP ratios {sorted(ratios)} differ between stages; vitpe's Swin has one")
    size = img_size or timm_hub.img_size(config) or _name_size(timm_hub.architecture(config))
    if size is None:
        size = (224, 224)
        notes.append("The image size is not in the keys and no timm config.json lies beside the file: built for "
                     "224x224 (pass --img-size for another).")
    w = window or timm_hub.arch_window(config)
    if version == 1:
        table_w = {s: (round(t.shape[0] ** 0.5) + 1) // 2 for s, t in tables.items()}
        w = w or max(table_w.values())
        grid = (-(-size[0] // proj.shape[-1]), -(-size[1] // proj.shape[-1]))
        for s, tw in table_w.items():
            side = min(stage_grid(grid, s))
            if tw != (side if side <= w else w):
                raise CheckpointError(f"{name}: stage {s}'s relative_position_bias_table covers {tw}x{tw} windows; at "
                                      f"{size[0]}x{size[1]} px with {w}x{w} windows it would cover "
                                      f"{min(side, w)}x{min(side, w)}: a window per stage (Swin-S3's) or an image "
                                      "size the tables were not trained at; vitpe's Swin has one window for all "
                                      "stages (pass the training size with --img-size)")
    if w is None:
        raise CheckpointError(f"{name}: a Swin-V2's window is not in its keys (the CPB MLP fits any window) and no "
                              "timm config.json beside the file says it: pass --window N (e.g. 8 for "
                              "swinv2_*_window8_256, 16 for *_window16_256 and *_window12to16_*)")
    return {"depths": depths, "num_heads": heads, "window_size": int(w), "image_size": [int(size[0]), int(size[1])],
            "patch_size": proj.shape[-1], "mlp_ratio": ratios.pop(), "layer_norm_eps": 1e-5, "hidden_act": "gelu",
            "qkv_bias": "layers.0.blocks.0.attn.qkv.bias" in weights or "layers.0.blocks.0.attn.q_bias" in weights,
            "pretrained_window_sizes": list(timm_hub.swinv2_pretrained_windows(config, stages)) if version == 2
            else []}


def _map_keys(sd: Mapping[str, torch.Tensor], version: int, notes: list[str], name: str
              ) -> tuple[dict[str, torch.Tensor], bool]:
    native = "layers.0.downsample.reduction.weight" in sd   # Microsoft's files: merging at the end of a stage
    out, rest, buffers = {}, [], []
    for k, v in sd.items():
        if BUFFERS.search(k):
            buffers.append(k)
        elif k in TOP:
            out[k] = v
        elif k.startswith("head.") and k.split(".")[-1] in ("weight", "bias") and k.count(".") <= 2:
            out["head." + k.split(".")[-1]] = v               # timm's head.fc.*, Microsoft's head.*
        elif m := DOWNSAMPLE.match(k):
            s = int(m.group(1)) - (0 if native else 1)
            if s < 0:
                rest.append(k)
                continue
            out[f"layers.{s}.downsample.{m.group(2)}"] = v
        elif BLOCK.match(k):
            out[k] = v
        else:
            rest.append(k)
    if version == 1:   # Swin-V2's keys in a Swin
        rest += [k for k in out if re.search(r"\.(q_bias|v_bias|logit_scale|cpb_mlp\.\d\.\w+)$", k)]
    else:              # Swin's in a Swin-V2 (its key has no bias; no absolute table)
        rest += [k for k in out if k.endswith(("relative_position_bias_table", "attn.qkv.bias", "absolute_pos_embed"))]
    if rest:
        raise CheckpointError(f"{name}: keys a Swin{'-V2' if version == 2 else ''} in timm's layout does not compute "
                              f"(refused rather than dropped, the outputs would differ): {sorted(rest)[:8]}"
                              f"{' ...' if len(rest) > 8 else ''}")
    if buffers:
        notes.append("Left out the buffers timm recomputes (relative_position_index, relative_coords_table, attn_mask, "
                     "k_bias); this model recomputes them the same way.")
    return out, native


def _name_size(arch: str) -> tuple[int, int] | None:
    m = re.search(r"_(?:\d+to)?(\d+)$", arch)   # swin_tiny_patch4_window7_224, swinv2_*_192to256
    return (int(m.group(1)),) * 2 if m else None


def check_windows(cfg: SwinConfig, name: str) -> None:
    """CheckpointError unless every stage's window and shift are timm's (see the module's docstring)."""
    for s in range(cfg.stages):
        g = stage_grid(cfg.grid, s)
        w, shift = cfg.layout(s, g)
        timm_w = [r if r <= cfg.window_size else cfg.window_size for r in g]
        timm_shift = [0 if r <= tw else cfg.window_size // 2 for r, tw in zip(g, timm_w)]
        if cfg.depths[s] < 2:
            timm_shift, shift = [0, 0], 0   # no odd block: no shifted windows
        if timm_w != [w, w] or timm_shift != [shift, shift]:
            raise CheckpointError(f"{name}: stage {s} ({g[0]}x{g[1]} tokens): timm's windows there are "
                                  f"{timm_w[0]}x{timm_w[1]} shifted by {timm_shift}, this model's {w}x{w} shifted by "
                                  f"{shift}; use an image size whose stages have square windows (--img-size)")
        if shift and (g[0] % w or g[1] % w):
            raise CheckpointError(f"{name}: stage {s} ({g[0]}x{g[1]} tokens) is shifted and padded to whole {w}x{w} "
                                  "windows: timm rolls before padding, this model (as transformers) after, so the "
                                  "outputs would differ; use an image size whose shifted stages fill whole windows "
                                  "(--img-size)")
        if cfg.version == 1 and cfg.stage_windows[s] != w:
            raise CheckpointError(f"{name}: stage {s}'s bias table covers {cfg.stage_windows[s]}x"
                                  f"{cfg.stage_windows[s]} windows, the {g[0]}x{g[1]} grid takes {w}x{w}: timm resizes "
                                  "the table (BEiT's geometric interpolation), this model does not; use the image size "
                                  "the weights were trained at")
