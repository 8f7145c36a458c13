"""Safe decoding of user-uploaded images, and their preparation as model input.

`load_image` is the one place where untrusted bytes become pixels. It guarantees:

* The result is a fresh 8-bit ``"RGB"`` image of at least 1x1 pixels, or an `ImageError`
  (a `ValueError`) whose message says what was wrong and what to do. No other exception
  type escapes for any input, ``MemoryError`` included.
* Size limits are checked before any pixel is decoded: ``max_bytes`` on the raw data,
  ``max_pixels`` and a 1:100 aspect-ratio limit on the size read from the header. Together
  they bound decode time and memory (roughly proportional to the pixel count). Pillow's own
  ``Image.MAX_IMAGE_PIXELS`` guard stays in force as an outer limit; no global Pillow
  state is changed.
* Only PNG (incl. APNG), JPEG, WebP, GIF, BMP and TIFF are opened; every other format is
  refused without running its parser.
* Truncated or corrupt files are decoded in full (``img.load()``) and refused, never
  returned half-grey.
* Colour is normalised: EXIF orientation applied; transparency composited over white;
  grayscale, palette, CMYK, YCbCr, LAB and HSV converted; 16-bit data scaled (65535 -> 255);
  float data scaled from its min..max; animations reduced to their first frame.

Deliberate deviations / limits:

* Embedded ICC profiles are ignored (pixels are taken as sRGB).
* Mode ``"I"`` (32-bit int) is read as 16-bit when it lies in 0..65535, else min..max scaled.
* Decoding runs inside ``warnings.catch_warnings`` (DecompressionBombWarning -> error, other
  Pillow warnings -> log), which is not thread-safe before Python 3.14: a warning raised by a
  concurrent thread during a decode may be logged here instead of shown there.
"""

from __future__ import annotations

import io
import logging
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

if TYPE_CHECKING:   # torch is imported where it is used: the app draws its first page before torch is loaded
    import torch

__all__ = ["ALLOWED_FORMATS", "ImageError", "ImageInfo", "load_image", "load_image_info", "prepare_for_model"]

logger = logging.getLogger(__name__)

ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
MAX_ASPECT_RATIO = 100
_FORMATS_TEXT = "PNG, JPEG, WebP, GIF, BMP, TIFF"
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


class ImageError(ValueError):
    """An uploaded file was refused; the message says why and what to do next."""


@dataclass(frozen=True)
class ImageInfo:
    """What decoding found out about a file, for notes to the person who uploaded it."""

    format: str                 # Pillow's format name, e.g. "GIF"
    size: tuple[int, int]       # (width, height) as decoded, after EXIF orientation
    frames: int                 # 1 for a still image; 0 = animated, frame count unreadable

    def notes(self) -> list[str]:
        """Plain-language notes on what was done to the file (none for an ordinary still image)."""
        if self.frames == 1:
            return []
        count = f"of {self.frames}" if self.frames else "of several"
        return [f"This is an animated {self.format} image: only its first frame ({count}) is used."]


_PILLOW_PIXELS = re.compile(r"\((\d+) pixels\)")


def load_image(
    data: bytes, *, max_bytes: int = 20 * 2**20, max_pixels: int = 40_000_000
) -> Image.Image:
    """Decode untrusted image bytes into an 8-bit RGB image (see the module guarantees).

    Raises `ImageError` for anything refused, `ValueError` for non-positive limits.
    """
    return load_image_info(data, max_bytes=max_bytes, max_pixels=max_pixels)[0]


def load_image_info(
    data: bytes, *, max_bytes: int = 20 * 2**20, max_pixels: int = 40_000_000
) -> tuple[Image.Image, ImageInfo]:
    """`load_image`, and what decoding found out (`ImageInfo`: format, size, frame count)."""
    if max_bytes <= 0 or max_pixels <= 0:
        raise ValueError(f"max_bytes and max_pixels must be positive, got {max_bytes}, {max_pixels}")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageError(
            f"Expected the file's bytes, got {type(data).__name__}. "
            "Pass the raw content, e.g. `uploaded_file.getvalue()`."
        )
    n_bytes = memoryview(data).nbytes
    if n_bytes == 0:
        raise ImageError("The file is empty (0 bytes). Upload an image file.")
    if n_bytes > max_bytes:
        raise ImageError(
            f"The file is {n_bytes / 2**20:.1f} MiB; the limit is {max_bytes / 2**20:.1f} MiB. "
            "Upload a smaller or more compressed image."
        )
    try:
        return _decode(bytes(data), max_pixels)
    except ImageError:
        raise
    except UnidentifiedImageError as e:
        logger.info("refused upload: %s", e)
        raise ImageError(
            f"This file is not an image Pillow can read ({_FORMATS_TEXT}). Upload one of those."
        ) from e
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        logger.info("refused upload: %s", e)  # Pillow's own guard (its limit is above ours)
        found = _PILLOW_PIXELS.search(str(e))
        pixels = f"{int(found.group(1)):,} pixels" if found else "more pixels than that"
        raise ImageError(_too_many_pixels(f"The image has {pixels}", max_pixels)) from e
    except MemoryError as e:
        logger.warning("out of memory decoding an upload")
        raise ImageError("Ran out of memory decoding the image. Upload a smaller image.") from e
    except Exception as e:  # OSError, SyntaxError, struct.error, EOFError, zlib.error, ...
        logger.info("refused upload: %s: %s", type(e).__name__, e)
        raise ImageError(
            f"The image is damaged or truncated and could not be decoded ({type(e).__name__}: {str(e)[:200]}). "
            "Re-save or re-export it, then upload it again."
        ) from e


