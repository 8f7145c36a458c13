"""Bring your own ViT: turn a pretrained state dict into an ordinary vitpe model and checkpoint.

Families (detected from the keys with `family="auto"`):

* `timm` — timm's `VisionTransformer` and its relatives in timm key names: with or without a
  class token (`class_token=False`, average pooling, `fc_norm`), `no_embed_class` tables
  (patches only), register tokens (`reg_token`), LayerScale (`ls1.gamma`), `qkv_bias` on or
  off, any patch and image size, non-square grids; DeiT distilled (`dist_token`, `head_dist`,
  the two heads averaged as timm does at eval); DeiT-III; DINOv2-style models (registers,
  a table trained at another size: pass `img_size` to run at yours).
* `hf` — Hugging Face transformers `ViTModel` / `ViTForImageClassification`
  (`vit.embeddings.*`, separate query/key/value; a `config.json` gives heads, eps, labels).
* `rope-vit` — naver-ai/rope-vit's DeiT-III models (`models_v2` names: `gamma_1`, `freqs`):
  RoPE-Axial into `rope_axial`, RoPE-Mixed into `rope_mixed` (`+ape` when they carry a table).

Nothing is imported that would compute something else: an unknown layer (q/k norms, a
pre-norm, attention pooling, SwiGLU, ...), an unknown or missing key, or a layout the keys
cannot decide is refused with the keys that decided it. Reading never runs code from the
file (`foreign.read_state_dict`). docs/importing.md lists what maps to what.

Arrows: importers -> foreign -> checkpoint -> model; checkpoint knows only vitpe's own format.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from .checkpoint import CheckpointError, clean_state_dict, load_weights, save_checkpoint
from .config import ViTConfig
from .encodings.absolute import resample_abs_pos_embed
from .foreign import read_state_dict
from .model import ViT

FAMILIES = ("timm", "hf", "rope-vit")
MAX_IMG_SIDE, MAX_PATCHES = 2048, 4096   # a typed image size must not make the server allocate gigabytes
ASSETS = Path(__file__).resolve().parent / "assets"

# Eval transforms, as timm's `resolve_data_config` gives them for each family's usual weights.
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
INCEPTION = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}
NORMS = {"imagenet": IMAGENET, "inception": INCEPTION}
DEFAULT_PREPROCESS = {   # family -> normalisation and centre-crop fraction (resize shorter side to size / crop_pct)
    "timm": {**IMAGENET, "crop_pct": 0.875, "interpolation": "bicubic"},
    "hf": {**INCEPTION, "crop_pct": 1.0, "interpolation": "bilinear"},
    "rope-vit": {**IMAGENET, "crop_pct": 1.0, "interpolation": "bicubic"},
}

# Layers vitpe's ViT does not have: importing without them would compute something else.
UNSUPPORTED = {
    r"\.attn\.(q_norm|k_norm)\.": "query/key normalisation (qk_norm)",
    r"^norm_pre\.": "a pre-norm before the blocks (CLIP-style)",
    r"^attn_pool\.": "attention pooling (global_pool='map')",
    r"\.mlp\.(fc1_g|fc1_x|w12|w3)\.": "a gated MLP (SwiGLU)",
    r"\.mlp\.norm\.": "a norm inside the MLP (scale_mlp_norm)",
    r"\.attn\.norm\.": "a norm inside attention (scale_attn_norm)",
    r"^patch_embed\.norm\.": "a norm after the patch embedding",
    r"^head\.fc\.|^head_drop": "a multi-layer head",
}


class GridUnknownError(CheckpointError):
    """The position table's rows fit no grid the keys can decide: the caller must say which
    (`img_size` in pixels, or `grid` in patches). `table` describes the table (rows, prefix
    tokens) for callers that name their own option in their message."""

    def __init__(self, table: str) -> None:
        self.table = table
        super().__init__(f"{table}; pass --img-size H[xW] (the size the table was trained at) to say which grid "
                         "it covers")


@dataclass
class Imported:
    """An imported model and what the checkpoint records about it."""

    model: ViT
    family: str
    class_names: list[str] | None = None
    preprocess: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    source_dtype: torch.dtype = torch.float32   # the file's floating precision: what the checkpoint stores

    def metrics(self, source: str, licence: str = "") -> dict[str, Any]:
        n = self.model.cfg.num_classes
        return {"source": source, "family": self.family, "licence": licence, "imported": True,
                "class_names": self.class_names or [f"class {i}" for i in range(n)],
                "preprocess": self.preprocess, "notes": " ".join(self.notes),
                "source_dtype": str(self.source_dtype).removeprefix("torch."),
                "parameters": sum(p.numel() for p in self.model.parameters())}


# ----------------------------------------------------------------------------- detection
def detect_family(sd: Mapping[str, torch.Tensor]) -> str:
    """The family whose key layout `sd` has; CheckpointError naming the deciding keys otherwise."""
    keys = list(sd)
    hf = [k for k in keys if k.startswith(("vit.embeddings.", "embeddings.patch_embeddings.",
                                           "embeddings.position_embeddings"))]
    rope = [k for k in keys if re.match(r"blocks\.\d+\.gamma_[12]$", k) or k == "freqs"]
    timm = [k for k in keys if re.match(r"blocks\.\d+\.attn\.qkv\.weight$", k)]
    found = {"hf": hf, "rope-vit": rope, "timm": timm if not rope else []}
    hits = [f for f, ks in found.items() if ks]
    if len(hits) == 1:
        family = hits[0]
        if family == "rope-vit" and "freqs" not in sd and "pos_embed" in sd:
            raise CheckpointError(
                "ambiguous layout: DeiT-III names (`blocks.N.gamma_1`) with a `pos_embed` and no `freqs` are either "
                "RoPE-ViT's RoPE-Axial + APE or a plain DeiT-III from facebookresearch/deit; pass --family rope-vit "
                "(rotary axial + table) or --family timm (table only)")
        return family
    if not hits:
        raise CheckpointError(f"unknown layout: none of the keys names a timm ViT (`blocks.N.attn.qkv.weight`), a "
                              f"Hugging Face ViT (`vit.embeddings.*`) or a RoPE-ViT (`blocks.N.gamma_1`, `freqs`); "
                              f"first keys: {keys[:6]}")
    raise CheckpointError(f"ambiguous layout: keys of several families ({', '.join(hits)}): "
                          + "; ".join(f"{f}: {found[f][:3]}" for f in hits) + ". Pass --family")


# ----------------------------------------------------------------------------- the one importer
def import_state_dict(state_dict: Mapping[str, torch.Tensor], *, family: str = "auto",
                      img_size: tuple[int, int] | None = None, heads: int | None = None,
                      hf_config: Mapping[str, Any] | None = None, pool: str | None = None,
                      norm: str | None = None, crop_pct: float | None = None,
                      grid: tuple[int, int] | None = None, class_names: Sequence[str] | None = None,
                      labels_name: str = "the labels file") -> Imported:
    """Build the vitpe model of `state_dict` and load its weights (strictly).

    `heads`: the state dict does not record it; default `hf_config`'s, else `dim // 64`
    (every standard timm / HF ViT). `img_size` (H, W) in pixels: needed only when the
    table's shape leaves the grid ambiguous, or to run a model at another size (the table is
    resampled as timm does); or `grid` (rows, columns) in patches instead. `pool`:
    "token"/"avg", only where the keys cannot tell.
    `norm` ("imagenet"/"inception") and `crop_pct` override the family's eval transform.
    `class_names` (one per class of the head, in its order; `labels_name` says where they came
    from in errors) replace the ones the config or the class count gives (`_class_names`)."""
    sd = {k: v for k, v in clean_state_dict(state_dict).items()}
    source_dtype = _source_dtype(sd)
    family = detect_family(sd) if family == "auto" else family
    if family not in FAMILIES:
        raise CheckpointError(f"unknown family {family!r}; valid: auto, {', '.join(FAMILIES)}")
    notes: list[str] = []
    if family == "hf":
        sd, hf_cfg = _from_hf(sd, hf_config or {}, notes)
        heads = heads or hf_cfg.get("heads")
        if img_size is None and grid is None and hf_cfg.get("image_size"):   # the size its table was trained at
            size = hf_cfg["image_size"]
            img_size = tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
    models_v2 = any(re.match(r"blocks\.\d+\.gamma_[12]$", k) for k in sd)   # facebookresearch/deit names
    if models_v2:
        sd = _from_rope_vit(sd, notes)
    _refuse_unsupported(sd)
    sd = _drop_foreign(sd, notes)
    if grid is not None and img_size is None and "patch_embed.proj.weight" in sd:
        patch = sd["patch_embed.proj.weight"].shape[-1]
        img_size = (grid[0] * patch, grid[1] * patch)
    cfg, sd = _timm_config(sd, family, img_size=img_size, heads=heads, pool=pool, notes=notes,
                           eps=(hf_config or {}).get("layer_norm_eps"), models_v2=models_v2)
    model = ViT(cfg)
    weights = {k: v.float() for k, v in sd.items()}
    if "freqs" in weights:
        weights["rope_freqs"] = rope_freqs(weights.pop("freqs"), cfg.heads)
    _place_encoding_params(model, weights)
    if "patch_embed.proj.bias" not in weights:
        weights["patch_embed.proj.bias"] = torch.zeros(cfg.dim)
        notes.append("The patch embedding has no bias in the file; a zero bias is equivalent.")
    load_weights(model, weights, f"{family} state dict")
    pre = dict(DEFAULT_PREPROCESS[family])
    if family == "hf" and hf_config and "image_mean" in hf_config:
        pre.update(mean=list(hf_config["image_mean"]), std=list(hf_config["image_std"]))
    if norm:
        if norm not in NORMS:
            raise CheckpointError(f"unknown norm {norm!r}; valid: {sorted(NORMS)}")
        pre.update(NORMS[norm])
    if crop_pct is not None:
        if not 0.1 <= crop_pct <= 1.0:
            raise CheckpointError(f"crop_pct must lie in [0.1, 1], got {crop_pct}")
        pre["crop_pct"] = crop_pct
    names = (_given_class_names(class_names, cfg.num_classes, labels_name) if class_names is not None
             else _class_names(cfg.num_classes, hf_config))
    if names is None and cfg.num_classes:
        notes.append(f"No class names for its {cfg.num_classes} classes: predictions say `class k`. Give a labels "
                     "file (one name per line, or config.json's id2label) to name them.")
    return Imported(model.eval(), family, names, pre, notes, source_dtype)


def _drop_foreign(sd: dict[str, torch.Tensor], notes: list[str]) -> dict[str, torch.Tensor]:
    """Tensors outside every model namespace (e.g. `pretrained_in1k.*` kept beside fine-tuned
    weights, `_notes`) are left out and named; anything inside one stays and must match."""
    model_roots = {"cls_token", "dist_token", "reg_token", "pos_embed", "patch_embed", "blocks", "norm", "fc_norm",
                   "head", "head_dist", "freqs", "mask_token"}
    foreign = sorted({k.split(".")[0] for k in sd} - model_roots)
    if foreign:
        notes.append(f"Left out tensors outside the model: {', '.join(f'{r}.*' for r in foreign)}.")
    dropped = {k for k in sd if k.split(".")[0] in foreign}
    if "mask_token" in sd:
        notes.append("Left out `mask_token` (used only for masked pre-training).")
        dropped.add("mask_token")
    return {k: v for k, v in sd.items() if k not in dropped}


def _refuse_unsupported(sd: Mapping[str, torch.Tensor]) -> None:
    for pattern, what in UNSUPPORTED.items():
        hit = [k for k in sd if re.search(pattern, k)]
        if hit:
            raise CheckpointError(f"this model has {what} ({hit[0]}), which vitpe's ViT does not compute; "
                                  "importing it without would give different outputs, so it is refused")


def _square(n: int) -> int | None:
    s = math.isqrt(n)
    return s if s * s == n and n > 0 else None


def _timm_config(sd: dict[str, torch.Tensor], family: str, *, img_size, heads, pool, notes, eps,
                 models_v2: bool = False) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """The config the timm-named `sd` describes, and `sd` with its table resampled to `img_size`."""
    need = ["patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc1.weight"]
    missing = [k for k in need if k not in sd]
    if missing:
        raise CheckpointError(f"not a ViT state dict: missing {missing}")
    proj = sd["patch_embed.proj.weight"]
    if proj.ndim != 4 or proj.shape[-1] != proj.shape[-2]:
        raise CheckpointError(f"patch_embed.proj.weight must be (D, C, p, p), got {tuple(proj.shape)}")
    dim, in_chans, patch = proj.shape[0], proj.shape[1], proj.shape[-1]
    depth = 1 + max(int(k.split(".")[1]) for k in sd if re.match(r"blocks\.\d+\.", k))
    class_token, dist_token = "cls_token" in sd, "dist_token" in sd
    reg = sd["reg_token"].shape[1] if "reg_token" in sd else 0
    P = int(class_token) + int(dist_token) + reg
    pos = sd.get("pos_embed")
    rope = "freqs" in sd or family == "rope-vit"
    if pos is None and not rope:
        notes.append("No position table and no rotary frequencies: imported as `none` (no position encoding).")
    if img_size is not None and (img_size[0] % patch or img_size[1] % patch):
        raise CheckpointError(f"--img-size {img_size} must be a multiple of the patch size {patch}")
    if img_size is not None and (max(img_size) > MAX_IMG_SIDE or (img_size[0] // patch) * (img_size[1] // patch)
                                 > MAX_PATCHES):
        raise CheckpointError(f"--img-size {img_size} is too large: at most {MAX_IMG_SIDE} px a side and "
                              f"{MAX_PATCHES} patches (attention maps grow with the square of the patch count)")
    table_grid, no_embed_class = _grid(pos, P, patch, img_size,
                                       patches_only=models_v2 or "blocks.0.ls1.gamma" in sd)
    grid = table_grid if img_size is None else (img_size[0] // patch, img_size[1] // patch)
    if grid is None:
        raise CheckpointError("no position table to read the grid from: pass --img-size H[xW]")
    if table_grid is not None and table_grid != grid:   # as timm's checkpoint_filter_fn does at a new img_size
        rows = 0 if no_embed_class else P
        sd = {**sd, "pos_embed": resample_abs_pos_embed(pos.float(), grid, table_grid, rows)}
        notes.append(f"The table was trained on a {table_grid[0]}x{table_grid[1]} grid; resampled to "
                     f"{grid[0]}x{grid[1]} (bicubic, prefix rows kept apart, as timm does).")
    fc_norm = "fc_norm.weight" in sd
    if pool is None:
        pool = "avg" if fc_norm or not class_token else "token"
        if class_token and not fc_norm:
            notes.append("Read-out: the CLS token (timm's default; the keys cannot tell it from average pooling "
                         "without fc_norm: import with pool='avg' if the model was trained so).")
    heads = heads or max(1, dim // 64)
    if dim % heads:
        raise CheckpointError(f"width {dim} is not divisible by {heads} heads: pass --heads")
    head = sd.get("head.weight")
    encoding = _encoding(family, sd, pos is not None)
    cfg = ViTConfig(img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=in_chans,
                    num_classes=0 if head is None else head.shape[0], dim=dim, depth=depth, heads=heads,
                    mlp_dim=sd["blocks.0.mlp.fc1.weight"].shape[0], qkv_bias="blocks.0.attn.qkv.bias" in sd,
                    norm_eps=eps or (1e-12 if family == "hf" else 1e-6), encoding=encoding,
                    class_token=class_token, dist_token=dist_token, reg_tokens=reg, no_embed_class=no_embed_class,
                    layer_scale="blocks.0.ls1.gamma" in sd, pool=pool, fc_norm=fc_norm)
    return cfg, sd


def _grid(pos: torch.Tensor | None, P: int, patch: int, img_size, patches_only: bool
          ) -> tuple[tuple[int, int] | None, bool]:
    """(grid the table was trained on, whether it covers the patches only). A table of
    `P + N` or `N` rows; N square, or equal to `img_size`'s grid (non-square tables)."""
    if pos is None:
        return None, False
    if pos.ndim != 3 or pos.shape[0] != 1:
        raise CheckpointError(f"pos_embed must be (1, rows, D), got {tuple(pos.shape)}")
    rows = pos.shape[1]
    if img_size is not None:
        gh, gw = img_size[0] // patch, img_size[1] // patch
        for prefix_rows in dict.fromkeys((P, 0)):
            if rows - prefix_rows == gh * gw:
                return (gh, gw), prefix_rows == 0 and P > 0
    # timm's register models, DeiT-III (LayerScale) and RoPE-ViT (`models_v2` names) keep their
    # table for the patches only (no_embed_class); plain ViTs include the prefix rows. Only those
    # readings are tried: any other needs the user's --img-size.
    readings = [0, P] if P > 1 or patches_only else [P]
    for pr in readings:
        side = _square(rows - pr) if rows > pr else None
        if side:
            return (side, side), pr == 0 and P > 0
    raise GridUnknownError(f"pos_embed has {rows} rows with {P} prefix token(s): not a square grid of patches")


