"""Bring your own ViT: turn a pretrained state dict into an ordinary vitpe model and checkpoint.

Families (detected from the keys, and `config.json`'s `model_type` where it lies beside the
file, with `family="auto"`: detect.py); one module each, every one a `convert(sd, ctx) ->
(weights, config, notes)` (context.py) in one table (families.py), behind the one
`import_state_dict` (core.py). Shared by all: key maps as TOP / BLOCK / DROP tables read by
`keymap.Keys`, one refusal table (refuse.py), the eval transform (preprocess.py), class names
(labels.py); the position tables are resized by the encodings' own functions.

* `timm` (timm.py) — timm's `VisionTransformer` and relatives in timm key names: with or
  without a class token, `no_embed_class` tables, registers, LayerScale, DeiT distilled,
  DeiT-III, DINOv2-style models in timm's names.
* `hf` (hf_vit.py) — Hugging Face `ViTModel` / `ViTForImageClassification`.
* `rope-vit` (rope_vit.py) — naver-ai/rope-vit's RoPE-Axial / RoPE-Mixed DeiT-III models.
* `beit`, `data2vec-vision` (beit.py) — relative position bias with CLS entries (`rpb_cls`).
* `dinov2` (dinov2.py) — DINOv2, with or without registers; `[CLS, mean]` classifier.
* `dinov3` (dinov3.py) — DINOv3's RoPE (`rope_dinov3`), registers, gated MLPs.
* `clip`, `siglip` (clip.py) — CLIP's and SigLIP's vision towers (pre-norm, quick-GELU,
  attention pooling).
* `swin` (swin.py: `hf-swin`, `hf-swinv2`) — Swin and Swin-V2 (the model: vitpe_core/swin/).
* timm's layouts of these: `timm-beit` (timm_beit.py), `timm-eva02` (timm_eva.py: EVA-02 tiny /
  small, RoPE on a reference grid), `timm-clip` / `timm-siglip` (timm_clip.py: timm's
  `VisionTransformer` with `norm_pre` / `attn_pool` / gated MLPs, through the `timm` path),
  `timm-swin` / `timm-swinv2` (timm_swin.py), `timm-dinov3` (timm_dinov3.py: timm's `Eva`
  DINOv3 models, `rope_dinov3`), `timm-rope-vit` (timm_rope.py: timm's `Eva` port of RoPE-ViT,
  `vit_*_patch16_rope_*`, `rope_axial` / `rope_mixed`); timm's hub `config.json` (timm_hub.py)
  gives what their keys do not say (the activation, Swin-V2's window, EVA-02's reference grid).

The Hugging Face families are read in the `save_pretrained` layout (`model.safetensors` with
`config.json` beside it) of transformers 5 and the hub's older names; timm's from its hub layout
(`model.safetensors` with timm's `config.json`), or bare with `--act` / `--window` where needed. Nothing is imported
that would compute something else: an unknown layer, an unknown or missing key, or a layout
the keys cannot decide is refused with the keys that decided it. Reading never runs code from
the file (`foreign.read_state_dict`); hub ids download through `huggingface_hub` (source.py).
docs/importing.md lists what maps to what, and how each family is checked.

Arrows: importers -> foreign -> checkpoint -> model; checkpoint knows only vitpe's own format.
"""
from __future__ import annotations

from ..checkpoint import CheckpointError
from ..foreign import read_state_dict
from ..foreign import source_dtype
from .core import Imported, import_state_dict
from .detect import FAMILIES, HF_FAMILIES, MODEL_TYPES, detect_family, is_swin
from .hf_vit import HF4_LAYER, HF5_LAYER
from .preprocess import CLIP, DEFAULT_PREPROCESS, IMAGENET, INCEPTION, NORMS
from .labels import ASSETS, MAX_LABEL_CHARS, MAX_LABELS_BYTES, imagenet_classes, parse_labels, read_labels
from .rope_vit import rope_freqs
from .source import HUB_FILES, HUB_HINT, STORED_DTYPES, import_checkpoint, import_file, parse_size, resolve_source
from .refuse import RULES
from .timm import MAX_IMG_SIDE, MAX_PATCHES, GridUnknownError

__all__ = ["ASSETS", "CLIP", "CheckpointError", "DEFAULT_PREPROCESS", "FAMILIES", "GridUnknownError", "HF4_LAYER",
           "HF5_LAYER", "HF_FAMILIES", "HUB_FILES", "HUB_HINT", "IMAGENET", "INCEPTION", "Imported", "MAX_IMG_SIDE",
           "MAX_LABELS_BYTES", "MAX_LABEL_CHARS", "MAX_PATCHES", "MODEL_TYPES", "NORMS", "RULES", "STORED_DTYPES",
           "detect_family", "imagenet_classes", "import_checkpoint", "import_file", "is_swin",
           "import_state_dict", "parse_labels", "parse_size", "read_labels", "read_state_dict", "resolve_source",
           "rope_freqs", "source_dtype"]
