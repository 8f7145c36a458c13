"""The server's store of uploaded images, shareable by link (`image=upload:<sha256>`): accepted
uploads as PNG files in `$VITPE_UPLOAD_DIR` (`vitpe_core.store.ImageStore`), and the decoded image
of a link's id, cached in the memory budget (`cache.budgeted`)."""
from __future__ import annotations

import io

import streamlit as st
from PIL import Image

from vitpe_core.store import ImageStore, default_upload_dir, png_bytes
from vitpe_core.viewstate import UPLOAD_PREFIX, is_upload_id
from pages.common.cache import budgeted

MAX_STORED_UPLOAD_BYTES = 500 * 2**20     # the upload store's cap on disk, least recently used out


@st.cache_resource
def _image_store(folder: str) -> ImageStore:
    return ImageStore(folder, max_bytes=MAX_STORED_UPLOAD_BYTES)


def image_store() -> ImageStore:
    """The server's store of uploaded images (`$VITPE_UPLOAD_DIR`, default the user's cache folder)."""
    return _image_store(str(default_upload_dir()))


def store_upload(img: Image.Image) -> str:
    """Put an accepted, decoded upload in the store; its view id `upload:<sha256>`. OSError if
    the folder cannot be written."""
    return UPLOAD_PREFIX + image_store().put(png_bytes(img))


class _NotStored(LookupError):
    """Raised inside the cache so that a missing image is not cached."""


@budgeted("uploaded images", max_items=16)
def _stored_image(image_id: str, folder: str) -> Image.Image:
    data = _image_store(folder).get(image_id[len(UPLOAD_PREFIX):])
    if data is None:
        raise _NotStored(image_id)
    with Image.open(io.BytesIO(data)) as img:       # a PNG this server wrote
        return img.convert("RGB")


def stored_image(image_id: str) -> Image.Image | None:
    """The uploaded image with view id `upload:<sha256>`, or None if the store does not hold it
    (never stored here, or evicted). Only a validated id reaches the store."""
    if not is_upload_id(image_id):
        return None
    try:
        return _stored_image(image_id, str(image_store().folder))
    except _NotStored:
        return None