def _decode(data: bytes, max_pixels: int) -> tuple[Image.Image, ImageInfo]:
    """Open (allow-listed formats only), check the header size, decode, normalise colour.

    Pillow's warnings about malformed files go to the log instead of stderr.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as img:
                _check_size(img.size, max_pixels)  # header only: nothing decoded yet
                img.load()  # decode the first frame in full: truncation fails here
                rgb = _to_rgb(_apply_orientation(img))
                return rgb, ImageInfo(img.format or "?", rgb.size, _frames(img))
        finally:
            for warning in caught:
                logger.info("Pillow warning while decoding an upload: %s", warning.message)


def _frames(img: Image.Image) -> int:
    """The number of frames (1 for a still image, 0 when an animation's count cannot be read).
    Called after the first frame is decoded and converted: seeking does not touch the result."""
    try:
        if not getattr(img, "is_animated", False):
            return 1
    except Exception:  # a damaged second frame: the first one was fine
        return 1
    try:
        return max(2, int(img.n_frames))
    except Exception:
        return 0


def _check_size(size: tuple[int, int], max_pixels: int) -> None:
    """Refuse empty, too large or too elongated images, from the header size alone."""
    width, height = size
    if width < 1 or height < 1:
        raise ImageError(f"The image has no pixels ({width}x{height}). Upload a non-empty image.")
    if width * height > max_pixels:
        raise ImageError(_too_many_pixels(f"The image is {width}x{height} = {width * height:,} pixels", max_pixels))
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ImageError(
            f"The image is {width}x{height}, more elongated than 1:{MAX_ASPECT_RATIO}. "
            "Crop it to a less extreme aspect ratio and upload it again."
        )


def _too_many_pixels(what: str, max_pixels: int) -> str:
    """The refusal of an image over the pixel limit: its size, the limit, what to do."""
    side = int(max_pixels**0.5)
    return (
        f"{what}; the limit is {max_pixels:,} pixels (about {side:,} x {side:,}), which keeps decoding fast "
        f"and memory bounded. Downscale it (the model sees at most a few hundred pixels a side) and upload it again."
    )


def _apply_orientation(img: Image.Image) -> Image.Image:
    """Rotate/flip as the EXIF orientation tag says; a broken EXIF block is ignored."""
    try:
        return ImageOps.exif_transpose(img)
    except MemoryError:
        raise
    except Exception as e:  # corrupt EXIF must not cost the user a valid picture
        logger.info("ignoring unreadable EXIF orientation: %s", e)
        return img.copy()


def _to_rgb(img: Image.Image) -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB, compositing transparency over white."""
    if img.mode in _SIXTEEN_BIT_MODES or img.mode in ("I", "F"):
        return Image.fromarray(_scale_to_uint8(img.mode, np.asarray(img))).convert("RGB")
    if img.mode in ("RGBa", "La"):  # premultiplied alpha: undo it first
        img = img.convert(img.mode[0:-1] + "A")
    if img.has_transparency_data:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")  # RGB (copy), L, 1, P, CMYK, YCbCr, LAB, HSV, RGBX


def _scale_to_uint8(mode: str, values: np.ndarray) -> np.ndarray:
    """Map 16-bit, 32-bit int or float pixels to uint8: 16-bit by /257, otherwise min..max."""
    values = values.astype(np.float64)
    finite = np.isfinite(values)
    if mode != "F" and (mode != "I" or (values.min() >= 0 and values.max() <= 65535)):
        scaled = values / 257.0  # 65535 -> 255, 32768 -> 127.5 -> 128
    elif finite.any() and values[finite].max() > values[finite].min():
        low, high = values[finite].min(), values[finite].max()
        scaled = (values - low) * (255.0 / (high - low))
    else:  # constant or all-NaN: nothing to show
        scaled = np.zeros_like(values)
    scaled = np.where(finite, scaled, 0.0)
    return np.clip(np.floor(scaled + 0.5), 0, 255).astype(np.uint8)


def prepare_for_model(img: Image.Image, size: tuple[int, int]) -> torch.Tensor:
    """Centre-crop `img` to the aspect ratio of `size` = (H, W), resize (bicubic).

    Returns a float32 tensor of shape (3, H, W) with values in [0, 1].
    """
    import torch

    height, width = size
    if height < 1 or width < 1:
        raise ValueError(f"size must be (height, width) with both >= 1, got {size}")
    fitted = ImageOps.fit(_to_rgb(img), (width, height), method=Image.BICUBIC)
    pixels = np.asarray(fitted, dtype=np.float32) / 255.0  # (H, W, 3)
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()  # (3, H, W)
