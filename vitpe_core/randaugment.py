"""RandAugment on batched uint8 image tensors, as DeiT trains with it (timm `rand-m9-mstd0.5-inc1`).

Paper: Cubuk et al., "RandAugment: Practical automated data augmentation with a reduced search
space", arXiv:1909.13719. The setting is timm's (`timm/data/auto_augment.py`:
`rand_augment_transform`, `_RAND_INCREASING_TRANSFORMS`, `AugmentOp`) as DeiT (arXiv:2012.12877)
uses it: 2 layers, each picks one of 15 ops uniformly (with replacement) and applies it with
probability 0.5 at a magnitude drawn from N(9, 0.5) clipped to [0, 10]; signed ops flip sign 50/50.

timm runs PIL on one image at a time in data-loader workers. Here the training loop augments
pre-decoded uint8 batches (`vitpe_core.data` keeps whole splits in memory), so every op works on
the whole batch at once with per-sample magnitudes and signs: a Python loop runs over the 15 ops
and the layers, never over samples.

Checked against: Pillow 13 applied image by image the way timm's op functions call it
(`PIL.ImageOps`, `PIL.ImageEnhance`, `Image.transform(AFFINE, NEAREST)`, `Image.rotate`) in
`tests/test_randaugment.py`, on square and non-square images at several magnitudes and both
signs: every op is pixel-identical to PIL (the tests allow 1 level on the colour ops and 99.9%
of pixels on the geometric ones).

How each op matches PIL:
  * Point ops (AutoContrast, Equalize, Invert, Posterize, Solarize, SolarizeAdd) apply PIL's
    lookup tables, per image and channel where PIL's depends on the histogram; AutoContrast's
    table is computed in float64 because PIL computes it with Python floats (float32, or exact
    integer division, is off by one level on ~0.2% of the table entries).
  * Enhance ops use PIL's degenerate images (integer "L" conversion
    `(19595 R + 38470 G + 7471 B + 2**15) >> 16`, the rounded mean of L, black, the rounded
    SMOOTH filter with border pixels kept) and `Image.blend`'s float32 `d + f * (x - d)`,
    truncated and clipped to 0..255.
  * Geometric ops build PIL's affine matrix (output pixel centre -> input coordinates) per
    sample, quantized to 16.16 fixed point as PIL's `affine_fixed` does for rotate and shear,
    and sample it with one `F.affine_grid` + `F.grid_sample(mode="nearest")`. PIL floors the
    input coordinate, grid_sample rounds `coordinate - 0.5` half to even; a bias of 2**-17 pixel
    (half of PIL's fixed-point step, above float32 grid error) makes the two agree at ties too.
    Exact up to 64 x 64 images; from ~96 x 96 float32 grid error flips about 1 pixel in 10^5.

Deliberate deviations:
  * Geometric ops use nearest-neighbour sampling and fill with grey 128. timm's DeiT pipeline
    (`transforms_imagenet_train`) passes bicubic interpolation and fills with the ImageNet mean
    (124, 116, 104); nearest keeps uint8 values exact and small CIFAR images sharp.
  * PosterizeIncreasing at magnitude 10 keeps 0 bits (a black image), as timm intends and old
    Pillow and TF do; the pinned Pillow 13 refuses `posterize(img, 0)`, so timm itself raises
    there (with mstd0.5 about 2% of the magnitudes are clipped to 10).
  * All randomness comes from an explicit `torch.Generator` (timm uses Python's `random` and
    numpy's global RNG), so a run resumes exactly.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from .augment import to_device

Tensor = torch.Tensor

OPS: tuple[str, ...] = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "PosterizeIncreasing",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
SIGNED_OPS: frozenset[str] = frozenset({
    "Rotate", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
    "SharpnessIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel",
})

_LEVEL_DENOM = 10.0  # timm: magnitude m on 0..10 -> fraction m / 10 of each op's range
_FILL = 128.0  # timm's _FILL (128, 128, 128)
_TIE_BIAS = 2.0**-17  # pixels: half of PIL's 2**-16 fixed-point step, above float32 grid error


# --------------------------------------------------------------------------- validation


def _check_images(x: Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4 or x.shape[1] != 3:
        got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} expects uint8 RGB images of shape (B, 3, H, W), got {got}.")


def _per_sample(v: Tensor | float, B: int, name: str) -> Tensor:
    """A scalar or (B,) value as a (B,) float64 CPU tensor."""
    t = torch.as_tensor(v, dtype=torch.float64).detach().cpu()
    if t.ndim == 0:
        t = t.expand(B)
    if t.shape != (B,):
        raise ValueError(f"{name} must be a scalar or have shape ({B},), got {tuple(t.shape)}.")
    return t


# --------------------------------------------------------------------------- point ops


def _apply_lut(x: Tensor, lut: Tensor) -> Tensor:
    """x (B, 3, H, W) uint8, lut (B, 3, 256) integer in 0..255 -> (B, 3, H, W) uint8."""
    B, C, H, W = x.shape
    idx = x.reshape(B, C, H * W).long()  # (B, 3, HW)
    return lut.gather(2, idx).reshape(B, C, H, W).to(torch.uint8)  # (B, 3, H, W)


def _auto_contrast(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    lo = x.amin(dim=(2, 3)).double()[..., None]  # (B, 3, 1)
    hi = x.amax(dim=(2, 3)).double()[..., None]  # (B, 3, 1)
    i = torch.arange(256, dtype=torch.float64, device=x.device)  # (256,)
    span = (hi - lo).clamp(min=1.0)  # (B, 3, 1)
    scale = torch.full_like(span, 255.0) / span  # tensor / tensor divides; scalar / tensor
    # multiplies by a reciprocal, which is 1 ulp off PIL's Python float here and there
    lut = (i * scale + (-lo * scale)).trunc().clamp(0, 255)  # (B, 3, 256), PIL's float LUT
    lut = torch.where(hi > lo, lut, i)  # flat channel: identity
    return _apply_lut(x, lut.long())


def _equalize(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    B, C, H, W = x.shape
    idx = x.reshape(B, C, H * W).long()  # (B, 3, HW)
    hist = torch.zeros(B, C, 256, dtype=torch.int64, device=x.device).scatter_add_(
        2, idx, torch.ones_like(idx))  # (B, 3, 256)
    bins = torch.arange(256, device=x.device)  # (256,)
    last = torch.where(hist > 0, bins, 0).amax(dim=2, keepdim=True)  # (B, 3, 1) last nonzero bin
    step = (H * W - hist.gather(2, last)) // 255  # (B, 3, 1)
    before = hist.cumsum(2) - hist  # (B, 3, 256) pixels in bins below i
    lut = ((step // 2 + before) // step.clamp(min=1)).clamp(max=255)  # (B, 3, 256)
    lut = torch.where(step > 0, lut, bins)  # PIL: step 0 -> identity
    return _apply_lut(x, lut)


def _invert(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    return 255 - x


def _posterize(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    keep = 4 - (frac * 4).trunc().long()  # (B,) bits kept, 4 .. 0
    mask = (255 - (2 ** (8 - keep) - 1)).to(torch.uint8)  # (B,) top `keep` bits set
    return x & to_device(mask, x.device)[:, None, None, None]


def _solarize(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    thresh = 256 - (frac * 256).trunc().long()  # (B,) 256 .. 0
    thresh = to_device(thresh, x.device)[:, None, None, None]
    return torch.where(x.long() >= thresh, 255 - x, x)


def _solarize_add(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    add = to_device((frac * 110).trunc().long(), x.device)[:, None, None, None]  # (B, 1, 1, 1)
    added = (x.long() + add).clamp(max=255).to(torch.uint8)
    return torch.where(x < 128, added, x)


# --------------------------------------------------------------------------- enhance ops


def _blend(degenerate: Tensor, x: Tensor, factor: Tensor) -> Tensor:
    """PIL `Image.blend(degenerate, x, factor)`: float32 `d + f * (x - d)`, truncated, clipped.

    degenerate: integer-valued float32, broadcastable to x (B, 3, H, W) uint8; factor (B,).
    """
    f = to_device(factor.to(torch.float32), x.device)[:, None, None, None]  # (B, 1, 1, 1)
    out = degenerate + f * (x.float() - degenerate)  # (B, 3, H, W)
    return out.trunc().clamp(0, 255).to(torch.uint8)


def _enhance_factor(frac: Tensor, sign: Tensor) -> Tensor:
    return (1.0 + sign * frac * 0.9).clamp(min=0.1)  # (B,), timm keeps it >= 0.1


def _grey(x: Tensor) -> Tensor:
    """PIL's RGB -> L conversion: (B, 3, H, W) uint8 -> (B, 1, H, W) int32."""
    r, g, b = x.int().unbind(1)  # 3 x (B, H, W)
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16)[:, None]  # (B, 1, H, W)


