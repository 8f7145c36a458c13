"""Batched augmentation of uint8 image batches: random crop and flip, Mixup / CutMix.

Checked against timm's `Mixup` (batch mode, the same pairing with the flipped batch, the same
box sampling and `correct_lam`, the same smoothed one-hot targets).

Deliberate deviations:
  * All randomness comes from an explicit `torch.Generator`, so a run resumes exactly. timm's
    Mixup draws from numpy's global RNG; here numpy is seeded from one value drawn from that
    generator per call (`mixup_cutmix`).
  * `mixup_cutmix` does not modify its input in place (timm does) and does not require an even
    batch (with an odd batch the middle sample is paired with itself).
  * RandAugment is `vitpe_core.randaugment` (timm's `rand-m9-mstd0.5-inc1`, batched on uint8);
    training applies it after `random_crop_flip` and before `data.normalize` with
    `--augment randaug` or `deit`.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A small CPU tensor (the augmentation's draws) on `device`, without waiting for the GPU: on
    CUDA from pinned memory and asynchronously (a copy from pageable memory first waits until
    the GPU's queue has drained, once per copy and step); elsewhere a plain `.to`."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def random_crop_flip(x: torch.Tensor, *, padding: int = 4, generator: torch.Generator) -> torch.Tensor:
    """Zero-pad by `padding`, crop a random `H x W` window per sample, flip half horizontally.

    x: `(B, C, H, W)` (any dtype, usually uint8) -> same shape and dtype. Random draws, in
    order, from `generator` (on the CPU): row offsets `(B,)`, column offsets `(B,)`, flips `(B,)`.
    """
    if x.ndim != 4:
        raise ValueError(f"random_crop_flip expects (B, C, H, W), got {tuple(x.shape)}.")
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}.")
    B, C, H, W = x.shape
    oy = to_device(torch.randint(0, 2 * padding + 1, (B,), generator=generator), x.device)  # (B,)
    ox = to_device(torch.randint(0, 2 * padding + 1, (B,), generator=generator), x.device)  # (B,)
    flip = to_device(torch.rand(B, generator=generator) < 0.5, x.device)  # (B,)
    xp = F.pad(x, (padding, padding, padding, padding))  # (B, C, H+2p, W+2p), zeros
    rows = oy[:, None] + torch.arange(H, device=x.device)  # (B, H)
    cols = ox[:, None] + torch.arange(W, device=x.device)  # (B, W)
    cols = torch.where(flip[:, None], cols.flip(1), cols)  # (B, W), reversed window = flip
    b = torch.arange(B, device=x.device)[:, None, None, None]
    c = torch.arange(C, device=x.device)[None, :, None, None]
    return xp[b, c, rows[:, None, :, None], cols[:, None, None, :]]  # (B, C, H, W)


def _one_hot_smooth(y: torch.Tensor, num_classes: int, smoothing: float, dtype: torch.dtype) -> torch.Tensor:
    off = smoothing / num_classes
    on = 1.0 - smoothing + off
    t = torch.full((y.shape[0], num_classes), off, dtype=dtype, device=y.device)  # (B, K)
    return t.scatter_(1, y[:, None], on)


def mixup_cutmix(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    *,
    mixup_alpha: float = 0.8,
    cutmix_alpha: float = 1.0,
    switch_prob: float = 0.5,
    mix_prob: float = 1.0,
    label_smoothing: float = 0.1,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """timm `Mixup` in batch mode: one lam for the whole batch, sample i mixed with the
    flipped batch (sample B-1-i).

    x: float `(B, C, H, W)`, y: int64 `(B,)` -> (mixed x `(B, C, H, W)`, soft targets
    `(B, num_classes)` whose rows sum to 1). CutMix corrects lam to the pasted box area.
    Exactly one int is drawn from `generator` per call; it seeds numpy for lam and the box.
    """
    if not x.is_floating_point() or x.ndim != 4:
        raise ValueError(f"mixup_cutmix expects float (B, C, H, W) images, got {x.dtype} {tuple(x.shape)}; "
                         "normalize uint8 images first.")
    if y.dtype != torch.int64 or y.shape != x.shape[:1]:
        raise ValueError(f"mixup_cutmix expects int64 labels of shape ({x.shape[0]},), got {y.dtype} {tuple(y.shape)}.")
    if y.device.type == "cpu" and y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):  # no GPU sync
        raise ValueError(f"labels must lie in 0..{num_classes - 1}.")
    if mixup_alpha < 0 or cutmix_alpha < 0:
        raise ValueError("mixup_alpha and cutmix_alpha must be >= 0 (0 turns that one off).")
    if not (0 <= switch_prob <= 1 and 0 <= mix_prob <= 1 and 0 <= label_smoothing < 1):
        raise ValueError("switch_prob and mix_prob must be in [0, 1], label_smoothing in [0, 1).")

    rng = np.random.default_rng(int(torch.randint(2**31, (1,), generator=generator)))
    lam, use_cutmix = 1.0, False
    if (mixup_alpha > 0 or cutmix_alpha > 0) and rng.random() < mix_prob:
        if mixup_alpha > 0 and cutmix_alpha > 0:
            use_cutmix = bool(rng.random() < switch_prob)
        else:
            use_cutmix = cutmix_alpha > 0
        alpha = cutmix_alpha if use_cutmix else mixup_alpha
        lam = float(rng.beta(alpha, alpha))

    if lam == 1.0:
        out = x.clone()
    elif use_cutmix:
        H, W = x.shape[-2:]
        ratio = math.sqrt(1.0 - lam)
        cut_h, cut_w = int(H * ratio), int(W * ratio)
        cy, cx = int(rng.integers(0, H)), int(rng.integers(0, W))
        yl, yh = (int(v) for v in np.clip([cy - cut_h // 2, cy + cut_h // 2], 0, H))
        xl, xh = (int(v) for v in np.clip([cx - cut_w // 2, cx + cut_w // 2], 0, W))
        out = x.clone()
        out[:, :, yl:yh, xl:xh] = x.flip(0)[:, :, yl:yh, xl:xh]
        lam = 1.0 - float((yh - yl) * (xh - xl)) / float(H * W)  # timm correct_lam=True
    else:
        out = x * lam + x.flip(0) * (1.0 - lam)  # (B, C, H, W)

    t = _one_hot_smooth(y, num_classes, label_smoothing, torch.float32)  # (B, K)
    return out, t * lam + t.flip(0) * (1.0 - lam)
