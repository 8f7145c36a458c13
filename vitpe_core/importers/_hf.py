"""Shared by the Hugging Face family importers (beit.py, dinov2.py, dinov3.py, clip.py): reading
a `save_pretrained` state dict key by key, and the parts of its `config.json` every family has.

A family's importer maps each source key to vitpe's name with `Keys.take`; what no rule took
is named by `Keys.refuse_rest`, so nothing is silently dropped or silently added."""
from __future__ import annotations

import re
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checkpoint import CheckpointError
from ..encodings.absolute import resample_abs_pos_embed
from .timm import check_img_size

ACTS = {"gelu": "gelu", "quick_gelu": "quick_gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
        "silu": "silu", "swish": "silu"}   # transformers' hidden_act -> ViTConfig.act


class Keys:
    """A source state dict read once: `take` moves tensors to vitpe's names, `drop` leaves keys out."""

    def __init__(self, sd: Mapping[str, Tensor], family: str, prefix: str = "") -> None:
        self.sd, self.family, self.prefix = dict(sd), family, prefix   # `prefix`: what strip_prefix took off
        self.used: set[str] = set()
        self.out: dict[str, Tensor] = {}

    def get(self, *names: str) -> Tensor | None:
        """The first of `names` the file has (marked used), or None."""
        for n in names:
            if n in self.sd:
                self.used.add(n)
                return self.sd[n]
        return None

    def take(self, dst: str, *names: str) -> Tensor | None:
        t = self.get(*names)
        if t is not None:
            self.out[dst] = t
        return t

    def keep(self, *names: str) -> None:
        """`take` each of `names`' `.weight` and `.bias` under the same name (those the file has)."""
        for name in names:
            for p in ("weight", "bias"):
                self.take(f"{name}.{p}", f"{name}.{p}")

    def drop(self, pattern: str) -> list[str]:
        """Mark the keys matching regex `pattern` used (left out); returns them."""
        hit = [k for k in self.sd if re.search(pattern, k)]
        self.used.update(hit)
        return hit

    def layers(self, pattern: str) -> list[int]:
        """Sorted block indices `i` of the keys matching `pattern` with a `(\\d+)` group."""
        return sorted({int(m.group(1)) for k in self.sd if (m := re.match(pattern, k))})

    def refuse_rest(self) -> None:
        rest = sorted(k.removeprefix("<head>.") if k.startswith("<head>.") else self.prefix + k
                      for k in set(self.sd) - self.used)   # the file's own names
        if rest:
            raise CheckpointError(f"{self.family} keys vitpe cannot place (it would compute something else without "
                                  f"them): {rest[:6]}{' ...' if len(rest) > 6 else ''}")


def strip_prefix(sd: Mapping[str, Tensor], prefixes: tuple[str, ...]) -> tuple[dict[str, Tensor], str]:
    """`sd` without the first of `prefixes` that some key carries (a task model's backbone, e.g.
    `beit.`), and that prefix ("" if none). Keys without it keep their names (heads)."""
    for p in prefixes:
        if any(k.startswith(p) for k in sd):
            return {k[len(p):] if k.startswith(p) else f"<head>.{k}": v for k, v in sd.items()}, p
    return dict(sd), ""


def qkv(keys: Keys, dst: str, q: tuple[str, ...], k: tuple[str, ...], v: tuple[str, ...]) -> None:
    """Concatenate separate query/key/value projections into `dst.weight`/`dst.bias`; a bias a
    projection does not have (BEiT's key, DINOv3's per config) is zero, which adds nothing."""
    ws = [keys.get(*(n + ".weight" for n in names)) for names in (q, k, v)]
    if any(w is None for w in ws):
        raise CheckpointError(f"{keys.family}: missing a query/key/value weight among {q[0]}, {k[0]}, {v[0]}")
    keys.out[f"{dst}.weight"] = torch.cat(ws, 0)
    bs = [keys.get(*(n + ".bias" for n in names)) for names in (q, k, v)]
    if any(b is not None for b in bs):
        keys.out[f"{dst}.bias"] = torch.cat([b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype)
                                             for b, w in zip(bs, ws)], 0)


def zero_bias(keys: Keys, name: str, notes: list[str], what: str) -> None:
    """A linear layer without a bias in the file gets a zero bias (the model's layers have one)."""
    if f"{name}.weight" in keys.out and f"{name}.bias" not in keys.out:
        w = keys.out[f"{name}.weight"]
        keys.out[f"{name}.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)
        if what and not any(what in n for n in notes):
            notes.append(f"{what} has no bias in the file; a zero bias is equivalent.")


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


def resample_table(pos: Tensor, new: tuple[int, int], old: tuple[int, int], prefix: int, notes: list[str],
                   antialias: bool) -> Tensor:
    """`pos (1, prefix+N, D)` resampled to grid `new` once, at import, as the family's
    `interpolate_pos_encoding` does at every forward: bicubic in float32, align_corners=False,
    prefix rows kept apart, antialiased or not (DINOv2 with registers is; BEiT, DINOv2, CLIP and
    SigLIP are not)."""
    if new == old:
        return pos
    aa = "antialiased" if antialias else "not antialiased"
    notes.append(f"The position table was trained on a {old[0]}x{old[1]} grid; resampled to {new[0]}x{new[1]} "
                 f"(bicubic, {aa}, prefix rows kept apart, as transformers does at that size).")
    if antialias:
        return resample_abs_pos_embed(pos.float(), new, old, prefix).to(pos.dtype)
    img = pos[:, prefix:].float().reshape(1, old[0], old[1], -1).permute(0, 3, 1, 2)       # (1, D, H, W)
    img = F.interpolate(img, size=new, mode="bicubic", align_corners=False)                  # (1, D, H', W')
    patches = img.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], -1).to(pos.dtype)         # (1, N', D)
    return torch.cat((pos[:, :prefix], patches), dim=1)
