"""The one importer: `import_state_dict` turns a state dict of any family into a vitpe model
(strictly loaded), with what the checkpoint records about it (`Imported`)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from ..checkpoint import CheckpointError, clean_state_dict, load_weights
from ..foreign import held_keep, own_memory, source_dtype, upcast
from ..held_precision import HALF, hold_weights
from ..model import ViT, empty_model
from ..swin.convert import import_swin, is_swin
from . import beit, clip, dinov2, dinov3, timm_beit, timm_clip, timm_dinov3, timm_eva, timm_hub
from .detect import FAMILIES, HF_FAMILIES, TIMM_FAMILIES, detect_family
from .hf_vit import from_hf
from .labels import class_names as _class_names, given_class_names
from .rope_vit import from_rope_vit, rope_freqs
from .timm import GridUnknownError, drop_foreign, place_encoding_params, refuse_unsupported, timm_config

# Eval transforms: timm's `resolve_data_config` for timm's usual weights, each HF family's image processor.
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
INCEPTION = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}
CLIP = {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]}
NORMS = {"imagenet": IMAGENET, "inception": INCEPTION, "clip": CLIP}
DEFAULT_PREPROCESS = {   # family -> normalisation and centre-crop fraction (resize shorter side to size / crop_pct)
    "timm": {**IMAGENET, "crop_pct": 0.875, "interpolation": "bicubic"},
    "hf": {**INCEPTION, "crop_pct": 1.0, "interpolation": "bilinear"},
    "rope-vit": {**IMAGENET, "crop_pct": 1.0, "interpolation": "bicubic"},
    "beit": {**INCEPTION, "crop_pct": 1.0, "interpolation": "bicubic"},
    "data2vec-vision": {**INCEPTION, "crop_pct": 1.0, "interpolation": "bicubic"},
    "dinov2": {**IMAGENET, "crop_pct": 0.875, "interpolation": "bicubic"},
    "dinov3": {**IMAGENET, "crop_pct": 1.0, "interpolation": "bilinear"},
    "clip": {**CLIP, "crop_pct": 1.0, "interpolation": "bicubic"},
    "siglip": {**INCEPTION, "crop_pct": 1.0, "interpolation": "bicubic"},
    # timm's layouts of the other families (timm's config.json's pretrained_cfg replaces these where it lies beside)
    "timm-beit": {**INCEPTION, "crop_pct": 0.9, "interpolation": "bicubic"},
    "timm-eva02": {**CLIP, "crop_pct": 0.9, "interpolation": "bicubic"},
    "timm-dinov3": {**IMAGENET, "crop_pct": 1.0, "interpolation": "bicubic"},
    "timm-clip": {**CLIP, "crop_pct": 1.0, "interpolation": "bicubic"},
    "timm-siglip": {**INCEPTION, "crop_pct": 1.0, "interpolation": "bicubic"},
}
CONVERTERS = {"beit": beit.convert, "data2vec-vision": beit.convert, "dinov2": dinov2.convert,
              "dinov3": dinov3.convert, "clip": clip.convert, "siglip": clip.convert}
TIMM_CONVERTERS = {"timm-beit": timm_beit.convert, "timm-eva02": timm_eva.convert,
                   "timm-dinov3": timm_dinov3.convert}
ACT_FAMILIES = ("timm",)   # where --act decides something (timm_clip.py); other families' activation is known


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


def import_state_dict(state_dict: Mapping[str, torch.Tensor], *, family: str = "auto",
                      img_size: tuple[int, int] | None = None, heads: int | None = None,
                      hf_config: Mapping[str, Any] | None = None, pool: str | None = None,
                      norm: str | None = None, crop_pct: float | None = None,
                      grid: tuple[int, int] | None = None, class_names: Sequence[str] | None = None,
                      labels_name: str = "the labels file", act: str | None = None,
                      window: int | None = None, consume: bool = False, hold: bool = False) -> Imported:
    """Build the vitpe model of `state_dict` and load its weights (strictly).

    `heads`: the state dict does not record it; default `hf_config`'s, else `dim // 64`
    (every standard timm / HF ViT). `img_size` (H, W) in pixels: needed only when the
    table's shape leaves the grid ambiguous, or to run a model at another size (the table is
    resampled as timm does); or `grid` (rows, columns) in patches instead. `pool`:
    "token"/"avg", only where the keys cannot tell (timm layout).
    `norm` ("imagenet"/"inception"/"clip") and `crop_pct` override the family's eval transform.
    `class_names` (one per class of the head, in its order; `labels_name` says where they came
    from in errors) replace the ones the config or the class count gives. `act`
    ("gelu"/"gelu_tanh"/"quick_gelu"/"silu"): the MLP activation of a timm `VisionTransformer`,
    which its keys do not record (CLIP- / SigLIP-style files need it, or timm's config.json as
    `hf_config`). `window`: a timm Swin-V2's window, where no timm config.json says it.
    `consume`: `state_dict` is the importer's to spend (`import_file`'s, read from a file; never a
    caller's own): a ViT's tensors are emptied as their float32 copies are made (`upcast`).
    Without it the model shares no memory with `state_dict` (`foreign.own_memory`): changing one
    never changes the other.
    `hold`: a float16 / bfloat16 file's layer weights stay in its precision and are computed in
    float32 (`held_precision`, bit-identical outputs, half the memory): a ViT's are loaded so, and
    never have a float32 copy (the app's imports: a ViT-B/16 in float16 peaked at 165 + 330 MiB)."""
    sd = dict(clean_state_dict(state_dict))
    dtype = source_dtype(sd)
    held = dtype if hold and dtype in HALF else None      # the precision its layer weights are held in
    # Swin / Swin-V2 (hierarchical: their own model class, vitpe_core/swin/), before the key
    # detection: their keys hold `relative_position_bias_table` too, which reads as BEiT's.
    if family in ("auto", "swin") and is_swin(hf_config if hf_config and "model_type" in hf_config else sd):
        if pool is not None or heads is not None or act is not None:
            raise CheckpointError("--pool, --heads and --act are for timm-layout ViTs; a Swin's heads are in its keys "
                                  "(or config.json), its read-out is the mean and its activation GELU "
                                  "(docs/importing.md)")
        if norm and norm not in NORMS:
            raise CheckpointError(f"unknown norm {norm!r}; valid: {sorted(NORMS)}")
        model, info = import_swin(sd, hf_config, notes=[], class_names=class_names, img_size=img_size,
                                  norm=NORMS[norm] if norm else None, crop_pct=crop_pct, window=window,
                                  held=held, spent=sd if consume else None)
        _settle(model, held, None if consume else state_dict)
        return Imported(model.eval(), **info)
    if window is not None:
        raise CheckpointError("--window is for timm Swin-V2 files (its window is not in the keys); this file has "
                              "no Swin keys")
    if family == "swin":
        raise CheckpointError("--family swin: the file has no Swin keys (layers.N.blocks.M.attention...) and "
                              "config.json no swin/swinv2 model_type")
    family = detect_family(sd, hf_config) if family == "auto" else family
    if family not in FAMILIES:
        raise CheckpointError(f"unknown family {family!r}; valid: auto, {', '.join(FAMILIES)}")
    notes: list[str] = []
    if act is not None and family not in ACT_FAMILIES:
        raise CheckpointError(f"--act is for timm-layout ViTs (CLIP- and SigLIP-style, gated MLPs), whose keys do not "
                              f"record it; a {family} model's activation is its config's or its family's")
    if grid is not None and img_size is None:
        patch = _patch_size(sd)
        img_size = (grid[0] * patch, grid[1] * patch) if patch else None
    if family in HF_FAMILIES:
        if pool is not None:
            raise CheckpointError(f"--pool is for bare timm-layout files; a {family} model's read-out is its config's "
                                  "and its keys' (docs/importing.md)")
        cfg, weights, family = CONVERTERS[family](sd, hf_config or {}, img_size=img_size, heads=heads, notes=notes)
        model = empty_model(cfg)           # filled by assignment below: never held twice
        weights = _encoding_names(model, upcast(weights, sd if consume else None, held_keep(model, held)))
    elif family in TIMM_FAMILIES:
        cfg, weights, family = TIMM_CONVERTERS[family](sd, hf_config or {}, img_size=img_size, heads=heads, pool=pool,
                                                       notes=notes)
        model = empty_model(cfg)           # filled by assignment below: never held twice
        weights = _encoding_names(model, upcast(weights, sd if consume else None, held_keep(model, held)))
    else:
        model, weights, family = _timm_model(sd, family, img_size, heads, hf_config, pool, notes, act, consume, held)
    place_encoding_params(model, weights)
    load_weights(model, weights, f"{family} state dict", assign=True)
    _settle(model, held, None if consume else state_dict)
    pre = _preprocess(family, hf_config, norm, crop_pct)
    n = model.cfg.num_classes
    names = (given_class_names(class_names, n, labels_name) if class_names is not None
             else timm_hub.class_names(hf_config, n) or _class_names(n, hf_config))
    if names is None and n:
        notes.append(f"No class names for its {n} classes: predictions say `class k`. Give a labels "
                     "file (one name per line, or config.json's id2label) to name them.")
    return Imported(model.eval(), family, names, pre, notes, dtype)


def _settle(model: torch.nn.Module, held: torch.dtype | None, given: Mapping[str, torch.Tensor] | None) -> None:
    """After the weights are loaded by assignment: hold the layer weights loaded in `held` (and
    float32 ones exact in it), and give the model memory of its own wherever it shares some with
    `given`, a caller's state dict (None: the importer's own, spent), so the caller's tensors stay theirs."""
    if held:
        hold_weights(model, held)
    if given is not None:
        own_memory(model, given)


def _encoding_names(model: ViT, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`pos_enc.<leaf>` -> the one parameter of that leaf name inside the encoding (a composite's
    `pos_enc.parts.0.rel_tables`); other names stay."""
    named = list(model.pos_enc.state_dict())
    out = {}
    for k, v in weights.items():
        leaf = k.removeprefix("pos_enc.")
        targets = [n for n in named if n.split(".")[-1] == leaf] if k.startswith("pos_enc.") else []
        out["pos_enc." + targets[0] if len(targets) == 1 else k] = v
    return out


def _patch_size(sd: Mapping[str, torch.Tensor]) -> int | None:
    for k, v in sd.items():
        if v.ndim == 4 and re.search(r"patch_embed(ding)?s?\.(proj(ection)?\.)?weight$", k):
            return v.shape[-1]
    return None


def _timm_model(sd, family, img_size, heads, hf_config, pool, notes, act=None, consume=False, held=None
                ) -> tuple[ViT, dict[str, torch.Tensor], str]:
    """timm, Hugging Face ViT and RoPE-ViT: renamed to timm's keys, then `timm_config`; timm's CLIP-
    and SigLIP-style layers and gated MLPs through timm_clip.py (the family becomes timm-clip /
    timm-siglip)."""
    given = sd
    if family == "hf":
        sd, hf_cfg = from_hf(sd, hf_config or {}, notes)
        heads = heads or hf_cfg.get("heads")
        if img_size is None and hf_cfg.get("image_size"):   # the size its table was trained at
            size = hf_cfg["image_size"]
            img_size = tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))
    models_v2 = any(re.match(r"blocks\.\d+\.gamma_[12]$", k) for k in sd)   # facebookresearch/deit names
    if models_v2:
        sd = from_rope_vit(sd, notes)
    refuse_unsupported(sd)
    sd = drop_foreign(sd, notes)
    extra: dict[str, Any] = {}
    if family == "timm":
        family, extra, sd = timm_clip.vit_layers(sd, hf_config, act=act, pool=pool, notes=notes)
        heads = heads or timm_hub.heads(hf_config)
        if img_size is None and "pos_embed" not in sd:
            img_size = timm_hub.img_size(hf_config)
    kw = dict(heads=heads, pool=pool, notes=notes, eps=(hf_config or {}).get("layer_norm_eps"), models_v2=models_v2,
              extra=extra)
    try:
        cfg, sd = timm_config(sd, family, img_size=img_size, **kw)
    except GridUnknownError:   # a non-square table: the size timm's config.json gives, where one lies beside
        if img_size is not None or timm_hub.img_size(hf_config) is None:
            raise
        cfg, sd = timm_config(sd, family, img_size=timm_hub.img_size(hf_config), **kw)
    model = empty_model(cfg)
    weights = upcast(sd, given if consume else None, held_keep(model, held))
    if "freqs" in weights:
        weights["rope_freqs"] = rope_freqs(weights.pop("freqs"), cfg.heads)
    if "patch_embed.proj.bias" not in weights:
        weights["patch_embed.proj.bias"] = torch.zeros(cfg.dim)
        notes.append("The patch embedding has no bias in the file; a zero bias is equivalent.")
    return model, weights, family


PIL_RESAMPLE = {2: "bilinear", 3: "bicubic"}   # image processors' `resample` (PIL's codes)


def _processor_crop(config: Mapping[str, Any]) -> dict[str, Any]:
    """`crop_pct` and `interpolation` of a `preprocessor_config.json` (resize the shorter side,
    then centre-crop), where it says them; `{}` otherwise."""
    out: dict[str, Any] = {}
    size, crop = config.get("size"), config.get("crop_size")
    if config.get("do_center_crop") and isinstance(size, dict) and "shortest_edge" in size and isinstance(crop, dict):
        out["crop_pct"] = round(float(crop.get("height", size["shortest_edge"])) / float(size["shortest_edge"]), 4)
    elif config.get("do_center_crop") is False:
        out["crop_pct"] = 1.0
    if config.get("resample") in PIL_RESAMPLE:
        out["interpolation"] = PIL_RESAMPLE[config["resample"]]
    return out


def _preprocess(family: str, hf_config: Mapping[str, Any] | None, norm: str | None,
                crop_pct: float | None) -> dict[str, Any]:
    """The family's eval transform, with the image processor's mean/std where it lies beside the file."""
    pre = dict(DEFAULT_PREPROCESS[family])
    if family.startswith("timm"):
        pre.update(timm_hub.preprocess(hf_config))
    if family in ("hf", *HF_FAMILIES) and hf_config and "image_mean" in hf_config:
        pre.update(mean=list(hf_config["image_mean"]), std=list(hf_config["image_std"]))
    if family in HF_FAMILIES and hf_config:
        pre.update(_processor_crop(hf_config))
    if norm:
        if norm not in NORMS:
            raise CheckpointError(f"unknown norm {norm!r}; valid: {sorted(NORMS)}")
        pre.update(NORMS[norm])
    if crop_pct is not None:
        if not 0.1 <= crop_pct <= 1.0:
            raise CheckpointError(f"crop_pct must lie in [0.1, 1], got {crop_pct}")
        pre["crop_pct"] = crop_pct
    return pre
