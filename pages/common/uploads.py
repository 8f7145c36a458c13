"""The image a page shows: a sample of the gallery or the visitor's upload, and how it is fitted
to a checkpoint's input.

An accepted image upload (decoded, at most `MAX_UPLOAD_SIDE` px a side) is put, as PNG, in the
server's upload store (`upload_store.image_store`) and becomes the view's image `upload:<sha256>`: it
follows the visitor from page to page until another is uploaded, a sample image is chosen or it
is cleared, and a share link carrying it opens the same image for anyone on this server (an
evicted one falls back to the first sample image with a warning, see `viewsync.current_view`).
A refused file is said on the page while it stays in its uploader.

An image that the model's centre crop would cut leaves the choice to pad it instead (letterbox,
`FIT`, one choice for every page of the session).
"""
from __future__ import annotations

import logging

import streamlit as st
from PIL import Image

from vitpe_core import views
from vitpe_core.gallery import gallery_caption, gallery_ids, gallery_image
from vitpe_core.images import ALLOWED_FORMATS, ImageError, load_image_info
from vitpe_core.inputs import preprocess_of
from vitpe_core.viewstate import is_upload_id

from . import cache, upload_store
from .messages import escape_md
from .viewsync import short_id
from .widgets import bound

log = logging.getLogger(__name__)

UPLOAD = "_vitpe_upload"   # this session's uploaded image: {"name", "id" (upload:<sha256>), "notes", "original" (w, h)}
UPLOAD_GEN = "_vitpe_upload_gen"   # bumped when the upload is set aside: the uploaders start empty
UPLOAD_ERROR = "_vitpe_upload_error"   # (uploader key, why its file was refused), shown while the file is there
FIT = "_vitpe_fit"                 # "crop" (the model's centre crop) or "pad" (letterbox): for every page
UPLOAD_TYPES = ["png", "jpg", "jpeg", "webp", "gif", "bmp", "tif", "tiff"]
MAX_IMAGE_UPLOAD_MB = 20   # the image uploader's own limit (the server allows more, for models)
MAX_UPLOAD_SIDE = 1024   # uploads are shrunk to this after decoding (the model sees 32 px)


@cache.budgeted("decoded uploads", max_items=8)
def _decode(data: bytes) -> tuple[Image.Image, list[str], tuple[int, int]] | str:
    try:
        img, info = load_image_info(data)
    except ImageError as e:
        return str(e)
    original = img.size
    img.thumbnail((MAX_UPLOAD_SIDE, MAX_UPLOAD_SIDE), Image.LANCZOS)
    return img, info.notes(), original


