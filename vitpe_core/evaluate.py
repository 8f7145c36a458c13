"""Evaluation: test accuracy, accuracy at other input sizes, and a translation test.

* `evaluate`: top-1 / top-5 (percent) and mean loss on a dataset, optionally after
  resizing the images (bicubic, antialiased) to another size — the model then runs on
  another grid and each encoding resizes or recomputes itself as docs/encodings.md says.
* `translation_test`: shift the test images by whole and half patches (zero fill, like the
  training crop's padding) and report accuracy and agreement of predictions with the
  unshifted images; for encodings with a bias, how well the bias maps move with the content:
  `bias_shift_error` = mean |b'(i+s, j+s) − b(i, j)| / mean |b| over patch pairs that stay
  inside the grid, for whole-patch shifts (0 = the bias moves exactly with the content).
* `first_images` / `top1_predictions`: a fixed subset (the first `n` images in the split's stored
  order) and the class a model predicts for each of its images; tests/test_shipped_checkpoints.py
  compares them with checkpoints/subset_accuracy.json (scripts/record_subset_accuracy.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .data import ImageDataset, batches, normalize
from .model import ViT

RESOLUTIONS = (24, 32, 40, 48)


def _prepare(x_uint8: torch.Tensor, dataset: str, size: int | None, device) -> torch.Tensor:
    x = normalize(x_uint8.to(device), dataset)                      # (B, 3, 32, 32)
    if size is not None and size != x.shape[-1]:
        x = F.interpolate(x, size=(size, size), mode="bicubic", antialias=True, align_corners=False)
    return x


@torch.no_grad()
def predict(model: ViT, ds: ImageDataset, dataset: str, *, size: int | None = None, shift: tuple[int, int] = (0, 0),
            batch_size: int = 500, device="cpu", progress: bool = False) -> torch.Tensor:
    """Logits `(n, classes)` for the whole dataset (images optionally resized / shifted)."""
    model.eval().to(device)
    out = []
    it = batches(ds, batch_size, shuffle=False)
    for x, _ in tqdm(it, total=math.ceil(len(ds) / batch_size), disable=not progress, desc="eval", leave=False):
        x = shift_images(_prepare(x, dataset, size, device), shift)
        out.append(model(x).float().cpu())
    return torch.cat(out)


def shift_images(x: torch.Tensor, shift: tuple[int, int]) -> torch.Tensor:
    """Translate `(B, C, H, W)` content by `(dy, dx)` pixels, filling with zeros (= the mean
    colour after normalisation)."""
    dy, dx = shift
    if dy == 0 and dx == 0:
        return x
    H, W = x.shape[-2:]
    out = torch.zeros_like(x)
    ys, yd = (slice(0, H - dy), slice(dy, H)) if dy >= 0 else (slice(-dy, H), slice(0, H + dy))
    xs, xd = (slice(0, W - dx), slice(dx, W)) if dx >= 0 else (slice(-dx, W), slice(0, W + dx))
    out[..., yd, xd] = x[..., ys, xs]
    return out


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    top5 = logits.topk(min(5, logits.shape[1]), dim=1).indices                # (n, 5)
    return {"top1": round(100.0 * (top5[:, 0] == labels).float().mean().item(), 2),
            "top5": round(100.0 * (top5 == labels[:, None]).any(1).float().mean().item(), 2),
            "loss": round(F.cross_entropy(logits, labels).item(), 4)}


def evaluate(model: ViT, ds: ImageDataset, dataset: str, *, size: int | None = None, **kw) -> dict[str, float]:
    return accuracy(predict(model, ds, dataset, size=size, **kw), ds.labels)


def first_images(ds: ImageDataset, n: int) -> ImageDataset:
    """The first `n` images of `ds` in its stored order: a subset that needs no random draw to
    reproduce (for CIFAR-10 exported from ../shared, the official test_batch order)."""
    if not 0 < n <= len(ds):
        raise ValueError(f"subset size must be in 1..{len(ds)}, got {n}.")
    return ImageDataset(images=ds.images[:n], labels=ds.labels[:n], label_names=ds.label_names)


def top1_predictions(model: ViT, ds: ImageDataset, dataset: str, **kw) -> tuple[torch.Tensor, float]:
    """The class the model predicts (top-1) for each image of `ds`, and the smallest gap between
    the two largest logits over `ds` (how far the closest call is from flipping under rounding)."""
    logits = predict(model, ds, dataset, **kw)
    top2 = logits.topk(2, dim=1).values                                       # (n, 2)
    return logits.argmax(1), float((top2[:, 0] - top2[:, 1]).min())


def evaluate_resolutions(model: ViT, ds: ImageDataset, dataset: str, sizes=RESOLUTIONS, **kw) -> dict[str, dict]:
    """`{"24": {"top1":…, "top5":…, "grid": [6, 6]}, …}` for each input size."""
    out = {}
    for s in sizes:
        res = evaluate(model, ds, dataset, size=s, **kw)
        res["grid"] = list(model.grid_for((s, s)))
        out[str(s)] = res
    return out


@torch.no_grad()
def bias_shift_error(model: ViT, images: torch.Tensor, patches: tuple[int, int]) -> float | None:
    """How far the bias maps are from moving with the content under a shift by `patches`
    (rows, cols) whole patches; None for encodings without a bias. `images`: normalised
    `(B, 3, H, W)`."""
    p = model.cfg.patch_size
    shifted = shift_images(images, (patches[0] * p, patches[1] * p))
    rec0, rec1 = [], []
    model(images, trace=rec0)
    model(shifted, trace=rec1)
    if rec0[0]["bias"] is None:
        return None
    H, W = model.grid_for(images.shape[-2:])
    P, (sr, sc) = model.num_prefix, patches
    num, den = 0.0, 0.0
    for t0, t1 in zip(rec0, rec1):
        b0 = t0["bias"][..., P:, P:].expand(images.shape[0], -1, -1, -1)   # (B, h, N, N)
        b1 = t1["bias"][..., P:, P:].expand(images.shape[0], -1, -1, -1)
        b0 = b0.reshape(*b0.shape[:2], H, W, H, W)[:, :, : H - sr, : W - sc, : H - sr, : W - sc]
        b1 = b1.reshape(*b1.shape[:2], H, W, H, W)[:, :, sr:, sc:, sr:, sc:]
        num += (b1 - b0).abs().mean().item()
        den += b0.abs().mean().item()
    return round(num / max(den, 1e-12), 4)


def translation_test(model: ViT, ds: ImageDataset, dataset: str, *, batch_size: int = 500, device="cpu",
                     bias_images: int = 64) -> dict[str, dict]:
    """Accuracy and prediction agreement under shifts by half and whole patches."""
    p = model.cfg.patch_size
    base = predict(model, ds, dataset, batch_size=batch_size, device=device)
    base_pred = base.argmax(1)
    shifts = {"half_x": (0, p // 2), "half_y": (p // 2, 0), "whole_x": (0, p), "whole_y": (p, 0),
              "whole_xy": (p, p)}
    out = {}
    probe = normalize(ds.images[:bias_images].to(device), dataset)
    for name, s in shifts.items():
        logits = predict(model, ds, dataset, shift=s, batch_size=batch_size, device=device)
        res = accuracy(logits, ds.labels)
        res["agreement"] = round(100.0 * (logits.argmax(1) == base_pred).float().mean().item(), 2)
        res["shift_px"] = list(s)
        if s[0] % p == 0 and s[1] % p == 0:
            err = bias_shift_error(model, probe, (s[0] // p, s[1] // p))
            if err is not None:
                res["bias_shift_error"] = err
        out[name] = res
    return out


def summarize_table(model: ViT) -> dict | None:
    """2D-structure score of the model's table, if it has one."""
    from .analysis import cosine_similarity, position_table, structure_score
    table = position_table(model)
    if table is None:
        return None
    return {k: round(v, 4) for k, v in structure_score(cosine_similarity(table), model.cfg.grid).items()}


def full_report(model: ViT, ds: ImageDataset, dataset: str, **kw) -> dict:
    """Everything the checkpoint metrics record about a trained model."""
    report = {"test": evaluate(model, ds, dataset, **kw),
              "resolution": evaluate_resolutions(model, ds, dataset, **kw),
              "translation": translation_test(model, ds, dataset, **kw)}
    structure = summarize_table(model)
    if structure is not None:
        report["structure"] = structure
    return report
