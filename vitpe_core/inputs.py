"""What a model is fed and what its outputs are called, read from a checkpoint: the dataset
it was trained on, its class names, an image prepared as its input, and a content key for
an uploaded image. Pure functions (no Streamlit): the app caches them, the benchmark and
the CLI call them directly."""
from __future__ import annotations

import hashlib

import numpy as np
import torch
from PIL import Image

from .checkpoint import Checkpoint
from .data import CIFAR_MEAN, normalize
from .gallery import CIFAR10_CLASSES
from .images import prepare_for_model


def dataset_of(ckpt: Checkpoint) -> str:
    """The dataset the model was trained on (for normalisation and class names)."""
    recipe = ckpt.metrics.get("recipe") if isinstance(ckpt.metrics, dict) else None
    name = recipe.get("dataset") if isinstance(recipe, dict) else None
    return name if name in CIFAR_MEAN else "cifar10"


def class_names(ckpt: Checkpoint) -> list[str]:
    """Class names: the metrics' own if present, CIFAR-10's for cifar10, else 'class k'."""
    n = ckpt.config.num_classes
    given = ckpt.metrics.get("class_names") if isinstance(ckpt.metrics, dict) else None
    if isinstance(given, list) and len(given) == n and all(isinstance(s, str) for s in given):
        return given
    if dataset_of(ckpt) == "cifar10" and n == len(CIFAR10_CLASSES):
        return list(CIFAR10_CLASSES)
    return [f"class {k}" for k in range(n)]


def model_input(img: Image.Image, size: tuple[int, int], dataset: str) -> torch.Tensor:
    """Centre-crop + resize to `size`, normalise with the dataset's mean/std: `(3, H, W)`."""
    x = prepare_for_model(img, size)                                     # (3, H, W) in [0, 1]
    x = (x * 255).round().to(torch.uint8)[None]                          # (1, 3, H, W) uint8
    return normalize(x, dataset)[0]                                      # (3, H, W)


def image_key(img: Image.Image) -> str:
    """Cache key of an uploaded image: sha256 of its pixels and size."""
    h = hashlib.sha256(f"{img.size}".encode())
    h.update(np.asarray(img.convert("RGB")).tobytes())
    return "upload-" + h.hexdigest()[:32]


