"""Live stress tests: shift or resize one image, follow a patch with its content, and measure
how far the bias and attention maps moved *with* the content (no Streamlit).

A `Transform` resizes the model's input (bicubic, antialiased, on the normalised tensor, as
`evaluate --sizes` does) and then translates it by `(dy, dx)` pixels, filling what enters
with zeros (the mean colour after normalisation, as `evaluate.shift_images`) or by
reflection. A point at input pixel `(y, x)` goes to `(y·s_y + dy, x·s_x + dx)`, `s` the
size ratio per axis. Two mappings follow from it:

* `follow_patch`: the patch of the new grid whose cell holds the moved centre of a patch (a
  whole-patch shift moves the index by that many patches; a sub-patch shift picks the
  nearest patch; a resize scales the coordinates);
* `source_patches`: for every patch of the new grid, the patch of the original grid its
  centre came from, or -1 where the content came from outside the image (filled).

`shift_error` is the README's "bias shift err" (`evaluate.bias_shift_error`) for any
transform and one image: `Σ_l mean|b'_l(i', n') − b_l(src i', src n')| / Σ_l mean|b_l(src i',
src n')|` over the pairs of patches whose content stayed in the image, all heads (0 = the
bias moved exactly with the content). For a whole-patch shift it is that function's number
on one image (tests/test_stress.py checks it); for sub-patch shifts and resizes the
correspondence is by the nearest patch centre, so even a perfectly moving map scores above 0.

Deliberate choices:
* the resize is applied to the model's native input (not re-cropped from the original
  photo), so at the native size and no shift the input, trace and maps are exactly the
  unshifted ones;
* maps are compared on their raw values (the page's [0, 1] normalisation would hide a change
  of scale).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from . import analysis
from .viewstate import FILLS   # defined there: the app reads it before importing torch

if TYPE_CHECKING:   # torch is imported where it is used: the app draws its first page before torch is loaded
    import torch

    from .encodings.base import Grid


@dataclass(frozen=True)
class Transform:
    """Resize the input to `size` (H, W) pixels, then shift its content by `shift` (dy, dx) pixels."""

    size: tuple[int, int]
    shift: tuple[int, int] = (0, 0)
    fill: str = "zero"

    def __post_init__(self) -> None:
        if self.fill not in FILLS:
            raise ValueError(f"unknown fill {self.fill!r}; valid: {', '.join(FILLS)}")

    def is_identity(self, native: tuple[int, int]) -> bool:
        return tuple(self.size) == tuple(native) and tuple(self.shift) == (0, 0)

    def scale(self, native: tuple[int, int]) -> tuple[float, float]:
        return self.size[0] / native[0], self.size[1] / native[1]


# ----------------------------------------------------------------------------- controls
def shift_options(patch_size: int, patches: int = 2) -> list[int]:
    """Shifts in pixels offered by the control: −`patches`…+`patches` patches in quarter-patch
    steps (1 px steps when the patch is smaller than 4 px or not a multiple of 4)."""
    step = patch_size // 4 if patch_size % 4 == 0 else 1
    return list(range(-patches * patch_size, patches * patch_size + 1, step))


def shift_label(px: int, patch_size: int) -> str:
    """`+4 px (1 patch)`, `-2 px (½ patch)`, `0`."""
    if px == 0:
        return "0"
    frac = abs(px) / patch_size
    names = {0.25: "¼", 0.5: "½", 0.75: "¾"}
    whole, rest = divmod(frac, 1)
    text = (f"{int(whole)}" if whole else "") + names.get(rest, "" if rest == 0 else f"{rest:.2f}")
    noun = "patch" if frac <= 1 else "patches"
    return f"{px:+d} px ({text} {noun})"


def size_options(img_size: tuple[int, int], patch_size: int, lo: float = 0.75, hi: float = 1.5
                 ) -> list[tuple[int, int]]:
    """Input sizes `(H, W)` from `lo`× to `hi`× the native one in whole-patch steps of its
    height (24–48 px for the 32-px CIFAR models; 176–336 px for a 224-px ViT/16), the width
    kept in proportion (rounded to whole patches); always includes the native size."""
    H, W = (s // patch_size for s in img_size)
    rows = range(max(1, math.ceil(lo * H)), math.floor(hi * H) + 1)
    out = {(r * patch_size, max(1, round(W * r / H)) * patch_size) for r in rows} | {tuple(img_size)}
    return sorted(out)


# ----------------------------------------------------------------------------- the input
def transform_input(x: torch.Tensor, tf: Transform) -> torch.Tensor:
    """`x (3, H, W)` or `(B, 3, H, W)`, normalised -> the same, resized and shifted by `tf`."""
    import torch.nn.functional as F

    if tf.is_identity(tuple(x.shape[-2:])):
        return x
    batched = x.ndim == 4
    x = x if batched else x[None]                                          # (B, 3, H, W)
    if tuple(x.shape[-2:]) != tuple(tf.size):
        x = F.interpolate(x.float(), size=tuple(tf.size), mode="bicubic", antialias=True, align_corners=False)
    dy, dx = tf.shift
    if dy or dx:
        H, W = x.shape[-2:]
        if abs(dy) >= H or abs(dx) >= W:
            raise ValueError(f"shift {tf.shift} is not smaller than the image {(H, W)}")
        ay, ax = abs(dy), abs(dx)
        pad = F.pad(x, (ax, ax, ay, ay), mode="constant" if tf.fill == "zero" else "reflect")  # (B, 3, H+2ay, W+2ax)
        x = pad[..., ay - dy: ay - dy + H, ax - dx: ax - dx + W]          # out[y, x] = in[y - dy, x - dx]
    return x if batched else x[0]


def input_norm(ckpt) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The per-channel (mean, std) a checkpoint's inputs are normalised with (`inputs`)."""
    from .data import CIFAR_MEAN, CIFAR_STD
    from .inputs import dataset_of, preprocess_of
    pre = preprocess_of(ckpt)
    if pre is not None:
        return tuple(pre["mean"]), tuple(pre["std"])
    return CIFAR_MEAN[dataset_of(ckpt)], CIFAR_STD[dataset_of(ckpt)]