def _encoding(family: str, sd: Mapping[str, torch.Tensor], has_table: bool) -> str:
    if family == "rope-vit":
        rope = "rope_mixed" if "freqs" in sd else "rope_axial"
        return rope + ("+ape" if has_table else "")
    return "ape" if has_table else "none"


def _place_encoding_params(model: ViT, weights: dict[str, torch.Tensor]) -> None:
    """Move the table and the rotary frequencies to their names inside `pos_enc`."""
    named = dict(model.pos_enc.named_parameters())
    for src, leaf in (("pos_embed", "pos_embed"), ("rope_freqs", "rope_freqs")):
        if src in weights:
            targets = [n for n in named if n.split(".")[-1] == leaf]
            if len(targets) == 1:
                weights["pos_enc." + targets[0]] = weights.pop(src)


def _class_names(n: int, hf_config: Mapping[str, Any] | None) -> list[str] | None:
    labels = (hf_config or {}).get("id2label")
    if isinstance(labels, dict) and len(labels) == n:
        try:
            return [str(labels.get(str(i), labels.get(i))) for i in range(n)]
        except (TypeError, ValueError):
            pass
    if n == 1000:
        return imagenet_classes()
    return None


def _given_class_names(names: Sequence[str], n: int, source: str) -> list[str]:
    if not n:
        raise CheckpointError(f"{source} names {len(names)} classes, but this model has no classification head "
                              "(it puts out features, not classes); import it without labels")
    if len(names) != n:
        raise CheckpointError(f"{source} names {len(names)} classes, but the model's head has {n} outputs: give one "
                              "name per class, in the order of the head's outputs")
    return [str(x) for x in names]


