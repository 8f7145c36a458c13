"""What timm's hub `config.json` says that a state dict does not: the architecture's activation,
heads and defaults, the image size and the eval transform.

timm writes `config.json` beside `model.safetensors` (`save_config_for_hf`): `architecture` (a
registered model name such as `vit_base_patch16_clip_quickgelu_224`), `num_classes`,
`global_pool`, `pretrained_cfg` (`input_size`, `mean`, `std`, `crop_pct`, `interpolation`) and,
from timm 1.0, `model_args` (the arguments given on top of the architecture's own). The
architecture's own arguments are not written; the few that decide what a model computes are
kept here, read off timm 1.0.31's registry (every `vit_*clip*`, `vit_*siglip*`, `beit*`, `swin*`,
`eva02*` and `vit_*dinov2*` model built on the meta device): `ACT_GELU_TANH`, `HEADS_16`, the
`quickgelu` in a name, `SWINV2_PRETRAINED_WINDOWS`.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from ..checkpoint import CheckpointError

# timm's act_layer names -> ViTConfig.act
ACT_NAMES = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu", "silu": "silu",
             "swish": "silu"}
# timm 1.0.31: the SigLIP architectures whose MLPs use GELU (tanh); every other `vit_*siglip*` and
# `vit_*clip*` uses exact GELU, or quick-GELU where the name says `quickgelu`.
ACT_GELU_TANH = frozenset({
    "vit_base_patch32_siglip_256", "vit_base_patch32_siglip_gap_256", "vit_large_patch16_siglip_512",
    "vit_large_patch16_siglip_gap_512", "vit_giantopt_patch16_siglip_256", "vit_giantopt_patch16_siglip_384",
    "vit_giantopt_patch16_siglip_gap_256", "vit_giantopt_patch16_siglip_gap_384", "vit_so400m_patch16_siglip_256",
    "vit_so400m_patch16_siglip_384", "vit_so400m_patch16_siglip_512", "vit_so400m_patch16_siglip_gap_256",
    "vit_so400m_patch16_siglip_gap_384", "vit_so400m_patch16_siglip_gap_512"})
# timm 1.0.31: the architectures (of those above) whose heads are not width / 64: 16 heads each
HEADS_16 = ("vit_huge_patch14_clip_", "vit_giant_patch14_clip_", "vit_gigantic_patch14_clip_",
            "vit_giantopt_patch16_siglip_", "vit_so400m_patch14_siglip_", "vit_so400m_patch16_siglip_")
SWINV2_PRETRAINED_WINDOWS = {r"^swinv2_\w+_window12to(16|24)_192to(256|384)$": (12, 12, 12, 6)}
ACT_FLAG = "--act gelu|gelu_tanh|quick_gelu|silu"


def hub_config(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`config` if it is timm's (it names an `architecture`), else None."""
    if config and isinstance(config.get("architecture"), str):
        return dict(config)
    return None


def architecture(config: Mapping[str, Any] | None) -> str:
    """The registered model name (a `.tag` suffix removed), or "" without a timm config."""
    cfg = hub_config(config)
    return cfg["architecture"].split(".")[0] if cfg else ""


def model_args(config: Mapping[str, Any] | None) -> dict[str, Any]:
    args = (hub_config(config) or {}).get("model_args")
    return dict(args) if isinstance(args, Mapping) else {}


def arg(config: Mapping[str, Any] | None, name: str, default: Any = None) -> Any:
    """`model_args[name]`, else the config's own top-level entry (`num_classes`, `global_pool`), else `default`."""
    args = model_args(config)
    if name in args:
        return args[name]
    return (hub_config(config) or {}).get(name, default)


def pretrained_cfg(config: Mapping[str, Any] | None) -> dict[str, Any]:
    cfg = (hub_config(config) or {}).get("pretrained_cfg")
    return dict(cfg) if isinstance(cfg, Mapping) else {}


def img_size(config: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """The size the weights are used at: `model_args.img_size`, else `pretrained_cfg.input_size`."""
    size = model_args(config).get("img_size")
    if size is None:
        inp = pretrained_cfg(config).get("input_size")
        size = inp[1:] if isinstance(inp, (list, tuple)) and len(inp) == 3 else None
    if isinstance(size, (int, float)) and not isinstance(size, bool):
        return int(size), int(size)
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1])
    return None


def heads(config: Mapping[str, Any] | None) -> int | None:
    """`model_args.num_heads`, else 16 for the architectures `HEADS_16` names, else None (width / 64)."""
    n = model_args(config).get("num_heads")
    if isinstance(n, int) and not isinstance(n, bool):
        return n
    arch = architecture(config)
    return 16 if arch.startswith(HEADS_16) else None


