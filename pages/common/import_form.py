"""Bring your own ViT: the form that uploads a pretrained model's weights and imports them into
this browser session (`cache.import_upload`; the model joins every page's checkpoint list)."""
from __future__ import annotations

import streamlit as st

from . import cache
from .messages import show_notes


def model_import_form(page: str) -> str | None:
    """Upload and import a pretrained ViT into this session (see `cache.import_upload`); the
    name it got, or None. Errors and the importer's notes are shown on the page."""
    from vitpe_core.importers import FAMILIES

    gone = st.session_state.pop(cache.MODELS_GONE, None)
    if gone:
        st.warning(f"Removed from your list to make room on the server: {', '.join(gone)}. Upload again to use them.")
    with st.expander("Import your own ViT (timm, DeiT, DINOv2, Hugging Face, RoPE-ViT)", expanded=False):
        st.caption(f"Weights as .safetensors, .npz or a weights-only .pth/.bin, up to {cache.MAX_MODEL_UPLOAD_MB} MB; "
                   "read without running code. The model joins every page's checkpoint list for this browser "
                   f"session only (at most {cache.MAX_SESSION_MODELS}); it is not written to disk. From a shell, "
                   "`python -m vitpe_core import FILE --out checkpoints/NAME.safetensors` keeps it for good.")
        up = st.file_uploader("Weights file", type=[s[1:] for s in cache.TIMM_SUFFIXES], key=f"{page}_model_upload",
                              max_upload_size=cache.MAX_MODEL_UPLOAD_MB)
        cols = st.columns(3)
        family = cols[0].selectbox("Family", ["auto", *FAMILIES], key=f"{page}_model_family")
        size = cols[1].text_input("Image size (H or HxW)", key=f"{page}_model_size",
                                  help="Only for a non-square table, or to run the model at another size")
        heads = cols[2].number_input("Heads (0 = width / 64)", min_value=0, max_value=64, step=1, value=0,
                                     key=f"{page}_model_heads")
        licence = st.text_input("Licence of these weights (recorded with the model)", key=f"{page}_model_licence")
        if up is None or not st.button("Import", key=f"{page}_model_import", type="primary"):
            return None
        try:
            with st.spinner(f"Importing {up.name}…"):
                name, notes = cache.import_upload(up.name, up.getvalue(), family=family, img_size=size.strip() or None,
                                                  heads=int(heads) or None, licence=licence)
        except ValueError as e:   # CheckpointError: what is wrong with the file, and what to do
            st.error(f"{up.name} was not imported: {e}")
            return None
        st.success(f"Imported as `{name}`: it is now in every page's checkpoint list.")
        show_notes(notes)
        return name
