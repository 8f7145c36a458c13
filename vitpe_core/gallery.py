"""Sample images for the app, without Streamlit: 12 CIFAR-10 test images and a few photos.

* CIFAR-10 test images are 32x32 PNGs in `vitpe_core/assets/gallery/` (written by
  `scripts/make_gallery.py`), ids `cifar10-test-NNNN` (NNNN = index in the test split),
  with their true classes in `index.json`.
* Photos come from scikit-image's bundled data (no download), ids `photo-NAME`; skimage is
  imported only when a photo is opened (its import takes about a second).

`gallery_image(id)` returns a fresh RGB `PIL.Image`; an unknown id is a `ValueError`
listing the valid ones.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

from PIL import Image

ASSETS = Path(__file__).resolve().parent / "assets" / "gallery"

CIFAR10_CLASSES: tuple[str, ...] = ("airplane", "automobile", "bird", "cat", "deer",
                                    "dog", "frog", "horse", "ship", "truck")

# id -> (skimage.data function, caption)
PHOTOS: dict[str, tuple[str, str]] = {
    "photo-astronaut": ("astronaut", "astronaut (Eileen Collins)"),
    "photo-chelsea": ("chelsea", "Chelsea the cat"),
    "photo-coffee": ("coffee", "a cup of coffee"),
    "photo-rocket": ("rocket", "a rocket on the launch pad"),
    "photo-camera": ("camera", "cameraman (grayscale)"),
}


@functools.lru_cache(maxsize=1)
def _cifar_index() -> dict[str, str]:
    path = ASSETS / "index.json"
    if not path.is_file():
        return {}
    index = json.loads(path.read_text())
    return {k: v for k, v in sorted(index.items()) if (ASSETS / f"{k}.png").is_file()}


def gallery_ids() -> list[str]:
    """CIFAR-10 test images first (in test-set order), then the photos."""
    return [*_cifar_index(), *PHOTOS]


def gallery_label(image_id: str) -> str | None:
    """The true CIFAR-10 class of a gallery image, None for photos and unknown ids."""
    return _cifar_index().get(image_id)


def gallery_caption(image_id: str) -> str:
    if image_id in PHOTOS:
        return f"photo: {PHOTOS[image_id][1]}"
    label = gallery_label(image_id)
    if label is not None:
        return f"CIFAR-10 test #{int(image_id.rsplit('-', 1)[1])}: {label}"
    return image_id


def gallery_image(image_id: str) -> Image.Image:
    """The gallery image `image_id` as a fresh 8-bit RGB image."""
    if image_id in _cifar_index():
        with Image.open(ASSETS / f"{image_id}.png") as img:
            return img.convert("RGB")
    if image_id in PHOTOS:
        return _photo(image_id).copy()
    raise ValueError(f"unknown gallery image {image_id!r}; valid: {gallery_ids()}")


@functools.lru_cache(maxsize=len(PHOTOS))
def _photo(image_id: str) -> Image.Image:
    import skimage.data  # slow import: only when a photo is asked for

    pixels = getattr(skimage.data, PHOTOS[image_id][0])()   # (h, w, 3) or (h, w) uint8
    return Image.fromarray(pixels).convert("RGB")