def _color(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    return _blend(_grey(x).float(), x, _enhance_factor(frac, sign))


def _contrast(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    grey = _grey(x).long()  # (B, 1, H, W)
    n = grey[0].numel()
    mean = (2 * grey.sum(dim=(1, 2, 3)) + n) // (2 * n)  # (B,) == int(mean + 0.5), exactly
    return _blend(mean.float()[:, None, None, None], x, _enhance_factor(frac, sign))


def _brightness(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    return _blend(torch.zeros((), device=x.device), x, _enhance_factor(frac, sign))


def _smooth(x: Tensor) -> Tensor:
    """PIL `ImageFilter.SMOOTH`: [[1,1,1],[1,5,1],[1,1,1]] / 13 rounded, border pixels kept.

    x: (B, 3, H, W) uint8 -> (B, 3, H, W) float32, integer-valued.
    """
    B, C, H, W = x.shape
    xf = x.float()
    if H < 3 or W < 3:
        return xf  # no interior pixels
    kernel = torch.ones(3, 3, device=x.device)
    kernel[1, 1] = 5.0
    kernel = kernel.expand(C, 1, 3, 3)  # (3, 1, 3, 3) depthwise
    s = F.conv2d(xf, kernel, groups=C)  # (B, 3, H-2, W-2), exact integer sums
    out = xf.clone()
    out[:, :, 1:-1, 1:-1] = torch.round(s / 13.0)  # 13 is odd: never a tie
    return out


def _sharpness(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    return _blend(_smooth(x), x, _enhance_factor(frac, sign))


# --------------------------------------------------------------------------- geometric ops


def _warp(x: Tensor, mat: Tensor) -> Tensor:
    """PIL `Image.transform(size, AFFINE, mat, NEAREST, fillcolor=128)` on the whole batch.

    mat: (B, 2, 3) float64, PIL's matrix: input (x, y) = mat @ (x, y, 1) for output coordinates
    whose pixel centres sit at +0.5. Sampled with one nearest-neighbour grid_sample; the output
    pixels whose source falls outside the image are filled with 128 (found by sampling a mask).
    """
    B, C, H, W = x.shape
    m = mat.to(torch.float64)
    # normalized coordinates (align_corners=False): g = d * u - 1, d = (2 / W, 2 / H)
    d = torch.tensor([2.0 / W, 2.0 / H], dtype=torch.float64)  # (2,)
    K = m[:, :, :2] * d[None, :, None] / d[None, None, :]  # (B, 2, 2), diag(d) M diag(d)^-1
    t = m[:, :, 2] + _TIE_BIAS  # (B, 2); grid_sample rounds u - 0.5, PIL floors u
    theta = torch.cat([K, (K.sum(2) + d * t - 1.0)[..., None]], dim=2)  # (B, 2, 3)
    theta = to_device(theta.to(torch.float32), x.device)
    grid = F.affine_grid(theta, [B, C + 1, H, W], align_corners=False)  # (B, H, W, 2)
    src = torch.cat([x.float(), x.new_ones(B, 1, H, W, dtype=torch.float32)], dim=1)  # (B, 4, H, W)
    out = F.grid_sample(src, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    rgb, inside = out[:, :C], out[:, C:] > 0.5  # (B, 3, H, W), (B, 1, H, W)
    return torch.where(inside, rgb, _FILL).round().to(torch.uint8)


def _affine(a: Tensor, b: Tensor, c: Tensor, d: Tensor, e: Tensor, f: Tensor) -> Tensor:
    """Six (B,) float64 coefficients -> (B, 2, 3) PIL AFFINE matrices."""
    return torch.stack([torch.stack([a, b, c], 1), torch.stack([d, e, f], 1)], 1)  # (B, 2, 3)


def _fix16(v: Tensor) -> Tensor:
    """PIL's `FIX(v)`: round to the nearest multiple of 2**-16 (float64 in, float64 out)."""
    return torch.floor(v * 65536.0 + 0.5) / 65536.0


def _fixed_point(mat: Tensor) -> Tensor:
    """The matrix PIL's `affine_fixed` (rotate, shear) actually applies: 16.16 fixed point.

    PIL rounds the per-pixel steps and the coordinate of output pixel (0, 0) to multiples of
    2**-16; a source coordinate near a pixel edge can land on the other side of it.
    """
    lin = _fix16(mat[:, :, :2])  # (B, 2, 2)
    origin = _fix16(mat[:, :, 2] + 0.5 * mat[:, :, :2].sum(2))  # (B, 2) at output pixel centre (0.5, 0.5)
    return torch.cat([lin, (origin - 0.5 * lin.sum(2))[..., None]], dim=2)  # (B, 2, 3)


def _rotate(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    """PIL `Image.rotate(angle)` (counter-clockwise, about (W / 2, H / 2)), angle = 30 m sign."""
    H, W = x.shape[-2:]
    theta = -torch.deg2rad(frac * 30.0 * sign)  # (B,) PIL negates the angle
    cos, sin = torch.cos(theta), torch.sin(theta)
    cx, cy = W / 2.0, H / 2.0
    mat = _affine(cos, sin, cos * -cx + sin * -cy + cx, -sin, cos, -sin * -cx + cos * -cy + cy)  # (B, 2, 3)
    return _warp(x, _fixed_point(mat))


def _shear_x(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    s = frac * 0.3 * sign  # (B,)
    one, zero = torch.ones_like(s), torch.zeros_like(s)
    return _warp(x, _fixed_point(_affine(one, s, zero, zero, one, zero)))


def _shear_y(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    s = frac * 0.3 * sign  # (B,)
    one, zero = torch.ones_like(s), torch.zeros_like(s)
    return _warp(x, _fixed_point(_affine(one, zero, zero, s, one, zero)))


def _translate_x(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    t = frac * 0.45 * sign * x.shape[-1]  # (B,) pixels
    one, zero = torch.ones_like(t), torch.zeros_like(t)
    return _warp(x, _affine(one, zero, t, zero, one, zero))


def _translate_y(x: Tensor, frac: Tensor, sign: Tensor) -> Tensor:
    t = frac * 0.45 * sign * x.shape[-2]  # (B,) pixels
    one, zero = torch.ones_like(t), torch.zeros_like(t)
    return _warp(x, _affine(one, zero, zero, zero, one, t))


_OP_FNS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "AutoContrast": _auto_contrast,
    "Equalize": _equalize,
    "Invert": _invert,
    "Rotate": _rotate,
    "PosterizeIncreasing": _posterize,
    "SolarizeIncreasing": _solarize,
    "SolarizeAdd": _solarize_add,
    "ColorIncreasing": _color,
    "ContrastIncreasing": _contrast,
    "BrightnessIncreasing": _brightness,
    "SharpnessIncreasing": _sharpness,
    "ShearX": _shear_x,
    "ShearY": _shear_y,
    "TranslateXRel": _translate_x,
    "TranslateYRel": _translate_y,
}
assert tuple(_OP_FNS) == OPS


# --------------------------------------------------------------------------- public API


def apply_op(x: Tensor, op: str, magnitude: Tensor | float, sign: Tensor | None = None) -> Tensor:
    """Apply one RandAugment op to every image of a batch, as timm's `AugmentOp` does with PIL.

    x: `(B, 3, H, W)` uint8 -> `(B, 3, H, W)` uint8 (a new tensor). magnitude: timm's 0..10
    scale, a scalar or per-sample `(B,)`. sign: `(B,)` of +1 / -1 for the signed ops
    (`SIGNED_OPS`; default +1), ignored by the others. Level arguments are computed in float64
    exactly as timm computes them with Python floats (e.g. `int(m / 10 * 256)`).
    """
    _check_images(x, "apply_op")
    if op not in _OP_FNS:
        raise ValueError(f"unknown RandAugment op {op!r}; valid ops: {', '.join(OPS)}.")
    B = x.shape[0]
    mag = _per_sample(magnitude, B, "magnitude")  # (B,)
    if not bool(((mag >= 0) & (mag <= _LEVEL_DENOM)).all()):
        raise ValueError(f"magnitude must lie in [0, {_LEVEL_DENOM:g}] (timm's scale), "
                         f"got values in [{mag.min().item():g}, {mag.max().item():g}].")
    sgn = torch.ones(B, dtype=torch.float64) if sign is None else _per_sample(sign, B, "sign")  # (B,)
    if not bool((sgn.abs() == 1).all()):
        raise ValueError("sign must hold only +1 or -1.")
    if B == 0:
        return x.clone()
    return _OP_FNS[op](x, mag / _LEVEL_DENOM, sgn)


def rand_augment(
    x: Tensor,
    *,
    generator: torch.Generator,
    num_ops: int = 2,
    magnitude: float = 9.0,
    magnitude_std: float = 0.5,
    prob: float = 0.5,
) -> Tensor:
    """timm's RandAugment (`rand-m9-mstd0.5-inc1` by default) on a whole batch.

    x: `(B, 3, H, W)` uint8 -> same shape and dtype (a new tensor; x is not modified). For each
    of `num_ops` layers every sample draws one op of `OPS` uniformly (with replacement across
    layers, as timm), applies it with probability `prob` at a magnitude ~ N(magnitude,
    magnitude_std) clipped to [0, 10] (uniform in [0, magnitude] if magnitude_std is inf, as
    timm's `mstd` > 100), with a random sign 50/50 for the signed ops. Random draws per layer,
    in order, from `generator` (on the CPU): op indices `(B,)`, apply coins `(B,)`, magnitude
    noise `(B,)`, signs `(B,)`; all are drawn whatever is applied, so the stream only depends on B.
    """
    _check_images(x, "rand_augment")
    if isinstance(num_ops, bool) or not isinstance(num_ops, int) or num_ops < 0:
        raise ValueError(f"num_ops must be an int >= 0, got {num_ops!r}.")
    if not 0.0 <= magnitude <= _LEVEL_DENOM:
        raise ValueError(f"magnitude must lie in [0, {_LEVEL_DENOM:g}] (timm's scale), got {magnitude!r}.")
    if not magnitude_std >= 0.0:
        raise ValueError(f"magnitude_std must be >= 0 (inf: uniform in [0, magnitude]), got {magnitude_std!r}.")
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"prob must lie in [0, 1], got {prob!r}.")

    B = x.shape[0]
    out = x.clone()
    for _ in range(num_ops):
        op_idx = torch.randint(len(OPS), (B,), generator=generator)  # (B,)
        applied = torch.rand(B, generator=generator, dtype=torch.float64) < prob  # (B,)
        if math.isinf(magnitude_std):
            mag = torch.rand(B, generator=generator, dtype=torch.float64) * magnitude  # (B,)
        else:
            noise = torch.randn(B, generator=generator, dtype=torch.float64)  # (B,)
            mag = (magnitude + magnitude_std * noise).clamp(0.0, _LEVEL_DENOM)  # (B,)
        sign = torch.where(torch.rand(B, generator=generator) < 0.5, -1.0, 1.0).double()  # (B,)
        for k, op in enumerate(OPS):
            rows = ((op_idx == k) & applied).nonzero().squeeze(1)  # (b,) samples getting op k
            if rows.numel() == 0:
                continue
            rows_dev = to_device(rows, x.device)
            out[rows_dev] = apply_op(out[rows_dev], op, mag[rows], sign[rows])  # (b, 3, H, W)
    return out
