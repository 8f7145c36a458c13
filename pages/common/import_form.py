"""Bring your own ViT: the form that uploads a pretrained model's weights (and, optionally, a
file naming its classes) and imports them into this browser session (`cache.import_upload`;
the model joins every page's checkpoint list).

The import runs in the Import button's callback, before the script: everything the run draws
before the form (the sidebar's checkpoint count) already counts the new model."""
from __future__ import annotations

import streamlit as st

from . import cache
from .messages import show_notes

RESULT = "_vitpe_import_result"   # (page, name or None, notes, error or None) of the callback's import


def _import(page: str) -> None:
    """The Import button's callback: import the form's files with its settings (`RESULT`)."""
    ss = st.session_state
    up, labels = ss.get(f"{page}_model_upload"), ss.get(f"{page}_model_labels")
    if up is None:
        return
    try:
        with st.spinner(f"Importing {up.name}…"):
            name, notes = cache.import_upload(
                up.name, up.getvalue(), family=ss.get(f"{page}_model_family", "auto"),
                img_size=str(ss.get(f"{page}_model_size") or "").strip() or None,
                heads=int(ss.get(f"{page}_model_heads") or 0) or None, licence=ss.get(f"{page}_model_licence", ""),
                labels=None if labels is None else (labels.name, labels.getvalue()))
    except ValueError as e:   # CheckpointError: what is wrong with the file, and what to do
        ss[RESULT] = (page, None, [], f"{up.name} was not imported: {e}")
        return
    ss[RESULT] = (page, name, notes, None)
    _release_upload(up)


def _release_upload(up) -> None:
    """Drop an imported weights file's bytes from Streamlit's upload manager, which would keep
    them for the rest of the session (a ViT-B/16 in float16: 173 MB outside the memory budget);
    the model itself is in the server's store now. The uploader then holds no file."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx
    ctx = get_script_run_ctx(suppress_warning=True)
    mgr = getattr(ctx, "uploaded_file_mgr", None)
    if mgr is not None and getattr(up, "file_id", None):
        mgr.remove_file(ctx.session_id, up.file_id)


def model_import_form(page: str) -> str | None:
    """Upload and import a pretrained ViT into this session (see `cache.import_upload`); the
    name it got, or None. Errors and the importer's notes are shown on the page."""
    from vitpe_core.importers import FAMILIES

    gone = st.session_state.pop(cache.MODELS_GONE, None)
    if gone:
        st.warning(f"Removed from your list to make room on the server: {', '.join(gone)}. Upload again to use them.")
    result = st.session_state.pop(RESULT, None)
    result = result if result and result[0] == page else None
    with st.expander("Import your own ViT (timm, DeiT, DINOv2, Hugging Face, RoPE-ViT)", expanded=result is not None):
        st.caption(f"Weights as .safetensors, .npz or a weights-only .pth/.bin, up to {cache.MAX_MODEL_UPLOAD_MB} MB; "
                   "read without running code. The model joins every page's checkpoint list for this browser "
                   f"session only (at most {cache.MAX_SESSION_MODELS}, counted as \"imported in this session\"); it "
                   "is not written to disk. From a shell, `python -m vitpe_core import FILE --out "
                   "checkpoints/NAME.safetensors` keeps it for good.")
        up = st.file_uploader("Weights file", type=[s[1:] for s in cache.TIMM_SUFFIXES], key=f"{page}_model_upload",
                              max_upload_size=cache.MAX_MODEL_UPLOAD_MB)
        cols = st.columns(3)
        cols[0].selectbox("Family", ["auto", *FAMILIES], key=f"{page}_model_family")
        cols[1].text_input("Image size (H or HxW)", key=f"{page}_model_size",
                           help="Only for a non-square table, or to run the model at another size")
        cols[2].number_input("Heads (0 = width / 64)", min_value=0, max_value=64, step=1, value=0,
                             key=f"{page}_model_heads")
        st.file_uploader("Class names (optional): one per line, or JSON as config.json's id2label",
                         type=["txt", "json"], key=f"{page}_model_labels", max_upload_size=4,
                         help="In the order of the model's outputs. Without it: the config's id2label, ImageNet-1k's "
                              "names for 1000 classes, else 'class k'.")
        st.text_input("Licence of these weights (recorded with the model)", key=f"{page}_model_licence")
        if up is not None:
            st.button("Import", key=f"{page}_model_import", type="primary", on_click=_import, args=(page,))
        if result is None:
            return None
        _, name, notes, error = result
        if error is not None:
            st.error(error)
            return None
        st.success(f"Imported as `{name}`: it is now in every page's checkpoint list.")
        show_notes(notes)
        return name