MAX_LABELS_BYTES = 4 * 2**20       # a labels file (ImageNet-21k's names take about 0.5 MB)
MAX_LABEL_CHARS = 200


def parse_labels(text: str, name: str = "the labels file") -> list[str]:
    """Class names from a labels file's text: one name per line, or JSON: `config.json`'s
    `id2label` (`{"0": "tench", ...}`, also inside a whole config.json) or a list of names.
    CheckpointError saying what is wrong (`name` is the file's name in it)."""
    text = text.lstrip("\ufeff")
    stripped = text.strip()
    if not stripped:
        raise CheckpointError(f"{name} is empty: give one class name per line, or JSON such as config.json's "
                              'id2label {"0": "tench", ...}')
    if stripped[0] in "{[":
        try:
            data = json.loads(stripped)
        except ValueError as e:
            raise CheckpointError(f"{name} looks like JSON but does not parse ({e}); give one class name per "
                                  'line, or JSON such as {"0": "tench", "1": "goldfish"}') from None
        if isinstance(data, dict) and isinstance(data.get("id2label"), dict):
            data = data["id2label"]
        if isinstance(data, dict):
            try:
                by_index = {int(k): v for k, v in data.items()}
            except (TypeError, ValueError):
                raise CheckpointError(f"{name}: the JSON's keys must be class indices (\"0\", \"1\", ...), as in "
                                      f"config.json's id2label; got {list(data)[:3]}") from None
            if sorted(by_index) != list(range(len(by_index))):
                raise CheckpointError(f"{name}: the class indices must run from 0 to {len(by_index) - 1} without gaps")
            data = [by_index[i] for i in range(len(by_index))]
        if not isinstance(data, list) or not all(isinstance(x, (str, int, float)) for x in data):
            raise CheckpointError(f"{name}: expected JSON id2label ({{\"0\": \"tench\", ...}}) or a list of names")
        names = [str(x).strip() for x in data]
    else:
        names = [line.strip() for line in text.splitlines()]
        while names and not names[-1]:
            names.pop()
    empty = [i for i, x in enumerate(names) if not x]
    if empty:
        raise CheckpointError(f"{name}: class {empty[0]} has an empty name (line {empty[0] + 1}); give one name per "
                              "class, in the order of the model's outputs")
    long = [x for x in names if len(x) > MAX_LABEL_CHARS]
    if long:
        raise CheckpointError(f"{name}: a class name is longer than {MAX_LABEL_CHARS} characters ({long[0][:40]}…)")
    return names


