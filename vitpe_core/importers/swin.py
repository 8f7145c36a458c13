"""Hugging Face Swin / Swin-V2 weights (`save_pretrained`: `model.safetensors` + `config.json`)
-> a vitpe `SwinTransformer` (vitpe_core/swin/), exactly. Families `hf-swin`, `hf-swinv2`.

The layout is transformers' on the hub and in `save_pretrained` (`swin.encoder.layers.S.blocks.I.
attention.self.query`, ...), for `SwinForImageClassification`, `Swinv2ForImageClassification` and
the headless `SwinModel` / `Swinv2Model`; transformers 5's names in memory (`attention.q_proj`,
`attention.relative_position_bias.relative_position_bias_table`, `mlp.fc1`) are read too. The
config decides what the keys cannot: window size, image size (the Swin-V2 windows and the
last stages' single windows depend on it), norms' eps, activation, the CPB's pretrained windows.

Another size: `img_size` builds the model transformers builds for that size (`image_size=`): Swin's
absolute table resampled as `interpolate_pos_encoding=True` does, Swin-V2's windows and shifts those
of that size (a note where they differ from the config's model, which keeps its windows at any
input). An input of another size runs as the config's model does at that size.

Refused, naming the keys or the setting: any key this model does not compute (a masked-image
decoder, a backbone's per-stage norms, ...), an activation other than exact GELU, a Swin-V2 with an
absolute table (transformers cannot run one either), a config that contradicts the weights.
Left out, with a note: the mask token (masked pre-training only) and buffers transformers
recomputes (`relative_position_index`, `relative_coords_table`).

timm's layout (`layers.S.blocks.I.attn.qkv`, merging at the start of a stage, `head.fc`) and
Microsoft's original files are read by timm_swin.py, with timm's own config.json (or
`--img-size` / `--window`) for what their keys do not say, into the config `swin_config` builds.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from ..checkpoint import CheckpointError
from ..encodings.absolute import resample_abs_pos_embed
from ..swin.config import SwinConfig, build_grid, build_windows
from .context import Context, Converted
from .detect import SWIN_MODEL_TYPES
from .keymap import TENSOR, Keys, strip_prefix

TOP = {"patch_embed.proj": "embeddings.patch_embeddings.projection", "patch_embed.norm": "embeddings.norm",
       "norm": "layernorm", "head": ("<head>.classifier", "classifier")}
TOP_TENSORS = {"absolute_pos_embed": "embeddings.position_embeddings"}
BLOCK = {"norm1": "layernorm_before", "norm2": "layernorm_after",
         "attn.proj": ("attention.output.dense", "attention.o_proj"),
         "mlp.fc1": ("intermediate.dense", "mlp.fc1"), "mlp.fc2": ("output.dense", "mlp.fc2"),
         "attn.cpb_mlp.0": "attention.self.continuous_position_bias_mlp.0",
         "attn.cpb_mlp.2": "attention.self.continuous_position_bias_mlp.2"}
BLOCK_TENSORS = {"attn.relative_position_bias_table": ("attention.self.relative_position_bias_table",
                                                       "attention.relative_position_bias.relative_position_bias_table"),
                 "attn.logit_scale": "attention.self.logit_scale"}
QKV = {"q": ("attention.self.query", "attention.q_proj"), "k": ("attention.self.key", "attention.k_proj"),
       "v": ("attention.self.value", "attention.v_proj")}
DOWNSAMPLE = {"norm": "norm", "reduction": "reduction"}
DROP = {r"^embeddings\.mask_token$": "Left out `mask_token` (used only for masked pre-training).",
        r"\.(relative_position_index|relative_coords_table)$": "Left out the index buffers transformers recomputes "
        "(relative_position_index / relative_coords_table); this model recomputes them the same way."}


def convert(sd: Mapping[str, torch.Tensor], ctx: Context) -> Converted:
    notes: list[str] = []
    version = 2 if ctx.family.endswith("v2") else 1
    config = dict(ctx.config)
    if ctx.img_size is not None and config:
        notes.append(f"Built for {ctx.img_size[0]}x{ctx.img_size[1]} px; config.json says {config.get('image_size')}.")
        config["image_size"] = [int(ctx.img_size[0]), int(ctx.img_size[1])]
    model_type = config.get("model_type")
    if model_type is not None and model_type not in SWIN_MODEL_TYPES:
        raise CheckpointError(f"{ctx.family}: config.json's model_type {model_type!r} is not a Swin "
                              f"({', '.join(SWIN_MODEL_TYPES)})")
    if model_type is not None and SWIN_MODEL_TYPES[model_type] != version:
        raise CheckpointError(f"{ctx.family}: config.json says {model_type!r} but the weights are a "
                              f"{'Swin-V2 (continuous_position_bias_mlp)' if version == 2 else 'Swin (bias tables)'}")
    weights = _map_keys(sd, version, notes, ctx.family)
    cfg = swin_config(config, weights, version, ctx.family, notes)
    if ctx.img_size is not None and ctx.config:
        _at_another_size(weights, cfg, ctx.config, version, ctx.family, notes)
    return weights, cfg, notes


def _at_another_size(w: dict[str, torch.Tensor], cfg: SwinConfig, config: Mapping[str, Any], version: int, name: str,
                     notes: list[str]) -> None:
    """Built for `cfg.img_size`, not the config's size: Swin's absolute table resampled (in `w`) as
    `interpolate_pos_encoding=True` does; for Swin-V2, whose windows are fixed when built, a note
    where they differ from those of the config's model run at this size."""
    try:
        trained = swin_config(config, w, version, name, [])
    except CheckpointError:   # the config's own size builds no model: nothing to compare with
        return
    if "absolute_pos_embed" in w and trained.grid != cfg.grid:
        w["absolute_pos_embed"] = resample_abs_pos_embed(w["absolute_pos_embed"], cfg.grid, trained.grid, 0,
                                                         antialias=False)
        notes.append(f"The absolute table was trained on a {trained.grid[0]}x{trained.grid[1]} grid; resampled to "
                     f"{cfg.grid[0]}x{cfg.grid[1]} (bicubic, not antialiased, as transformers' "
                     "interpolate_pos_encoding).")
    if version == 2 and (trained.stage_windows, trained.stage_shifts) != (cfg.stage_windows, cfg.stage_shifts):
        notes.append(f"Swin-V2 fixes its windows when built: at {cfg.img_size[0]}x{cfg.img_size[1]} px windows "
                     f"{list(cfg.stage_windows)}, shifts {list(cfg.stage_shifts)} (transformers' model built for this "
                     f"size), where the config's model keeps {list(trained.stage_windows)}, "
                     f"{list(trained.stage_shifts)} at any input: import without img_size for that one.")


