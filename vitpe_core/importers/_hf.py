"""Shared by the Hugging Face family importers (beit.py, dinov2.py, dinov3.py, clip.py): the parts of
a `save_pretrained` model's `config.json` every family has (activation, image size, the grid its
position parameters were trained on) and the table resampling transformers does at another size:
once at import for `--img-size` (`resample_table`), and at run time for an input of another size
(`ape_options`: the `ape` encoding's options with the family's rule)."""
from __future__ import annotations

from typing import Any, Mapping

from torch import Tensor

from ..checkpoint import CheckpointError
from ..encodings.absolute import resample_abs_pos_embed
from .timm import check_img_size

ACTS = {"gelu": "gelu", "quick_gelu": "quick_gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
        "silu": "silu", "swish": "silu"}   # transformers' hidden_act -> ViTConfig.act


def act(config: Mapping[str, Any], family: str, default: str = "gelu") -> str:
    name = config.get("hidden_act", default)
    if name not in ACTS:
        raise CheckpointError(f"{family}: hidden_act {name!r} is not one vitpe computes; valid: {sorted(ACTS)}")
    return ACTS[name]


def size_pair(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)


def config_grid(config: Mapping[str, Any], patch: int, table_patches: int | None, family: str) -> tuple[int, int]:
    """The grid the position parameters were trained on: `image_size / patch_size` of the config,
    else the square root of the table's patch count."""
    size = size_pair(config.get("image_size"))
    if size is not None:
        grid = (size[0] // patch, size[1] // patch)
        if table_patches is None or grid[0] * grid[1] == table_patches:
            return grid
    side = int(round((table_patches or 0) ** 0.5))
    if table_patches and side * side == table_patches:
        return side, side
    raise CheckpointError(f"{family}: the config's image_size {size} does not fit the table of {table_patches} "
                          "patches; pass --img-size H[xW] (the size the table was trained at)")


def target_grid(img_size: tuple[int, int] | None, grid: tuple[int, int], patch: int) -> tuple[int, int]:
    check_img_size(img_size, patch)
    return grid if img_size is None else (img_size[0] // patch, img_size[1] // patch)


def resample_table(pos: Tensor, new: tuple[int, int], old: tuple[int, int], prefix: int, notes: list[str], *,
                   antialias: bool, who: str = "as transformers does at that size") -> Tensor:
    """`pos (1, prefix+N, D)` resampled to grid `new` once, at import, as the family's
    `interpolate_pos_encoding` does at every forward (`encodings.absolute.resample_abs_pos_embed`:
    bicubic in float32, align_corners=False, prefix rows kept apart, antialiased or not: DINOv2
    with registers and timm are; BEiT, DINOv2, CLIP and SigLIP are not), with a note saying so."""
    if new == old:
        return pos
    notes.append(f"The position table was trained on a {old[0]}x{old[1]} grid; resampled to {new[0]}x{new[1]} "
                 f"(bicubic, {'antialiased' if antialias else 'not antialiased'}, prefix rows kept apart, {who}).")
    return resample_abs_pos_embed(pos, new, old, prefix, antialias=antialias)


def ape_options(antialias: bool) -> dict[str, object]:
    """The `ape` encoding's options that make its run-time resampling (an input of another size)
    the family's `interpolate_pos_encoding`: bicubic in float32, align_corners=False, prefix rows
    kept apart, antialiased (DINOv2 with registers) or not (ViT, BEiT, DINOv2, CLIP, SigLIP)."""
    return {"ape_interpolation": "bicubic", "ape_antialias": antialias}


def note_resampled_once(notes: list[str], new: tuple[int, int], old: tuple[int, int], patch: int,
                        what: str = "table") -> None:
    """Where the position `what` ("table", "tables") was resampled at import (`new` != `old`): one line
    saying that an input of yet another size resamples the resampled one, where transformers
    resamples the trained one."""
    if new != old:
        notes.append(f"At an input size other than {new[0] * patch}x{new[1] * patch} px this model resamples its "
                     f"{new[0]}x{new[1]} position {what} again where transformers resamples the trained "
                     f"{old[0]}x{old[1]} {what} (not the same numbers): import at {old[0] * patch}x{old[1] * patch} "
                     "to run at every size as transformers does.")