def preprocess(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The eval transform `pretrained_cfg` records (mean, std, crop_pct, interpolation), as far as it does."""
    pc = pretrained_cfg(config)
    out: dict[str, Any] = {}
    if isinstance(pc.get("mean"), (list, tuple)) and isinstance(pc.get("std"), (list, tuple)):
        out.update(mean=[float(v) for v in pc["mean"]], std=[float(v) for v in pc["std"]])
    if isinstance(pc.get("crop_pct"), (int, float)) and 0.1 <= pc["crop_pct"] <= 1.0:
        out["crop_pct"] = float(pc["crop_pct"])
    if pc.get("interpolation") in ("bicubic", "bilinear"):
        out["interpolation"] = pc["interpolation"]
    return out


def class_names(config: Mapping[str, Any] | None, n: int) -> list[str] | None:
    """`label_names` of a timm config (timm >= 1.0 writes them when given), when one per class."""
    names = (hub_config(config) or {}).get("label_names")
    if isinstance(names, list) and len(names) == n and n and all(isinstance(s, str) and s for s in names):
        return names
    return None


def arch_act(arch: str) -> str | None:
    """The MLP activation timm 1.0.31 builds `arch` with, where this module knows it."""
    if not arch:
        return None
    if "quickgelu" in arch:
        return "quick_gelu"
    if arch in ACT_GELU_TANH:
        return "gelu_tanh"
    if re.match(r"^vit_\w+_(clip|siglip)", arch) or arch.startswith(("beit", "swin")):
        return "gelu"
    if re.match(r"^vit_\w+_dinov2$", arch):
        return "silu" if arch.startswith("vit_giant") else "gelu"
    return None


def resolve_act(config: Mapping[str, Any] | None, act: str | None, *, needed: bool, what: str,
                notes: list[str]) -> str | None:
    """The activation: `act` (the caller's, e.g. `--act`), else `model_args.act_layer`, else the
    architecture's (`arch_act`). None where none says and `needed` is false (the caller keeps its
    default); `needed` and unknown: CheckpointError naming `--act`. `what` says which layer made it
    necessary (for the message)."""
    if act is not None:
        if act not in ACT_NAMES:
            raise CheckpointError(f"unknown activation {act!r}; valid: {sorted(ACT_NAMES)}")
        given = ACT_NAMES[act]
        known = _config_act(config)
        if known is not None and known != given:
            notes.append(f"The activation is {given} as asked; timm's config.json beside the file says {known}.")
        return given
    known = _config_act(config)
    if known is not None or not needed:
        return known
    arch = architecture(config)
    where = (f"timm's config.json names architecture {arch!r}, whose activation vitpe's table of timm 1.0.31 "
             "architectures does not hold" if arch else "no timm config.json (with its `architecture`) lies beside "
                                                       "the file")
    raise CheckpointError(f"{what}: the MLP's activation is not in a state dict and {where}; pass {ACT_FLAG} "
                          "(quick_gelu for OpenAI CLIP `*_quickgelu_*`, gelu_tanh for the SigLIP 2-era models, "
                          "gelu for the others), or put timm's config.json beside the file")


def _config_act(config: Mapping[str, Any] | None) -> str | None:
    given = model_args(config).get("act_layer")
    if isinstance(given, str):
        if given not in ACT_NAMES:
            raise CheckpointError(f"timm's config.json gives act_layer {given!r}, which vitpe does not compute; "
                                  f"valid: {sorted(ACT_NAMES)}")
        return ACT_NAMES[given]
    return arch_act(architecture(config))


def swinv2_pretrained_windows(config: Mapping[str, Any] | None, stages: int) -> tuple[int, ...]:
    """`model_args.pretrained_window_sizes`, else the architecture's (the `*_window12to16_192to256`
    family: 12, 12, 12, 6), else zeros (each block's own window)."""
    given = model_args(config).get("pretrained_window_sizes")
    if isinstance(given, (list, tuple)):
        return tuple(int(v) if not isinstance(v, (list, tuple)) else int(v[0]) for v in given)
    if isinstance(given, int):
        return (given,) * stages
    arch = architecture(config)
    for pattern, value in SWINV2_PRETRAINED_WINDOWS.items():
        if re.match(pattern, arch) and len(value) == stages:
            return value
    return (0,) * stages


def arch_window(config: Mapping[str, Any] | None) -> int | None:
    """`model_args.window_size` (one for every stage), else the `windowN` / `windowMtoN` of the name."""
    given = model_args(config).get("window_size")
    if isinstance(given, int) and not isinstance(given, bool):
        return given
    if isinstance(given, (list, tuple)) and given and all(isinstance(v, int) for v in given) and len(set(given)) == 1:
        return int(given[0])
    m = re.search(r"_window(?:\d+to)?(\d+)(?:_|$)", architecture(config))
    return int(m.group(1)) if m else None
