"""The one importer: `import_state_dict` turns a state dict of any family into a vitpe model
(strictly loaded), with what the checkpoint records about it (`Imported`).

Three steps: `_context` checks the caller's options and decides the family (detect.py),
the family's converter (families.py) maps the keys and builds the config, `_finish` builds the
model, loads the weights and adds what every family has: its eval transform and class names."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch

from ..checkpoint import CheckpointError, clean_state_dict
from ..foreign import assigned_model, own_memory, source_dtype
from ..held_precision import HALF
from ..model import ViT
from ..swin.config import SwinConfig
from ..swin.model import SwinTransformer
from . import timm_hub
from .context import Context
from .detect import FAMILIES, detect_family, narrow
from .families import CONVERTERS, SWIN_FAMILIES
from .labels import class_names as config_class_names, given_class_names
from .preprocess import check_norm, eval_transform

# option -> the families (after `narrow`) it decides something for, and why the others refuse it
OPTIONS = {
    "window": (("timm-swin", "timm-swinv2"), "--window is for timm-layout Swin-V2 files (their window is not in "
               "the keys); not for a {family} file"),
    "act": (("timm", "timm-clip", "timm-siglip"), "--act is for timm-layout ViTs (CLIP- and SigLIP-style, gated MLPs), "
            "whose keys do not record it; a {family} model's activation is its config's or its family's"),
    "pool": (("timm", "timm-clip", "timm-siglip", "hf", "rope-vit", "timm-beit", "timm-eva02", "timm-dinov3",
              "timm-rope-vit"),
             "--pool is for bare timm-layout files; a {family} model's read-out is its config's and its keys' "
             "(docs/importing.md)"),
    "heads": (tuple(f for f in CONVERTERS if f not in SWIN_FAMILIES),
              "--heads is for ViTs; a {family} model's heads are in its keys (or config.json) (docs/importing.md)"),
}
ENCODING_LEAVES = ("pos_embed", "rope_freqs")   # timm's top-level names of what vitpe keeps inside `pos_enc`


@dataclass
class Imported:
    """An imported model and what the checkpoint records about it."""

    model: ViT | SwinTransformer
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
    caller's own): its tensors are emptied as their float32 copies are made (`upcast`).
    Without it the model shares no memory with `state_dict` (`foreign.own_memory`): changing one
    never changes the other.
    `hold`: a float16 / bfloat16 file's layer weights stay in its precision and are computed in
    float32 (`held_precision`, bit-identical outputs, half the memory): they are loaded so, and
    never have a float32 copy (the app's imports: a ViT-B/16 in float16 peaked at 165 + 330 MiB)."""
    sd = dict(clean_state_dict(state_dict))
    ctx = _context(sd, family, hf_config, img_size=img_size, grid=grid, heads=heads, pool=pool, act=act,
                   window=window)
    check_norm(norm)
    weights, config, notes = CONVERTERS[ctx.family](sd, ctx)
    return _finish(sd, weights, config, notes, ctx, given=None if consume else state_dict, hold=hold, norm=norm,
                   crop_pct=crop_pct, class_names=class_names, labels_name=labels_name)


def _context(sd: Mapping[str, torch.Tensor], family: str, hf_config: Mapping[str, Any] | None, *, img_size, grid,
             **options: Any) -> Context:
    """The family `sd` is (detected, or `family` narrowed to its variant by the keys) and the
    options it takes; CheckpointError for an unknown family or an option the family does not take."""
    config = dict(hf_config or {})
    if family not in ("auto", *FAMILIES):
        raise CheckpointError(f"unknown family {family!r}; valid: auto, {', '.join(FAMILIES)}")
    family = narrow(detect_family(sd, config) if family == "auto" else family, sd, config)
    for option, (families, why) in OPTIONS.items():
        if options[option] is not None and family not in families:
            raise CheckpointError(why.format(family=family))
    if grid is not None and img_size is None:
        patch = _patch_size(sd)
        img_size = (grid[0] * patch, grid[1] * patch) if patch else None
    return Context(family, config, img_size=img_size, **options)


def _finish(sd: Mapping[str, torch.Tensor], weights: dict[str, torch.Tensor], config: Any, notes: list[str],
            ctx: Context, *, given: Mapping[str, torch.Tensor] | None, hold: bool, norm: str | None,
            crop_pct: float | None, class_names: Sequence[str] | None, labels_name: str) -> Imported:
    """Build the model of `config` on the meta device and load `weights` into it by assignment
    (never held twice): float32, or the file's half precision for the layer weights it holds
    (`hold`); then the eval transform and the class names."""
    dtype = source_dtype(sd)
    held = dtype if hold and dtype in HALF else None      # the precision its layer weights are held in
    model = assigned_model(config, weights, f"{ctx.family} state dict", spent=sd if given is None else None,
                           held=held, rename=None if isinstance(config, SwinConfig) else _encoding_names)
    if given is not None:   # a caller's state dict: the model gets memory of its own, the caller's tensors stay theirs
        own_memory(model, given)
    n = model.cfg.num_classes
    names = (given_class_names(class_names, n, labels_name) if class_names is not None
             else timm_hub.class_names(ctx.config, n) or config_class_names(n, ctx.config))
    if names is None and n:
        notes.append(f"No class names for its {n} classes: predictions say `class k`. Give a labels "
                     "file (one name per line, or config.json's id2label) to name them.")
    pre = eval_transform(ctx.family, ctx.config, norm, crop_pct)
    return Imported(model.eval(), ctx.family, names, pre, notes, dtype)


def _encoding_names(model: ViT, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`pos_enc.<leaf>` (and timm's `pos_embed`, `rope_freqs`) -> the one tensor of that leaf name
    inside the encoding (a composite's `pos_enc.parts.0.rel_tables`); other names stay."""
    named = list(model.pos_enc.state_dict())
    out = {}
    for k, v in weights.items():
        leaf = k.removeprefix("pos_enc.")
        inside = k.startswith("pos_enc.") or k in ENCODING_LEAVES
        targets = [n for n in named if n.split(".")[-1] == leaf] if inside else []
        out["pos_enc." + targets[0] if len(targets) == 1 else k] = v
    return out


def _patch_size(sd: Mapping[str, torch.Tensor]) -> int | None:
    for k, v in sd.items():
        if v.ndim == 4 and re.search(r"patch_embed(ding)?s?\.(proj(ection)?\.)?weight$", k):
            return v.shape[-1]
    return None