def _map_keys(sd: Mapping[str, torch.Tensor], version: int, notes: list[str], family: str) -> dict[str, torch.Tensor]:
    """transformers' keys -> the model's, by the tables above."""
    stripped, prefix = strip_prefix(sd, ("swin.", "swinv2."))
    keys = Keys(stripped, family, prefix)
    keys.map(TOP)
    keys.map(TOP_TENSORS, params=TENSOR)
    keys.drop_all(DROP, notes)
    for s in keys.layers(r"encoder\.layers\.(\d+)\."):
        keys.map(DOWNSAMPLE, src=f"encoder.layers.{s}.downsample.", dst=f"layers.{s}.downsample.")
        for i in keys.layers(rf"encoder\.layers\.{s}\.blocks\.(\d+)\."):
            src, dst = f"encoder.layers.{s}.blocks.{i}.", f"layers.{s}.blocks.{i}."
            keys.map(BLOCK, src=src, dst=dst)
            keys.map(BLOCK_TENSORS, src=src, dst=dst, params=TENSOR)
            _qkv(keys, src, dst + "attn.", version, f"block {s}.{i}")
    keys.refuse_rest()
    return keys.out


def _qkv(keys: Keys, src: str, dst: str, version: int, where: str) -> None:
    """Separate query / key / value projections -> `qkv`; Swin-V2's biases stay apart (`q_bias`,
    `v_bias`: its key has none)."""
    parts = {leaf: {p: t for p, names in QKV.items() if (t := keys.get(*(f"{src}{n}.{leaf}" for n in names)))
                    is not None} for leaf in ("weight", "bias")}
    if version == 2 and parts["bias"]:
        if "k" in parts["bias"]:
            raise CheckpointError(f"{keys.family}: {where} has a key bias; Swin-V2's key has none")
        for p in ("q", "v"):
            if p in parts["bias"]:
                keys.out[f"{dst}{p}_bias"] = parts["bias"][p]
        del parts["bias"]
    for leaf, found in parts.items():
        if found and set(found) != {"q", "k", "v"}:
            raise CheckpointError(f"{keys.family}: {where} has the {leaf} of {sorted(found)} of query/key/value only")
        if found:
            keys.out[f"{dst}qkv.{leaf}"] = torch.cat([found["q"], found["k"], found["v"]], 0)