def read_labels(path: str | Path) -> list[str]:
    """`parse_labels` of a file (UTF-8)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no labels file at {str(path)!r}")
    if path.stat().st_size > MAX_LABELS_BYTES:
        raise CheckpointError(f"{path.name} is larger than {MAX_LABELS_BYTES // 2**20} MiB: not a labels file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{path.name} is not UTF-8 text: give one class name per line, or JSON") from None
    return parse_labels(text, path.name)


def imagenet_classes() -> list[str]:
    """The 1000 ImageNet-1k class names in index order (first WordNet lemma of each synset)."""
    return (ASSETS / "imagenet1k_classes.txt").read_text(encoding="utf-8").splitlines()


# ----------------------------------------------------------------------------- other families -> timm names
HF4_LAYER = {"q": "attention.attention.query", "k": "attention.attention.key", "v": "attention.attention.value",
             "o": "attention.output.dense", "norm1": "layernorm_before", "norm2": "layernorm_after",
             "fc1": "intermediate.dense", "fc2": "output.dense"}
HF5_LAYER = {"q": "attention.q_proj", "k": "attention.k_proj", "v": "attention.v_proj", "o": "attention.o_proj",
             "norm1": "layernorm_before", "norm2": "layernorm_after", "fc1": "mlp.fc1", "fc2": "mlp.fc2"}


def _from_hf(sd: dict[str, torch.Tensor], config: Mapping[str, Any], notes: list[str]
             ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Hugging Face `ViTModel` / `ViTForImageClassification` keys -> timm keys."""
    if config.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"hidden_act {config['hidden_act']!r}: only 'gelu' (exact) is supported")
    pre = "vit." if any(k.startswith("vit.") for k in sd) else ""
    out, used = {}, set()

    def take(src: str, dst: str) -> None:
        if src in sd:
            out[dst] = sd[src]
            used.add(src)

    take(f"{pre}embeddings.cls_token", "cls_token")
    take(f"{pre}embeddings.position_embeddings", "pos_embed")
    take(f"{pre}embeddings.mask_token", "mask_token")
    for p in ("weight", "bias"):
        take(f"{pre}embeddings.patch_embeddings.projection.{p}", f"patch_embed.proj.{p}")
        take(f"{pre}layernorm.{p}", f"norm.{p}")
        take(f"classifier.{p}", f"head.{p}")
    # Files on the hub (transformers 4) name layers `encoder.layer.N.*`; transformers 5 `layers.N.*`.
    layer_re = rf"{re.escape(pre)}(?:encoder\.layer|layers)\.(\d+)\."
    layers = sorted({int(m.group(1)) for k in sd if (m := re.match(layer_re, k))})
    for i in layers:
        for src, names in ((f"{pre}encoder.layer.{i}.", HF4_LAYER), (f"{pre}layers.{i}.", HF5_LAYER)):
            for p in ("weight", "bias"):
                qkv = [sd.get(f"{src}{names[n]}.{p}") for n in ("q", "k", "v")]
                if all(t is not None for t in qkv):
                    out[f"blocks.{i}.attn.qkv.{p}"] = torch.cat(qkv, 0)
                    used.update(f"{src}{names[n]}.{p}" for n in ("q", "k", "v"))
                for ours, theirs in (("attn.proj", "o"), ("norm1", "norm1"), ("norm2", "norm2"),
                                     ("mlp.fc1", "fc1"), ("mlp.fc2", "fc2")):
                    take(f"{src}{names[theirs]}.{p}", f"blocks.{i}.{ours}.{p}")
    pooler = [k for k in sd if k.startswith(f"{pre}pooler.")]
    if pooler:
        used |= set(pooler)
        notes.append("Left out the Hugging Face pooler (dense + tanh), which ViTForImageClassification does not use.")
    rest = sorted(set(sd) - used)
    if rest:
        raise CheckpointError(f"Hugging Face ViT keys vitpe cannot place: {rest[:6]}")
    return out, {"heads": config.get("num_attention_heads"), "image_size": config.get("image_size")}