def input_rgb(x: torch.Tensor, mean, std) -> np.ndarray:
    """A normalised `(3, H, W)` input back to `(H, W, 3)` uint8 (what the model is shown)."""
    import torch

    m = torch.as_tensor(mean, dtype=torch.float32)[:, None, None]
    s = torch.as_tensor(std, dtype=torch.float32)[:, None, None]
    img = ((x.float() * s + m).clamp(0, 1) * 255).round().to(torch.uint8)   # (3, H, W)
    return img.permute(1, 2, 0).numpy()


# ----------------------------------------------------------------------------- following the content
def _cell(pos: np.ndarray, patch_size: int, lower_on_tie: np.ndarray | bool) -> np.ndarray:
    """The index of the patch cell holding pixel position `pos`; a position exactly on a cell
    boundary counts to the lower cell where `lower_on_tie` (else to the upper one)."""
    v = np.asarray(pos, dtype=np.float64) / patch_size
    k = np.floor(v).astype(int)
    return k - ((v == k) & np.asarray(lower_on_tie)).astype(int)


def follow_patch(patch: tuple[int, int], native: tuple[int, int], tf: Transform, patch_size: int
                 ) -> tuple[tuple[int, int], bool]:
    """Where `patch` of the native grid is after `tf`: the new grid's patch holding its moved
    centre (a centre on a boundary, as after a half-patch shift, stays on the side it came
    from), and whether the centre stayed in the image (if not, the nearest edge patch)."""
    sy, sx = tf.scale(native)
    y = (patch[0] + 0.5) * patch_size * sy + tf.shift[0]
    x = (patch[1] + 0.5) * patch_size * sx + tf.shift[1]
    H, W = tf.size[0] // patch_size, tf.size[1] // patch_size
    r, c = int(_cell(y, patch_size, tf.shift[0] > 0)), int(_cell(x, patch_size, tf.shift[1] > 0))
    inside = 0 <= y < tf.size[0] and 0 <= x < tf.size[1]
    return (min(max(r, 0), H - 1), min(max(c, 0), W - 1)), inside


def source_patches(native: tuple[int, int], tf: Transform, patch_size: int) -> np.ndarray:
    """`(N',)`: for each patch of the new grid (row-major), the index in the native grid of the
    patch its centre's content came from (ties as in `follow_patch`, so the two agree), or -1
    where it came from outside the image (filled)."""
    sy, sx = tf.scale(native)
    H, W = tf.size[0] // patch_size, tf.size[1] // patch_size
    Hn, Wn = native[0] // patch_size, native[1] // patch_size
    y = ((np.arange(H) + 0.5) * patch_size - tf.shift[0]) / sy                # source pixel of each row centre
    x = ((np.arange(W) + 0.5) * patch_size - tf.shift[1]) / sx
    r, c = _cell(y, patch_size, tf.shift[0] < 0), _cell(x, patch_size, tf.shift[1] < 0)   # (H,), (W,)
    ok = ((y >= 0) & (y <= native[0]) & (r >= 0) & (r < Hn))[:, None] & \
        ((x >= 0) & (x <= native[1]) & (c >= 0) & (c < Wn))[None, :]          # (H, W)
    return np.where(ok, r[:, None] * Wn + c[None, :], -1).ravel()


