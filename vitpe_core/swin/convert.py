"""Hugging Face Swin / Swin-V2 weights (`save_pretrained`: `model.safetensors` + `config.json`)
-> a vitpe `SwinTransformer`, exactly.

The layout is transformers' on the hub and in `save_pretrained` (`swin.encoder.layers.S.blocks.I.
attention.self.query`, ...), for `SwinForImageClassification`, `Swinv2ForImageClassification` and
the headless `SwinModel` / `Swinv2Model`; transformers 5's names in memory (`attention.q_proj`,
`attention.relative_position_bias.relative_position_bias_table`, `mlp.fc1`) are read too. The
config decides what the keys cannot: window size, image size (the Swin-V2 windows and the
last stages' single windows depend on it), norms' eps, activation, the CPB's pretrained windows.

Refused, naming the keys or the setting: any key this model does not compute (a masked-image
decoder, a backbone's per-stage norms, ...), an activation other than exact GELU, a Swin-V2 with an
absolute table (transformers cannot run one either), a config that contradicts the weights.
Left out, with a note: the mask token (masked pre-training only) and buffers transformers
recomputes (`relative_position_index`, `relative_coords_table`).

timm's layout (`layers.S.blocks.I.attn.qkv`, merging at the start of a stage, `head.fc`) and
Microsoft's original files are read by timm_layout.py, with timm's own config.json (or
`--img-size` / `--window`) for what their keys do not say; families `timm-swin` / `timm-swinv2`.

Entry points: `is_swin(config_or_keys)` and `import_swin(state_dict, hf_config) -> (model, info)`,
`info` holding what `importers.Imported` records (family, class_names, preprocess, notes,
source_dtype).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch

from ..checkpoint import CheckpointError, clean_state_dict, load_weights
from ..foreign import held_keep, source_dtype, upcast
from .config import SwinConfig, build_windows
from .model import SwinTransformer
from .timm_layout import check_windows, convert as convert_timm, is_timm_swin

MODEL_TYPES = {"swin": 1, "swinv2": 2}
BLOCK_KEY = re.compile(r"(?:^|\.)encoder\.layers\.(\d+)\.blocks\.(\d+)\.(.+)$")
STAGE_KEY = re.compile(r"(?:^|\.)encoder\.layers\.(\d+)\.downsample\.(.+)$")
SWIN_MARKERS = re.compile(r"layers\.\d+\.blocks\.\d+\.attention\.(self\.relative_position_bias_table|"
                          r"relative_position_bias\.relative_position_bias_table|self\.continuous_position_bias_mlp)")
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
CLASSES_FILE = Path(__file__).resolve().parent.parent / "assets" / "imagenet1k_classes.txt"

# block keys (after `attention.self.` / the transformers 5 renames) -> ours under `blocks.I.`
BLOCK_NAMES = {
    "layernorm_before": "norm1", "layernorm_after": "norm2",
    "attention.output.dense": "attn.proj", "attention.o_proj": "attn.proj",
    "intermediate.dense": "mlp.fc1", "mlp.fc1": "mlp.fc1", "output.dense": "mlp.fc2", "mlp.fc2": "mlp.fc2",
    "attention.self.relative_position_bias_table": "attn.relative_position_bias_table",
    "attention.relative_position_bias.relative_position_bias_table": "attn.relative_position_bias_table",
    "attention.self.logit_scale": "attn.logit_scale",
    "attention.self.continuous_position_bias_mlp.0": "attn.cpb_mlp.0",
    "attention.self.continuous_position_bias_mlp.2": "attn.cpb_mlp.2",
}
QKV_NAMES = {"attention.self.query": "q", "attention.self.key": "k", "attention.self.value": "v",
             "attention.q_proj": "q", "attention.k_proj": "k", "attention.v_proj": "v"}
BUFFERS = ("relative_position_index", "relative_coords_table")


def is_swin(config_or_keys: Mapping[str, Any] | Iterable[str] | None) -> bool:
    """Whether a Hugging Face `config.json` (its `model_type`) or a state dict's keys are a Swin
    or Swin-V2 in transformers' layout, or in timm's (or Microsoft's)."""
    if config_or_keys is None:
        return False
    if isinstance(config_or_keys, Mapping) and "model_type" in config_or_keys:
        return config_or_keys.get("model_type") in MODEL_TYPES
    return any(SWIN_MARKERS.search(str(k)) for k in config_or_keys) or is_timm_swin(config_or_keys)


def import_swin(state_dict: Mapping[str, torch.Tensor], hf_config: Mapping[str, Any] | None, *,
                name: str = "Swin state dict", notes: list[str] | None = None,
                class_names: Sequence[str] | None = None, img_size: tuple[int, int] | None = None,
                norm: Mapping[str, Sequence[float]] | None = None, crop_pct: float | None = None,
                window: int | None = None, held: torch.dtype | None = None,
                spent: Mapping[str, torch.Tensor] | None = None) -> tuple[SwinTransformer, dict[str, Any]]:
    """Build the `SwinTransformer` of a transformers Swin / Swin-V2 state dict and load its weights
    strictly (float32; `info["source_dtype"]` is the file's precision, what a checkpoint should
    store). `notes` (appended to, and returned in `info`) says what was left out or assumed;
    `class_names` replace the config's `id2label`; `img_size` (H, W) builds it for another image
    size than the config's (Swin-V2's windows follow it, as transformers' would); `norm`
    (`{"mean": [...], "std": [...]}`) and `crop_pct` override the eval transform.
    timm's layout (and Microsoft's files) are read too (timm_layout.py), with timm's config.json as
    `hf_config` where it lies beside the file; `window`: a timm Swin-V2's window, where it does not.
    The model is built on the meta device and its weights assigned (never held twice): `held`
    (float16 / bfloat16) keeps the layer weights that `held_precision.hold_weights` will hold in
    that precision, and `spent` (the state dict they came from, where the caller owns it) is
    emptied as the float32 copies are made (`foreign.upcast`)."""
    notes = [] if notes is None else notes
    sd = clean_state_dict(state_dict)
    file_dtype = source_dtype(sd)
    timm = is_timm_swin(sd)
    if timm:
        weights, tables, version, cfg_in, family = convert_timm(sd, hf_config, img_size=img_size, window=window,
                                                                notes=notes, name=name)
    else:
        if window is not None:
            raise CheckpointError(f"{name}: --window is for timm-layout Swin-V2 files; a Hugging Face Swin's window "
                                  "is its config.json's")
        cfg_in = dict(hf_config or {})
        if img_size is not None and cfg_in:
            notes.append(f"Built for {img_size[0]}x{img_size[1]} px; config.json says {cfg_in.get('image_size')}.")
            cfg_in["image_size"] = [int(img_size[0]), int(img_size[1])]
        version = _version(sd, cfg_in, name)
        weights, tables = _map_keys(sd, version, notes, name)
        family = "hf-swin" if version == 1 else "hf-swinv2"
    cfg = _config(cfg_in, weights, tables, version, name, notes)
    if timm:
        check_windows(cfg, name)
    with torch.device("meta"):                      # no buffers: every tensor comes from the file
        model = SwinTransformer(cfg, init_weights=False)
    load_weights(model, upcast(weights, spent, held_keep(model, held)), name, assign=True)
    model.eval()
    names = _class_names(cfg.num_classes, cfg_in, class_names, name)
    if names is None and cfg.num_classes:
        notes.append(f"No class names for its {cfg.num_classes} classes: predictions say `class k`.")
    pre = {**IMAGENET, "crop_pct": 0.875, "interpolation": "bicubic"}   # Swin's eval transform (timm, microsoft)
    if "image_mean" in cfg_in and "image_std" in cfg_in:
        pre.update(mean=list(cfg_in["image_mean"]), std=list(cfg_in["image_std"]))
    if isinstance(cfg_in.get("crop_pct"), (int, float)):
        pre["crop_pct"] = float(cfg_in["crop_pct"])
    if cfg_in.get("interpolation") in ("bicubic", "bilinear"):   # timm's pretrained_cfg (timm_layout.py)
        pre["interpolation"] = cfg_in["interpolation"]
    if norm is not None:
        pre.update(mean=list(norm["mean"]), std=list(norm["std"]))
    if crop_pct is not None:
        if not 0.1 <= crop_pct <= 1.0:
            raise CheckpointError(f"crop_pct must lie in [0.1, 1], got {crop_pct}")
        pre["crop_pct"] = float(crop_pct)
    return model, {"family": family, "class_names": names, "preprocess": pre, "notes": notes,
                   "source_dtype": file_dtype}


# ----------------------------------------------------------------------------- keys
def _version(sd: Mapping[str, torch.Tensor], cfg: Mapping[str, Any], name: str) -> int:
    by_keys = 2 if any("continuous_position_bias_mlp" in k for k in sd) else 1
    mt = cfg.get("model_type")
    if mt is not None and mt not in MODEL_TYPES:
        raise CheckpointError(f"{name}: config.json's model_type {mt!r} is not a Swin ({', '.join(MODEL_TYPES)})")
    if mt is not None and MODEL_TYPES[mt] != by_keys:
        raise CheckpointError(f"{name}: config.json says {mt!r} but the weights are a "
                              f"{'Swin-V2 (continuous_position_bias_mlp)' if by_keys == 2 else 'Swin (bias tables)'}")
    return by_keys


def _map_keys(sd: Mapping[str, torch.Tensor], version: int, notes: list[str], name: str
              ) -> tuple[dict[str, torch.Tensor], dict[int, torch.Tensor]]:
    """transformers' keys -> ours; the first block's bias table of each stage (Swin) beside."""
    prefix = next((p for p in ("swin.", "swinv2.") if any(k.startswith(p) for k in sd)), "")
    out: dict[str, torch.Tensor] = {}
    qkv: dict[tuple[int, int, str], dict[str, torch.Tensor]] = {}
    used, dropped = set(), []
    top = {"embeddings.patch_embeddings.projection": "patch_embed.proj", "embeddings.norm": "patch_embed.norm",
           "layernorm": "norm"}
    for k, v in sd.items():
        rest = k[len(prefix):] if k.startswith(prefix) else None
        if k.startswith("classifier."):
            out["head." + k.split(".", 1)[1]] = v
        elif rest is None:
            continue
        elif rest == "embeddings.position_embeddings":
            out["absolute_pos_embed"] = v
        elif rest == "embeddings.mask_token":
            dropped.append(k)
            notes.append("Left out `mask_token` (used only for masked pre-training).")
        elif rest.rsplit(".", 1)[0] in top:
            base, leaf = rest.rsplit(".", 1)
            out[f"{top[base]}.{leaf}"] = v
        elif m := STAGE_KEY.match(rest):
            out[f"layers.{m.group(1)}.downsample.{m.group(2)}"] = v
        elif m := BLOCK_KEY.match(rest):
            s, i, tail = int(m.group(1)), int(m.group(2)), m.group(3)
            if tail.split(".")[-1] in BUFFERS:
                dropped.append(k)
                continue
            base, _, leaf = tail.rpartition(".")
            ours = f"layers.{s}.blocks.{i}."
            if tail in BLOCK_NAMES:
                out[ours + BLOCK_NAMES[tail]] = v
            elif base in QKV_NAMES:
                qkv.setdefault((s, i, leaf), {})[QKV_NAMES[base]] = v
            elif base in BLOCK_NAMES:
                out[ours + BLOCK_NAMES[base] + "." + leaf] = v
            else:
                continue
        else:
            continue
        used.add(k)
    used.update(dropped)
    for (s, i, leaf), parts in qkv.items():
        ours = f"layers.{s}.blocks.{i}.attn."
        if version == 2 and leaf == "bias":
            if "k" in parts:
                raise CheckpointError(f"{name}: a Swin-V2 key with a bias (layers.{s}.blocks.{i}...key.bias); "
                                      "Swin-V2's key has none")
            for p in ("q", "v"):
                if p in parts:
                    out[f"{ours}{p}_bias"] = parts[p]
            continue
        if set(parts) != {"q", "k", "v"}:
            raise CheckpointError(f"{name}: block {s}.{i} has the {leaf} of {sorted(parts)} of query/key/value only")
        out[f"{ours}qkv.{leaf}"] = torch.cat([parts["q"], parts["k"], parts["v"]], 0)
    rest = [k for k in sd if k not in used]
    if rest:
        raise CheckpointError(f"{name}: keys a Swin{'-V2' if version == 2 else ''} classifier does not compute "
                              f"(refused rather than dropped, the outputs would differ): {rest[:8]}"
                              f"{' ...' if len(rest) > 8 else ''}")
    if any(k.endswith(BUFFERS) for k in dropped):
        notes.append("Left out the index buffers transformers recomputes (relative_position_index / "
                     "relative_coords_table); this model recomputes them the same way.")
    tables = {}
    for k, v in out.items():
        if m := re.match(r"layers\.(\d+)\.blocks\.0\.attn\.relative_position_bias_table$", k):
            tables[int(m.group(1))] = v
    return out, tables


# ----------------------------------------------------------------------------- config
def _size(value: Any, what: str, name: str) -> tuple[int, int]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1])
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value), int(value)
    raise CheckpointError(f"{name}: config.json's {what} {value!r} is not a size")


def _config(c: Mapping[str, Any], w: Mapping[str, torch.Tensor], tables: Mapping[int, torch.Tensor], version: int,
            name: str, notes: list[str]) -> SwinConfig:
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
    windows, shifts = build_windows(version, window, (-(-img[0] // patch[0]), -(-img[1] // patch[0])), len(depths))
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


def _class_names(n: int, c: Mapping[str, Any], given: Sequence[str] | None, name: str) -> list[str] | None:
    if given is not None:
        if len(given) != n:
            raise CheckpointError(f"{name}: {len(given)} class names for a head of {n} outputs: give one per class")
        return [str(x) for x in given]
    labels = c.get("id2label")
    if isinstance(labels, dict) and len(labels) == n and n:
        try:
            return [str(labels.get(str(i), labels.get(i))) for i in range(n)]
        except (TypeError, ValueError):
            pass
    if n == 1000 and CLASSES_FILE.is_file():
        return CLASSES_FILE.read_text(encoding="utf-8").splitlines()
    return None


