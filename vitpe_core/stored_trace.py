"""A checkpoint's trace of its first gallery image, stored beside it (`NAME.trace.npz`).

The app's first page of a checkpoint (its default view: the bias explorer on the gallery's first
image) is drawn from this file, without loading the model or importing torch: torch's import is
most of a cold start (BENCHMARKS.md section 4), and with this file it runs after the first page is
drawn instead of before. The values are the model's own: `analysis.trace_image(model,
checkpoint_input(image, ckpt), compact=True)`, what the app computes for that view, saved as they
are (float32 for the compact models); a page that needs anything else (another image, the stress
test, another page) loads the model as before.

The file is stamped with the checkpoint's content hash, the image id and this format's version:
a retrained checkpoint, another first image or another format reads as missing, and the app
traces the image itself. `python -m vitpe_core analyze NAME.safetensors` writes it beside the
position analysis; tests/test_shipped_checkpoints.py checks each shipped one against a fresh trace.
"""
from __future__ import annotations

import hashlib
import io
import logging
import zipfile
from pathlib import Path

import numpy as np

from .analysis import Trace

log = logging.getLogger(__name__)

SUFFIX = ".trace.npz"
FORMAT = "vitpe-trace-1"
PART = "part:"          # an npz key per bias part: `part:sape2.x`


def trace_path(checkpoint: str | Path) -> Path:
    """`NAME.trace.npz` beside `NAME.safetensors`."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(checkpoint.stem + SUFFIX)


def _stamp(checkpoint: Path, image_id: str) -> str:
    with open(checkpoint, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return f"{FORMAT} {digest} {image_id}"


def trace_first_image(ckpt) -> tuple[str, Trace]:
    """(the gallery's first image id, its trace through `ckpt`): what the app draws first for a
    checkpoint and `pages.common.cache.trace` computes when nothing is stored."""
    from .analysis import trace_image
    from .gallery import gallery_ids, gallery_image
    from .inputs import checkpoint_input

    image_id = gallery_ids()[0]
    return image_id, trace_image(ckpt.model, checkpoint_input(gallery_image(image_id), ckpt), compact=True)


def write_trace(checkpoint: str | Path, image_id: str, trace: Trace) -> Path:
    """Store `trace` (of gallery image `image_id` through checkpoint `checkpoint`) beside it."""
    from .checkpoint import atomic_write_bytes

    arrays = {"stamp": np.array(_stamp(Path(checkpoint), image_id)), "grid": np.array(trace.grid),
              "num_prefix": np.array(trace.num_prefix), "prefix": np.array(trace.prefix, dtype=str),
              "hooks": np.array(trace.hooks, dtype=str), "bias_sources": np.array(trace.bias_sources, dtype=str),
              "logits": trace.logits, "attn": trace.attn,
              **({"bias": trace.bias} if trace.bias is not None else {}),
              **{PART + k: v for k, v in trace.parts.items()}}
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    path = trace_path(checkpoint)
    atomic_write_bytes(path, buf.getvalue())
    return path


def is_current(checkpoint: str | Path, image_id: str) -> bool:
    """Whether a trace of gallery image `image_id` is stored for this version of the checkpoint
    (its stamp alone is read, not its arrays)."""
    path = trace_path(checkpoint)
    try:
        with np.load(path, allow_pickle=False) as z:
            return str(z["stamp"]) == _stamp(Path(checkpoint), image_id)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):   # missing or damaged
        return False


def read_trace(checkpoint: str | Path, image_id: str) -> Trace | None:
    """The stored trace of gallery image `image_id`, or None when there is none for this image
    and this version of the checkpoint (missing, unreadable, stale: the caller traces it)."""
    path = trace_path(checkpoint)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["stamp"]) != _stamp(Path(checkpoint), image_id):
                return None
            H, W = (int(v) for v in z["grid"])
            names = lambda key: tuple(str(s) for s in z[key])     # noqa: E731
            return Trace((H, W), int(z["num_prefix"]), z["logits"], z["attn"], z["bias"] if "bias" in z else None,
                         {k[len(PART):]: z[k] for k in z.files if k.startswith(PART)}, prefix=names("prefix"),
                         hooks=names("hooks"), bias_sources=names("bias_sources"))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:   # damaged: traced instead, logged
        log.warning("stored trace %s not used (%s); tracing the image instead", path, e)
        return None