def moved_map(m: np.ndarray, src: np.ndarray, grid: Grid) -> np.ndarray:
    """`m (..., Hn, Wn)` on the native grid carried to the new `grid` (NaN where the content
    came from outside): what a map that moves with the content would look like."""
    flat = m.reshape(*m.shape[:-2], -1).astype(np.float64)
    out = np.where(src >= 0, flat[..., np.maximum(src, 0)], np.nan)
    return out.reshape(*m.shape[:-2], *grid)


def shift_error(b0: np.ndarray, b1: np.ndarray, src: np.ndarray) -> float:
    """The README's "bias shift err" for one image (module doc): `b0 (L, h, N, N)` the
    original patch-to-patch bias, `b1 (L, h, N', N')` after the transform, `src (N',)` from
    `source_patches`."""
    keep = np.flatnonzero(src >= 0)
    if keep.size == 0:
        return float("nan")
    s = src[keep]
    num = den = 0.0
    for l0, l1 in zip(b0, b1):
        ref = l0[:, s][:, :, s]                                              # (h, k, k)
        new = l1[:, keep][:, :, keep]
        num += float(np.abs(new - ref).mean())
        den += float(np.abs(ref).mean())
    return num / max(den, 1e-12)


def map_error(expected: np.ndarray, new: np.ndarray) -> float:
    """`mean|new − expected| / mean|expected|` over the cells where `expected` is known."""
    ok = np.isfinite(expected)
    if not ok.any():
        return float("nan")
    return float(np.abs(new[ok] - expected[ok]).mean() / max(np.abs(expected[ok]).mean(), 1e-12))


# ----------------------------------------------------------------------------- what the page shows
@dataclass(frozen=True)
class MapShift:
    """One map of the followed patch, before and after: `expected` the original map carried
    with the content (NaN where it came from outside), `new` the map after the transform,
    `diff = new − expected`, `error = map_error(expected, new)`."""

    expected: np.ndarray      # (H', W')
    new: np.ndarray           # (H', W')
    diff: np.ndarray          # (H', W')
    error: float


def map_shift(before: np.ndarray, after: np.ndarray, src: np.ndarray) -> MapShift:
    """`before (Hn, Wn)` of the chosen patch on the original input, `after (H', W')` of the
    followed patch on the transformed one."""
    expected = moved_map(before, src, after.shape)
    return MapShift(expected, after, after - expected, map_error(expected, after))


@dataclass(frozen=True)
class StressView:
    """Everything the stress section shows for one transform."""

    tf: Transform
    grid: Grid                      # the new grid
    patch: tuple[int, int]          # the followed patch on it
    inside: bool                    # False: the patch's content left the image
    src: np.ndarray                 # (N',) source_patches
    bias: MapShift | None           # the shown bias part at (layer, head), raw; None without a bias
    bias_shown: np.ndarray | None   # (H', W') the new bias map normalised to [0, 1], as the page draws maps
    attention: MapShift
    bias_error: float | None        # shift_error over every layer and head (the README's number)
    same_prediction: bool


def stress_view(before: analysis.Trace, after: analysis.Trace, tf: Transform, native: tuple[int, int],
                patch_size: int, patch: tuple[int, int], layer: int, head: int | None, part: str | None
                ) -> StressView:
    """`before`, `after`: traces of the original and transformed inputs; `part` the bias part
    the page shows (`views.bias_parts`), None for the whole bias row."""
    from .views import bias_view
    new_patch, inside = follow_patch(patch, native, tf, patch_size)
    src = source_patches(native, tf, patch_size)
    m0, m1 = analysis.patch_maps(before, patch), analysis.patch_maps(after, new_patch)
    attn = map_shift(analysis.reduce_head(m0["attn"][layer], head), analysis.reduce_head(m1["attn"][layer], head), src)
    bias = shown = err = None
    if before.bias is not None and after.bias is not None:
        part = part or "row"
        bv0, bv1 = (bias_view(t, m, "", layer, head, part) for t, m in ((before, m0), (after, m1)))
        bias = map_shift(analysis.reduce_head(bv0.full[layer], head), analysis.reduce_head(bv1.full[layer], head), src)
        shown = bv1.shown
        P0, P1 = before.num_prefix, after.num_prefix
        f32 = lambda b, P: np.asarray(b[:, :, P:, P:], dtype=np.float32)         # float16 traces (compact)
        err = shift_error(f32(before.bias, P0), f32(after.bias, P1), src)
    same = int(np.argmax(before.logits)) == int(np.argmax(after.logits))
    return StressView(tf, after.grid, new_patch, inside, src, bias, shown, attn, err, same)
