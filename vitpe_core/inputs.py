"""What a model is fed and what its outputs are called, read from a checkpoint: the dataset
it was trained on, its class names, an image prepared as its input, and a content key for
an uploaded image. Pure functions (no Streamlit): the app caches them, the benchmark and
the CLI call them directly."""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
from PIL import Image

from .data import CIFAR_MEAN, normalize
from .gallery import CIFAR10_CLASSES
from .images import prepare_for_model

if TYPE_CHECKING:   # torch is imported where it is used: the app draws its first page before torch is loaded
    import torch

    from .checkpoint import Checkpoint


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


def prediction_text(names: Sequence[str], top: int, p: float, truth: str | None, *, imported: bool = False,
                    escape: Callable[[str], str] = str) -> str:
    """"Prediction: **cat** (89.9 %) — true class: cat". `truth` is a gallery image's true class,
    always a CIFAR-10 one (`gallery.gallery_label`): it is paired with the prediction only when the
    model's classes are CIFAR-10's; otherwise the text says the sets differ. An `imported` model
    without class names ("class k") is told how to get them. `escape` makes a name safe for Markdown."""
    text = f"Prediction: **{escape(names[top])}** ({p * 100:.1f} %)"
    if imported and list(names) == [f"class {k}" for k in range(len(names))]:
        text += " (this model's classes have no names: import it with a labels file to name them)"
    if truth is None:
        return text
    if list(names) == list(CIFAR10_CLASSES):
        return f"{text} — true class: {truth}"
    return f"{text} — true class (CIFAR-10): {truth} — this model's classes are another set"


def model_input(img: Image.Image, size: tuple[int, int], dataset: str) -> torch.Tensor:
    """Centre-crop + resize to `size`, normalise with the dataset's mean/std: `(3, H, W)`."""
    import torch

    x = prepare_for_model(img, size)                                     # (3, H, W) in [0, 1]
    x = (x * 255).round().to(torch.uint8)[None]                          # (1, 3, H, W) uint8
    return normalize(x, dataset)[0]                                      # (3, H, W)


def preprocess_of(ckpt: Checkpoint) -> dict | None:
    """An imported model's eval transform (`mean`, `std`, `crop_pct`, as its family uses), or
    None for the project's own models (CIFAR normalisation, no extra crop)."""
    pre = ckpt.metrics.get("preprocess") if isinstance(ckpt.metrics, dict) else None
    return pre if isinstance(pre, dict) and {"mean", "std", "crop_pct"} <= set(pre) else None


def model_crop(img: Image.Image, ckpt: Checkpoint) -> Image.Image:
    """The part of `img` the model sees (RGB, not resized): the largest centred box of the
    model's aspect ratio, shrunk by the eval transform's `crop_pct` (timm: resize the shorter
    side to size / crop_pct, then centre-crop size: the same region)."""
    H, W = ckpt.config.img_size
    pre = preprocess_of(ckpt)
    crop = float(pre["crop_pct"]) if pre else 1.0
    img = img.convert("RGB")
    scale = min(img.width / W, img.height / H) * crop                    # model pixels -> image pixels
    w, h = max(1, round(W * scale)), max(1, round(H * scale))
    left, top = (img.width - w) // 2, (img.height - h) // 2
    return img.crop((left, top, left + w, top + h))


def checkpoint_input(img: Image.Image, ckpt: Checkpoint) -> torch.Tensor:
    """`img` as `ckpt`'s model takes it: `(3, H, W)` float32, cropped, resized (bicubic) and
    normalised as its training data (CIFAR) or its family's eval transform (imported models)."""
    pre = preprocess_of(ckpt)
    if pre is None:
        return model_input(img, ckpt.config.img_size, dataset_of(ckpt))
    import torch

    H, W = ckpt.config.img_size
    x = prepare_for_model(model_crop(img, ckpt), (H, W))                 # (3, H, W) in [0, 1]
    mean = torch.tensor(pre["mean"], dtype=torch.float32)[:, None, None]
    std = torch.tensor(pre["std"], dtype=torch.float32)[:, None, None]
    return (x - mean) / std


def image_key(img: Image.Image) -> str:
    """Cache key of an uploaded image: sha256 of its pixels and size."""
    h = hashlib.sha256(f"{img.size}".encode())
    h.update(np.asarray(img.convert("RGB")).tobytes())
    return "upload-" + h.hexdigest()[:32]


