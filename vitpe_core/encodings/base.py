"""The one interface every position encoding implements, its registry, and composition.

An encoding plugs into attention through up to three hooks (docs/encodings.md):

* `table(grid)`   -> `(P+N, D)` absolute table added to the tokens before block 0, or None;
* `bias(q, k, grid=, layer=)` -> `(B|1, h, T, T)` float32 additive attention bias (added
  to the logits after the `1/sqrt(d)` scaling), or None. An encoding whose gates are
  `σ(q·k/sqrt d)` (CoPE, SaPE²) sets `uses_logits = True`; the attention then computes the
  logits once and passes them as `logits=` instead of the encoding repeating the matmul;
* `angles(grid, layer)` -> `(h|1, N, d/2)` float32 rotation angles of q/k pairs, or None.
  `rotate` applies them to the patch tokens (prefix tokens are never rotated).

An encoding may also take over the whole attention on the fast path: `attend(q, k, v, grid=,
layer=, scale=)` -> `(B, h, T, dv)` or None (CoPE and SaPE² fuse their bias with the softmax,
vitpe_core/encodings/functional.py); it must equal `softmax(q·kᵀ·scale + bias) v` with this
encoding's `bias` (tests/test_encodings.py checks fast == trace).

Every hook defaults to "not applicable", so the attention module and the app treat all
encodings uniformly. `build_encoding("sape2+ape", ctx, **options)` composes by name:
tables add, biases add, rotations chain (angles of the same pairs add).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn
import torch.nn.functional as F

from ..config import ENCODINGS, encoding_parts  # noqa: F401  (re-exported: the one check of an encoding name)

Grid = tuple[int, int]


@dataclass(frozen=True)
class EncodingContext:
    """What an encoding needs to know about the model it is built for."""

    dim: int            # D
    heads: int          # h
    depth: int          # number of blocks (per-layer parameters)
    grid: Grid          # (H, W) the model is built for
    num_prefix: int = 1  # P (the CLS token; imported models may have more)
    table_prefix: int | None = None  # prefix rows of a learned `ape` table (0: patches only); default P

    @property
    def table_rows_prefix(self) -> int:
        return self.num_prefix if self.table_prefix is None else self.table_prefix

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class PositionEncoding(nn.Module):
    """Base class: every hook returns "not applicable"."""

    hooks: tuple[str, ...] = ()  # subset of ("table", "bias", "rotation"), for labels in the app
    uses_logits: bool = False    # bias() reads `q·k/sqrt d` of the unrotated q, k (see bias)

    def __init__(self, ctx: EncodingContext) -> None:
        super().__init__()
        self.ctx = ctx

    def table(self, grid: Grid) -> Tensor | None:
        return None

    def bias(self, q: Tensor, k: Tensor, *, grid: Grid, layer: int,
             parts: dict[str, Tensor] | None = None, logits: Tensor | None = None) -> Tensor | None:
        """`q, k: (B, h, T, d)` before rotation. If `parts` is a dict, named components of
        the bias (e.g. SaPE²'s x and y parts, `(B|1, h, N, N)` over patches) are put into it.
        `logits`, when given, is `(q·k^T)/sqrt d: (B, h, T, T)` of these q and k (an encoding
        with `uses_logits` reuses it; the others ignore it)."""
        return None

    def angles(self, grid: Grid, layer: int) -> Tensor | None:
        return None

    def attend(self, q: Tensor, k: Tensor, v: Tensor, *, grid: Grid, layer: int,
               scale: float, qkv: Tensor | None = None) -> Tensor | None:
        """The whole attention `softmax(q·kᵀ·scale + bias) v: (B, h, T, dv)` when this encoding
        computes it fused (no trace); None: the attention module does it from `bias`. `qkv`:
        the `(3, B, h, T, d)` tensor q, k, v are slices of, when they are (one gradient back)."""
        return None

    def rotate(self, q: Tensor, k: Tensor, *, grid: Grid, layer: int) -> tuple[Tensor, Tensor]:
        ang = self.angles(grid, layer)
        if ang is None:
            return q, k
        P = self.ctx.num_prefix
        return rotate_patches(q, ang, P), rotate_patches(k, ang, P)

    def extra_repr(self) -> str:
        return f"grid={self.ctx.grid}"


def rotate_patches(x: Tensor, ang: Tensor, num_prefix: int) -> Tensor:
    """Rotate adjacent channel pairs `(2k, 2k+1)` of the patch tokens of `x: (B, h, T, d)` by
    `ang: (h|1, N, d/2)` (RoPE-ViT's complex-pair convention); prefix tokens pass unchanged."""
    prefix, x_p = x[:, :, :num_prefix], x[:, :, num_prefix:]
    cos, sin = ang.cos(), ang.sin()                   # (h|1, N, d/2)
    x1 = x_p[..., 0::2].float()                       # (B, h, N, d/2)
    x2 = x_p[..., 1::2].float()
    rot = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, h, N, d/2, 2)
    return torch.cat((prefix, rot.flatten(-2).to(x.dtype)), dim=2)        # (B, h, T, d)


def pad_prefix(bias: Tensor, num_prefix: int) -> Tensor:
    """`(B, h, N, N)` patch bias -> `(B, h, T, T)` with zero rows/columns for the prefix."""
    return F.pad(bias, (num_prefix, 0, num_prefix, 0))


_REGISTRY: dict[str, type[PositionEncoding]] = {}


def register_encoding(name: str) -> Callable[[type[PositionEncoding]], type[PositionEncoding]]:
    def deco(cls: type[PositionEncoding]) -> type[PositionEncoding]:
        if name in _REGISTRY or "+" in name:
            raise ValueError(f"cannot register encoding {name!r}")
        cls.name = name
        _REGISTRY[name] = cls
        if name not in ENCODINGS:
            ENCODINGS.append(name)
        return cls
    return deco


def available_encodings() -> list[str]:
    return list(_REGISTRY)


def _options_of(cls: type[PositionEncoding]) -> set[str]:
    sig = inspect.signature(cls.__init__)
    return {p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def build_encoding(name: str, ctx: EncodingContext, **options) -> PositionEncoding:
    """Build `name` (`a+b` composes). Each keyword option goes to every part that accepts
    it; an option no part accepts is an error (no silently dropped keywords)."""
    parts = encoding_parts(name)
    used: set[str] = set()
    modules = []
    for p in parts:
        cls = _REGISTRY[p]
        mine = {k: v for k, v in options.items() if k in _options_of(cls)}
        used |= set(mine)
        modules.append(cls(ctx, **mine))
    if set(options) - used:
        valid = sorted(set().union(*(_options_of(_REGISTRY[p]) for p in parts)))
        raise ValueError(f"options {sorted(set(options) - used)} are not accepted by {name!r}; "
                         f"valid: {valid}")
    return modules[0] if len(modules) == 1 else Composite(ctx, modules, name)


class Composite(PositionEncoding):
    """`a+b`: tables add, biases add, rotation angles add (rotations of the same pairs chain)."""

    def __init__(self, ctx: EncodingContext, parts: list[PositionEncoding], name: str) -> None:
        super().__init__(ctx)
        self.parts = nn.ModuleList(parts)
        self.name = name
        self.hooks = tuple(h for h in ("table", "bias", "rotation") if any(h in p.hooks for p in parts))
        self.uses_logits = any(p.uses_logits for p in parts)

    def _sum(self, values: list[Tensor | None]) -> Tensor | None:
        values = [v for v in values if v is not None]
        if not values:
            return None
        out = values[0]
        for v in values[1:]:
            out = out + v
        return out

    def table(self, grid: Grid) -> Tensor | None:
        return self._sum([p.table(grid) for p in self.parts])

    def bias(self, q, k, *, grid, layer, parts=None, logits=None):
        out = []
        for p in self.parts:
            sub = {} if parts is not None else None
            out.append(p.bias(q, k, grid=grid, layer=layer, parts=sub, logits=logits))
            if sub:
                parts.update({f"{p.name}.{key}": v for key, v in sub.items()})
        return self._sum(out)

    def angles(self, grid: Grid, layer: int) -> Tensor | None:
        return self._sum([p.angles(grid, layer) for p in self.parts])

    def attend(self, q, k, v, *, grid, layer, scale, qkv=None):
        """One part's fused attention when the other parts add no bias and no rotation (e.g.
        `sape2+ape`, `cope+ape`: the table is added before block 0)."""
        fused = [p for p in self.parts if type(p).attend is not PositionEncoding.attend]
        rest = [p for p in self.parts if p not in fused]
        if len(fused) != 1 or any({"bias", "rotation"} & set(p.hooks) for p in rest):
            return None
        return fused[0].attend(q, k, v, grid=grid, layer=layer, scale=scale, qkv=qkv)