# ----------------------------------------------------------------------------- config
def _size(value: Any, what: str, name: str) -> tuple[int, int]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1])
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value), int(value)
    raise CheckpointError(f"{name}: config.json's {what} {value!r} is not a size")


def stage_tables(w: Mapping[str, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Stage -> its first block's relative position bias table (Swin; none in a Swin-V2)."""
    return {int(m.group(1)): v for k, v in w.items()
            if (m := re.match(r"layers\.(\d+)\.blocks\.0\.attn\.relative_position_bias_table$", k))}


def swin_config(c: Mapping[str, Any], w: Mapping[str, torch.Tensor], version: int, name: str, notes: list[str]
                ) -> SwinConfig:
    """The `SwinConfig` of weights `w` (the model's names) and a Hugging Face-style config `c`
    (timm_swin.py writes one for timm's files), checked against each other."""
    tables = stage_tables(w)
    if not c:
        raise CheckpointError(f"{name}: a Swin needs the config.json saved beside its weights (window size, image "
                              "size, depths); put it in the same folder")
    if c.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"{name}: hidden_act {c['hidden_act']!r}: only 'gelu' (exact) is supported")
    proj = w.get("patch_embed.proj.weight")
    if proj is None or proj.ndim != 4:
        raise CheckpointError(f"{name}: no patch embedding (`embeddings.patch_embeddings.projection.weight`)")
    patch = _size(c.get("patch_size", proj.shape[-1]), "patch_size", name)
    if patch[0] != patch[1] or tuple(proj.shape[-2:]) != patch:
        raise CheckpointError(f"{name}: patch_size {patch} (the weights: {tuple(proj.shape[-2:])}); only square "
                              "patches of the weights' size are supported")
    depths = tuple(int(d) for d in c.get("depths", ()))
    found = sorted({int(k.split(".")[1]) for k in w if k.startswith("layers.")})
    if not depths or found != list(range(len(depths))):
        raise CheckpointError(f"{name}: config.json's depths {list(depths)} do not match the weights' stages {found}")
    for s, d in enumerate(depths):
        have = {int(k.split(".")[3]) for k in w if k.startswith(f"layers.{s}.blocks.")}
        if have != set(range(d)):
            raise CheckpointError(f"{name}: stage {s} has blocks {sorted(have)} in the weights, {d} in config.json")
    window = int(c.get("window_size", 7))
    img = _size(c.get("image_size", 224), "image_size", name)
    windows, shifts = build_windows(version, window, build_grid(img, patch[0], version), len(depths))
    if version == 1 and tables:   # Swin: each stage's window is its table's ((2w-1)^2 rows)
        sides = {s: round(t.shape[0] ** 0.5) for s, t in tables.items()}
        table_w = tuple((sides[s] + 1) // 2 if s in sides else windows[s] for s in range(len(depths)))
        bad = [s for s, t in tables.items() if sides[s] ** 2 != t.shape[0] or sides[s] % 2 == 0 or table_w[s] > window]
        if bad:
            raise CheckpointError(f"{name}: stage {bad[0]}'s relative_position_bias_table has {tables[bad[0]].shape[0]}"
                                  f" rows: not the (2w-1)^2 offsets of a window of at most {window}")
        if table_w != windows:
            notes.append(f"Windows per stage {list(table_w)} (read from the bias tables); at {img[0]}x{img[1]} px "
                         f"the stages' grids give {list(windows)}.")
        windows = table_w
    if version == 2 and c.get("use_absolute_embeddings"):
        raise CheckpointError(f"{name}: a Swin-V2 with use_absolute_embeddings (an {c.get('image_size')}-px table "
                              "of N+1 rows) cannot be computed; transformers' own forward fails on it")
    pws = tuple(int(p) for p in (c.get("pretrained_window_sizes") or ())) if version == 2 else ()
    head = w.get("head.weight")
    try:
        return SwinConfig(version=version, img_size=img, patch_size=patch[0], in_chans=proj.shape[1],
                          num_classes=0 if head is None else head.shape[0], embed_dim=proj.shape[0], depths=depths,
                          num_heads=tuple(int(h) for h in c.get("num_heads", ())), window_size=window,
                          stage_windows=windows, stage_shifts=shifts, pretrained_window_sizes=pws,
                          mlp_ratio=float(c.get("mlp_ratio", 4.0)), qkv_bias=bool(c.get("qkv_bias", True)),
                          norm_eps=float(c.get("layer_norm_eps", 1e-5)),
                          absolute_pos_embed="absolute_pos_embed" in w)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{name}: config.json describes no Swin this model builds: {e}") from None
