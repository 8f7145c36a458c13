"""Reading a foreign state dict key by key, for every family's converter.

A family's key map is data: a TOP table (the embeddings, norms and head), a BLOCK table (one
transformer block, read for each layer) and a DROP table (what is left out, with the note that
says so). `Keys.map` reads a table, `Keys.drop_all` a DROP table; each records what it took, and
`Keys.refuse_rest` names whatever no rule took, so nothing is silently dropped or added.
A table row is `ours: theirs`, `theirs` one source name or a tuple of alternatives (the first
the file has wins), with `.weight` / `.bias` appended to both unless the call says otherwise.

The tensor surgery several layouts share is here too: packing query/key/value, a zero bias where
a layout has none, splitting a packed SwiGLU, the head-width check of rotary encodings.
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

import torch
from torch import Tensor

from ..checkpoint import CheckpointError

PARAMS = ("weight", "bias")
TENSOR = ("",)   # `params` of a table whose names are whole tensors (`cls_token`, `pos_embed`)
LAYER_SCALE_GAMMA = re.compile(r"blocks\.\d+\.gamma_[12]$")   # facebookresearch/deit `models_v2`'s, timm BEiT / Eva's


class Keys:
    """A source state dict read once: `take` and `map` move tensors to vitpe's names, `drop` leaves keys out."""

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

    def map(self, table: Mapping[str, str | Sequence[str]], *, src: str | Sequence[str] = "", dst: str = "",
            params: Sequence[str] = PARAMS) -> None:
        """Take every row `ours: theirs` of `table`: `dst + ours + .p` from the first `s + theirs + .p`
        the file has, over the source prefixes `src` and the alternatives `theirs`, for each `p` of
        `params` (`TENSOR`: the names are whole tensors)."""
        prefixes = (src,) if isinstance(src, str) else tuple(src)
        for ours, theirs in table.items():
            alternatives = (theirs,) if isinstance(theirs, str) else tuple(theirs)
            for p in params:
                tail = f".{p}" if p else ""
                self.take(f"{dst}{ours}{tail}", *(f"{s}{t}{tail}" for s in prefixes for t in alternatives))

    def keep(self, *names: str) -> None:
        """`take` each of `names`' `.weight` and `.bias` under the same name (those the file has)."""
        self.map({n: n for n in names})

    def drop(self, pattern: str) -> list[str]:
        """Mark the keys matching regex `pattern` used (left out); returns them."""
        hit = [k for k in self.sd if re.search(pattern, k)]
        self.used.update(hit)
        return hit

    def drop_all(self, table: Mapping[str, str | None], notes: list[str]) -> None:
        """Leave out the keys of each `pattern: note` row, adding its note (if any) where a key matched."""
        for pattern, note in table.items():
            if self.drop(pattern) and note and note not in notes:
                notes.append(note)

    def layers(self, pattern: str) -> list[int]:
        """Sorted block indices `i` of the keys matching `pattern` with a `(\\d+)` group."""
        return sorted({int(m.group(1)) for k in self.sd if (m := re.match(pattern, k))})

    def refuse_rest(self) -> None:
        rest = sorted(k.removeprefix("<head>.") if k.startswith("<head>.") else self.prefix + k
                      for k in set(self.sd) - self.used)   # the file's own names
        if rest:
            raise CheckpointError(f"{self.family} keys vitpe cannot place (it does not compute them, and would compute "
                                  f"something else without them): {rest[:6]}{' ...' if len(rest) > 6 else ''}")


def strip_prefix(sd: Mapping[str, Tensor], prefixes: tuple[str, ...]) -> tuple[dict[str, Tensor], str]:
    """`sd` without the first of `prefixes` that some key carries (a task model's backbone, e.g.
    `beit.`), and that prefix ("" if none). Keys without it keep their names (heads) behind `<head>.`."""
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


def split_packed_glu(out: dict[str, Tensor], packed: Tensor, dst: str, param: str) -> None:
    """A packed SwiGLU input projection (gate rows first, then value rows: timm's `GluMlp` and
    `SwiGLUPacked`, DINOv2's `weights_in`) as vitpe's `dst.fc1_g` and `dst.fc1_x`."""
    out[f"{dst}fc1_g.{param}"], out[f"{dst}fc1_x.{param}"] = packed.chunk(2, dim=0)


def is_packed_glu(sd: Mapping[str, Tensor], block: str = "blocks.0.") -> bool:
    """Whether `block`'s MLP is a packed gated MLP (`mlp.fc1` twice as wide as `mlp.fc2`'s input)."""
    fc1, fc2 = sd.get(f"{block}mlp.fc1.weight"), sd.get(f"{block}mlp.fc2.weight")
    return fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[1]


def check_layer_scale(out: Mapping[str, Tensor], layers: list[int], family: str) -> bool:
    """Whether the blocks `layers` of `out` (vitpe's names) have LayerScale; CheckpointError unless
    it is in both branches of every block or in none (vitpe's LayerScale is per block, both branches)."""
    ls = [sum(f"blocks.{i}.ls{n}.gamma" in out for i in layers) for n in (1, 2)]
    if ls not in ([0, 0], [len(layers)] * 2):
        raise CheckpointError(f"{family}: LayerScale in {ls[0]} attention and {ls[1]} MLP branches of {len(layers)} "
                              "blocks; vitpe's LayerScale is in both branches of every block")
    return bool(ls[0])


def check_rotary_heads(family: str, dim: int, heads: int) -> None:
    """CheckpointError unless `dim` splits into `heads` heads of a width divisible by 4 (a 2D
    rotary embedding turns pairs of channels by the row and by the column)."""
    if dim % heads or (dim // heads) % 4:
        raise CheckpointError(f"{family}: width {dim} with {heads} heads: the head width must be a multiple of 4 "
                              "(pass --heads)")