def _from_rope_vit(sd: dict[str, torch.Tensor], notes: list[str]) -> dict[str, torch.Tensor]:
    """facebookresearch/deit `models_v2` names (DeiT-III, and naver-ai/rope-vit built on it) ->
    timm names; RoPE-Mixed's `freqs` stay for `rope_freqs` once the heads are known."""
    out = {}
    for k, v in sd.items():
        m = re.match(r"(blocks\.\d+)\.gamma_([12])$", k)
        if m:
            out[f"{m.group(1)}.ls{m.group(2)}.gamma"] = v
        elif k in ("freqs_t_x", "freqs_t_y"):
            continue   # integer positions of the training grid: recomputed for every grid
        else:
            out[k] = v
    if "freqs" in out:
        f = out.pop("freqs")
        if f.ndim != 3 or f.shape[0] != 2:
            raise CheckpointError(f"RoPE-Mixed `freqs` must be (2, depth, heads*d/2), got {tuple(f.shape)}")
        out["freqs"] = f   # reshaped once the number of heads is known (_rope_freqs)
    if "pos_embed" in out:
        notes.append("RoPE-ViT resamples its table without antialiasing; vitpe resamples as timm does "
                     "(antialiased bicubic): identical at the training size, slightly smoother when shrunk.")
    return out


