"""Bring your own ViT: the form that uploads a pretrained model's weights (and, optionally, a
file naming its classes, and its config.json) and imports them into this browser session
(`model_import.import_upload`;
the model joins every page's checkpoint list), or a Hugging Face hub id (`model_import.import_hub`).

The import runs in the Import button's callback, before the script: everything the run draws
before the form (the sidebar's checkpoint count) already counts the new model."""
from __future__ import annotations

import streamlit as st

from . import cache, imported, model_import
from .messages import show_notes

RESULT = "_vitpe_import_result"   # (page, name or None, notes, error or None) of the callback's import
KEPT = "_vitpe_import_kept_{page}"   # the file id of a weights file put back after a failed import


def share_uploads_on_copy() -> bool:
    """Make a copy of an `UploadedFile` share its bytes instead of copying them (False where
    Streamlit's class already says how it is copied). Streamlit deep-copies every widget's value
    on every run that draws it (`SessionState.register_widget`), so a weights file in the uploader
    was copied whole on each rerun of the page until it was imported: 173 MB more for a ViT-B/16
    in float16, the server's peak (issue 30). The twin is still a file of its own (its own
    position; `io.BytesIO` copies the shared bytes before a write), as the copy was meant to be."""
    import copy
    import io

    from streamlit.runtime.uploaded_file_manager import UploadedFile
    if "__deepcopy__" in vars(UploadedFile):
        return False

    def __deepcopy__(self, memo):
        twin = type(self).__new__(type(self))
        io.BytesIO.__init__(twin, self.getvalue())     # the same bytes object, not a copy of it
        twin.__dict__.update(copy.deepcopy(self.__dict__, memo))
        twin.seek(self.tell())
        return twin

    UploadedFile.__deepcopy__ = __deepcopy__
    return True


share_uploads_on_copy()


def _import(page: str) -> None:
    """The Import button's callback: import the form's files with its settings (`RESULT`)."""
    ss = st.session_state
    up, labels, config = (ss.get(f"{page}_model_{k}") for k in ("upload", "labels", "config"))
    up = up if up is not None else _kept_upload(page)
    hub = str(ss.get(f"{page}_model_hub") or "").strip()
    if up is None and not hub:
        return
    what = up.name if up is not None else hub
    settings = dict(family=ss.get(f"{page}_model_family", "auto"),
                    img_size=str(ss.get(f"{page}_model_size") or "").strip() or None,
                    heads=int(ss.get(f"{page}_model_heads") or 0) or None, licence=ss.get(f"{page}_model_licence", ""),
                    labels=None if labels is None else (labels.name, labels.getvalue()),
                    act=None if ss.get(f"{page}_model_act", "auto") == "auto" else ss[f"{page}_model_act"])
    try:
        with st.spinner(f"Importing {what}…"):
            if up is not None:
                name, notes = model_import.import_upload(
                    up.name, up, config=None if config is None else (config.name, config.getvalue()),
                    release=lambda: _release_upload(page, up), restore=lambda copy: _restore_upload(page, up, copy),
                    **settings)
            else:
                name, notes = model_import.import_hub(hub, **settings)
    except ValueError as e:   # CheckpointError: what is wrong with the file, and what to do
        ss[RESULT] = (page, None, [], f"{what} was not imported: {e}")
        return
    ss[RESULT] = (page, name, notes, None)


def _release_upload(page: str, up) -> None:
    """Drop the weights file's bytes before its model is built (issue 30: the file and its float32
    model both in memory were the server's peak; a ViT-B/16 in float16 is 173 MB): from Streamlit's
    upload manager, which would keep them for the rest of the session, from the uploader's session
    state (its value there, and the last run's, each an `UploadedFile` holding them) and from `up`.
    The uploader then holds no file; a model that is imported is in the server's store."""
    mgr, session_id = _upload_manager()
    if mgr is not None and getattr(up, "file_id", None):
        mgr.remove_file(session_id, up.file_id)
    key = f"{page}_model_upload"
    if key in st.session_state:
        del st.session_state[key]
    st.session_state.pop(KEPT.format(page=page), None)
    up.close()


def _restore_upload(page: str, up, copy) -> None:
    """Put a weights file whose import failed back in Streamlit's upload manager (read from the
    import's temporary `copy`), and remember it (`KEPT`): the browser still shows it in the
    uploader, but the uploader's value in this session is gone (`_release_upload`) until the
    visitor's next change sends it again; until then the form offers Import for the kept file, so
    that it can be pressed again with other settings."""
    from streamlit.runtime.uploaded_file_manager import UploadedFileRec
    mgr, session_id = _upload_manager()
    if mgr is not None and getattr(up, "file_id", None):
        mgr.add_file(session_id, UploadedFileRec(up.file_id, up.name, up.type, copy.read_bytes()))
        st.session_state[KEPT.format(page=page)] = up.file_id