def decode_upload(data: bytes) -> tuple[Image.Image | None, str | None, list[str], tuple[int, int] | None]:
    """Uploaded bytes -> (RGB image, None, notes on what was done to the file: an animation's
    first frame, its original size (width, height)) or (None, the reason it was refused, [],
    None). Decoding is `images.load_image_info`; large images are shrunk to `MAX_UPLOAD_SIDE` px
    on the long side (`shrunk_text` says so)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None, f"Expected the file's bytes, got {type(data).__name__}.", [], None
    out = _decode(bytes(data))
    return (None, out, [], None) if isinstance(out, str) else (out[0], None, out[1], out[2])


def decode_upload_notes(data: bytes) -> tuple[Image.Image | None, str | None, list[str]]:
    """`decode_upload` without the original size."""
    return decode_upload(data)[:3]


def shrunk_text(original: tuple[int, int] | None, size: tuple[int, int]) -> str | None:
    """"your 1400×1000 image, shrunk to 1024×731 px for the server" for an upload that was
    shrunk, else None."""
    if original is None or tuple(original) == tuple(size):
        return None
    return f"your {original[0]}×{original[1]} image, shrunk to {size[0]}×{size[1]} px for the server"


def clear_upload() -> None:
    """Set this session's uploaded image aside (the first sample image is shown again, unless a
    sample was just chosen); the uploaders start empty. The store keeps the file for links."""
    ss = st.session_state
    if ss.pop(UPLOAD, None) is not None:
        ss[UPLOAD_GEN] = ss.get(UPLOAD_GEN, 0) + 1
    if is_upload_id(ss.get("image")):
        ids = gallery_ids()
        ss["image"] = ids[0] if ids else ""


def _uploader_key(prefix: str) -> str:
    gen = st.session_state.get(UPLOAD_GEN, 0)
    return f"{prefix}_upload" + (f"_{gen}" if gen else "")


def _upload_changed(key: str) -> None:
    """The uploader's callback: a new file replaces the session's upload (or is refused, the
    reason shown while the file stays in that uploader); removing the file clears the upload."""
    ss = st.session_state
    up = ss.get(key)
    ss.pop(UPLOAD_ERROR, None)
    if up is None:
        clear_upload()
        return
    img, err, notes, original = decode_upload(up.getvalue())
    if err is not None:
        ss[UPLOAD_ERROR] = (key, f"{up.name}: {err}")
        ss.pop(UPLOAD, None)
        return
    try:
        image_id = upload_store.store_upload(img)
    except OSError as e:
        log.warning("upload store not writable: %s", e)
        ss[UPLOAD_ERROR] = (key, f"{up.name} could not be kept on the server ({type(e).__name__}); try again later.")
        return
    ss[UPLOAD] = {"name": up.name, "id": image_id, "notes": notes, "original": original}
    ss["image"] = image_id


def image_source(prefix: str) -> tuple[Image.Image, str, str, bool]:
    """Gallery choice (bound to the view's `image`) or this session's upload (kept across
    pages until another file is uploaded, a sample is chosen or it is cleared).
    Returns (image, cache key, caption, is_upload)."""
    ss = st.session_state
    ids = gallery_ids()
    current = ss.get("image", "")
    held = ss.get(UPLOAD) if (ss.get(UPLOAD) or {}).get("id") == current else None
    img = upload_store.stored_image(current) if is_upload_id(current) else None
    if img is None and is_upload_id(current):          # evicted since the view was checked
        clear_upload()
        current, held = ss.get("image", ""), None
    # What the upload is called: the visitor's own file by its name, a link's by its id.
    name = f"your upload: {held['name']}" if held else f"shared upload {short_id(current)}…"

    def label(i: str) -> str:
        return name if is_upload_id(i) else gallery_caption(i)

    bound(st.selectbox, f"{prefix}_image", "image", label="Sample image", options=ids + ([current] if img else []),
          format_func=label, then=clear_upload)
    key = _uploader_key(prefix)
    st.file_uploader(f"…or upload an image ({', '.join(sorted(ALLOWED_FORMATS))})", type=UPLOAD_TYPES,
                     key=key, max_upload_size=MAX_IMAGE_UPLOAD_MB, on_change=_upload_changed, args=(key,),
                     help="Kept on this server (the oldest uploads make room for new ones): the share link "
                          "opens it for anyone who can reach this server.")
    st.caption(f"Images up to {MAX_IMAGE_UPLOAD_MB} MB. A larger file is refused by the browser before it is "
               "sent (its name turns red, nothing else happens): shrink the image or save it as JPEG, and "
               "upload it again.")
    error = ss.get(UPLOAD_ERROR)
    if error and error[0] == key and ss.get(key) is not None:
        st.error(error[1])
    if img is None:
        return gallery_image(current), current, gallery_caption(current), False
    what = f"your upload **{escape_md(held['name'])}** (`{short_id(current)}`)" if held else \
        f"the shared upload `{short_id(current)}…`"
    shrunk = shrunk_text((held or {}).get("original"), img.size)
    st.caption(f"Showing {what} on every page of this session" + (f": {shrunk}." if shrunk else "."))
    st.button("Clear the upload (back to the sample image)", key=f"{prefix}_clear_upload", on_click=clear_upload)
    return img, current, f"uploaded: {held['name']}" if held else name, True


def fit_image(prefix: str, img: Image.Image, key: str, ckpt, is_upload: bool
              ) -> tuple[Image.Image, str, Image.Image | None]:
    """Notes on how `ckpt`'s model takes `img` (an animation's first frame, a tiny image
    enlarged, a crop that leaves part of it out) and, when the crop leaves part out, the choice
    to pad instead (letterbox, session-wide). Returns (the image, its cache key, the image to
    pass to the caches: None for an unchanged sample image)."""
    held = st.session_state.get(UPLOAD) or {}
    held = held if is_upload and held.get("id") == key else {}
    for note in held.get("notes", []):
        st.info(note)
    shrunk = shrunk_text(held.get("original"), img.size)        # "your 1400×1000 image, shrunk to 1024×731 px …"
    fit = views.fit_of(img.size, cache.model_crop(img, ckpt).size, ckpt.config.img_size)
    if fit.upscale_note():
        (st.info if is_upload else st.caption)(fit.upscale_note())
    plain = (img, key, img if is_upload else None)
    if fit.crop_note() is None:
        return plain
    st.session_state.setdefault(FIT, "crop")
    bound(st.radio, f"{prefix}_fit", FIT, label="This image does not fit the model's input:", options=["crop", "pad"],
          horizontal=True, format_func={"crop": "crop (as the model's eval transform does)",
                                        "pad": "pad instead of crop (whole image, grey bars)"}.__getitem__)
    if st.session_state[FIT] == "crop":
        st.info(fit.crop_note(shrunk, original=held.get("original") if shrunk else None), icon="✂️")
        return plain
    pre = preprocess_of(ckpt)
    crop_pct = float(pre["crop_pct"]) if pre else 1.0
    padded = views.letterbox(img, ckpt.config.img_size, crop_pct)
    H, W = ckpt.config.img_size
    whole = f"image ({shrunk})" if shrunk else f"{img.width}×{img.height} px image"
    st.caption(f"Padded: the whole {whole} on grey bars, to the model's {W}×{H} shape.")
    return padded, f"{key}|pad{H}x{W}@{crop_pct:g}", padded