def rope_freqs(freqs: torch.Tensor, heads: int) -> torch.Tensor:
    """RoPE-ViT's `(2, L, h*d/2)` learned frequencies -> vitpe's `rope_freqs (L, 2, h, d/2)`."""
    two, L, hd = freqs.shape
    if hd % heads:
        raise CheckpointError(f"freqs width {hd} is not divisible by {heads} heads: pass --heads")
    return freqs.reshape(2, L, heads, hd // heads).permute(1, 0, 2, 3).contiguous()


# ----------------------------------------------------------------------------- files and the CLI
def parse_size(text: str | None) -> tuple[int, int] | None:
    """"224" or "224x320" (height x width) -> (H, W)."""
    if text is None:
        return None
    try:
        parts = [int(p) for p in str(text).lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2 or min(parts) < 1:
        raise CheckpointError(f"expected an image size such as 224 or 224x320, got {text!r}")
    return parts[0], parts[1]


HUB_HINT = ("`{source}` is not a file here. Hugging Face hub ids are fetched through the optional "
            "`huggingface_hub` package where a network exists; otherwise download `model.safetensors` (and "
            "`config.json`) from https://huggingface.co/{source}/tree/main and pass the file's path.")


def resolve_source(source: str) -> tuple[Path, dict[str, Any] | None]:
    """A local weights file (and the HF `config.json` beside it, if any), or a hub id
    downloaded through `huggingface_hub` where that package and a network exist."""
    path = Path(source)
    if path.is_file():
        cfg = path.parent / "config.json"
        pre = path.parent / "preprocessor_config.json"
        config = _read_json(cfg) if cfg.is_file() else None
        if config is not None and pre.is_file():
            config = {**config, **(_read_json(pre) or {})}
        return path, config
    if path.exists() or not re.fullmatch(r"[\w.-]+/[\w.-]+", source):
        raise CheckpointError(f"no weights file at {source!r}")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise CheckpointError(HUB_HINT.format(source=source) + " (`pip install huggingface_hub`)") from None
    try:
        weights = Path(hf_hub_download(source, "model.safetensors"))
        config = _read_json(Path(hf_hub_download(source, "config.json")))
    except Exception as e:   # no network, unknown id, gated repo: say what to do instead
        raise CheckpointError(HUB_HINT.format(source=source) + f" (download failed: {type(e).__name__})") from None
    return weights, config


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def import_file(source: str | Path, *, family: str = "auto", img_size=None, name: str | None = None,
                labels: str | Path | None = None, config_beside: bool = True, **kw) -> Imported:
    """`import_state_dict` of a weights file (.safetensors, .npz, weights-only torch file) or hub id.
    `name`: the file's name in messages (an upload's own, where the bytes sit in a temporary
    file); `labels`: a labels file (`read_labels`) naming the classes; `config_beside=False`
    ignores a `config.json` beside the file (a temporary file's folder is nobody's)."""
    if labels is not None:
        kw["class_names"] = read_labels(labels)
        kw.setdefault("labels_name", Path(labels).name)
    path, config = resolve_source(str(source))
    if not config_beside:
        config = None
    sd = read_state_dict(path, name)
    size = parse_size(img_size) if isinstance(img_size, str) else img_size
    return import_state_dict(sd, family=family, img_size=size, hf_config=config, **kw)


STORED_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _source_dtype(sd: Mapping[str, torch.Tensor]) -> torch.dtype:
    """The widest floating precision among the file's tensors (float32 if it has none)."""
    found = {v.dtype for v in sd.values() if v.is_floating_point()}
    for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        if dtype in found:
            return dtype
    return torch.float32


def import_checkpoint(source: str | Path, out: str | Path, *, licence: str = "", dtype: str = "source",
                      **kw) -> Imported:
    """`import_file` and save it as a vitpe checkpoint (`out` + its JSON sidecar). The weights
    are stored in the file's own precision (`dtype="source"`, the default: the checkpoint is the
    model the file holds, bit for bit), or in `dtype` ("float32"/"float16"/"bfloat16") when
    asked; a float64 file is stored as float32, the precision the model runs in, with a note."""
    imp = import_file(source, **kw)
    if dtype == "source":
        stored = imp.source_dtype
        if stored == torch.float64:
            stored = torch.float32
            imp.notes.append("The file holds float64 weights; the model runs and is stored in float32.")
    elif dtype in STORED_DTYPES:
        stored = STORED_DTYPES[dtype]
        if stored != imp.source_dtype:
            imp.notes.append(f"Stored as {dtype} on request; the file holds "
                             f"{str(imp.source_dtype).removeprefix('torch.')} (the weights are rounded).")
    else:
        raise CheckpointError(f"unknown dtype {dtype!r}; valid: source, {', '.join(STORED_DTYPES)}")
    metrics = imp.metrics(Path(str(source)).name, licence)
    metrics["stored_dtype"] = str(stored).removeprefix("torch.")
    save_checkpoint(out, imp.model, metrics=metrics, dtype=stored)
    return imp