def _kept_upload(page: str):
    """The weights file kept after a failed import (`_restore_upload`) as an `UploadedFile`, or None
    (none kept, or the visitor removed it from the uploader since: then it is forgotten)."""
    from streamlit.proto.Common_pb2 import FileURLs
    from streamlit.runtime.uploaded_file_manager import UploadedFile
    kept = st.session_state.get(KEPT.format(page=page))
    mgr, session_id = _upload_manager()
    recs = mgr.get_files(session_id, [kept]) if kept and mgr is not None else []
    if not recs:
        st.session_state.pop(KEPT.format(page=page), None)
        return None
    return UploadedFile(recs[0], FileURLs())


def _upload_manager():
    """(Streamlit's uploaded-file manager, this session's id), or (None, None) outside a script run."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx
    ctx = get_script_run_ctx(suppress_warning=True)
    return getattr(ctx, "uploaded_file_mgr", None), getattr(ctx, "session_id", None)


def model_import_form(page: str) -> str | None:
    """Upload and import a pretrained ViT into this session (see `model_import.import_upload`); the
    name it got, or None. Errors and the importer's notes are shown on the page."""
    from vitpe_core.importers import FAMILIES

    gone = st.session_state.pop(imported.MODELS_GONE, None)
    if gone:
        st.warning(f"Removed from your list to make room on the server: {', '.join(gone)}. Upload again to use them.")
    result = st.session_state.pop(RESULT, None)
    result = result if result and result[0] == page else None
    # A key of its own: the browser then keeps the open state the visitor gave the form across reruns
    # (Streamlit's element state, by this key). Without it the browser followed `expanded` whenever it
    # changed, and the run after an import (`expanded` True) drew it closed: picking a second weights
    # file collapsed the form, and its Import button with it (issue 44, 6). `expanded` now only says
    # how it first opens.
    with st.expander("Import your own ViT (timm, DeiT, BEiT, Swin, DINOv2/v3, CLIP, SigLIP, Hugging Face, RoPE-ViT)",
                     expanded=result is not None, key=f"{page}_model_form"):
        st.caption(f"Weights as .safetensors, .npz or a weights-only .pth/.bin, up to {imported.MAX_MODEL_UPLOAD_MB} "
                   "MB; read without running code. The model joins every page's checkpoint list for this browser "
                   f"session only (at most {imported.MAX_SESSION_MODELS}, counted as \"imported in this session\"); "
                   "the server keeps a copy in its model store while there is room, so a share link opens it for "
                   "others. From a shell, `python -m vitpe_core import FILE --out checkpoints/NAME.safetensors` "
                   "keeps it for good.")
        up = st.file_uploader("Weights file", type=[s[1:] for s in cache.TIMM_SUFFIXES], key=f"{page}_model_upload",
                              max_upload_size=imported.MAX_MODEL_UPLOAD_MB)
        st.file_uploader("config.json saved beside the weights (Hugging Face or timm; needed for Swin)", type=["json"],
                         key=f"{page}_model_config", max_upload_size=1,
                         help="It says what the weights do not: heads, windows, activation, read-out, image size.")
        st.text_input("…or a Hugging Face hub id (downloads model.safetensors and config.json)",
                      key=f"{page}_model_hub", placeholder="microsoft/beit-base-patch16-224",
                      help="Needs a network on the server; otherwise download the two files and upload them above.")
        cols = st.columns(4)
        cols[0].selectbox("Family", ["auto", *FAMILIES], key=f"{page}_model_family")
        cols[1].text_input("Image size (H or HxW)", key=f"{page}_model_size",
                           help="Only for a non-square table, or to run the model at another size")
        cols[2].number_input("Heads (0 = width / 64)", min_value=0, max_value=64, step=1, value=0,
                             key=f"{page}_model_heads")
        cols[3].selectbox("Activation", ["auto", *model_import.ACTIVATIONS], key=f"{page}_model_act",
                          help="Only for a timm file without its config.json: CLIP's is quick_gelu, SigLIP's often "
                               "gelu_tanh (the import says when it needs this)")
        st.file_uploader("Class names (optional): one per line, or JSON as config.json's id2label",
                         type=["txt", "json"], key=f"{page}_model_labels", max_upload_size=4,
                         help="In the order of the model's outputs. Without it: the config's id2label, ImageNet-1k's "
                              "names for 1000 classes, else 'class k'.")
        st.text_input("Licence of these weights (recorded with the model)", key=f"{page}_model_licence")
        kept = None if up is not None else _kept_upload(page)
        if kept is not None:
            st.caption(f"`{kept.name}` is still selected above: press Import again (with other settings).")
        if up is not None or kept is not None or str(st.session_state.get(f"{page}_model_hub") or "").strip():
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
