"""Page helpers for the Streamlit app (widgets, share links, uploads, downloads); everything
they show is computed in vitpe_core, through the caches of `pages.common.cache`.

The view state (`viewstate.ViewState`) lives in `st.session_state` under the plain keys
`ckpt`, `image`, `patch` (a tuple `(r, c)`), `layer`, `head` (`None` = mean over heads), and
in the URL query string, kept in sync:

* on a session's first run, and whenever the URL holds view parameters that differ from the
  ones the app last wrote, the URL wins (a pasted link); otherwise session_state wins (it
  is what widgets and clicks change, and what a test sets directly);
* every value is validated by `viewstate.parse_view` against the selected checkpoint
  (grid, depth, heads); an invalid one falls back to its default with an `st.warning`;
* widgets are "controlled": each has its own key, is set from the view before it is drawn,
  and writes the view back in its `on_change` callback, so views survive page switches.
"""
from __future__ import annotations

import io
import re
from typing import Any, Callable, Sequence
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import numpy as np
import streamlit as st
from PIL import Image

from vitpe_core import figures

from . import cache
from vitpe_core.checkpoint import CheckpointError
from vitpe_core.gallery import gallery_caption, gallery_ids, gallery_image
from vitpe_core.images import ALLOWED_FORMATS, ImageError, load_image
from vitpe_core.viewstate import KEYS, MEAN_HEAD, PAGES, ViewState, parse_view, to_query

VIEW_KEYS = ("ckpt", "image", "patch", "layer", "head")
SYNCED = "_vitpe_synced_query"
UPLOAD_TYPES = ["png", "jpg", "jpeg", "webp", "gif", "bmp", "tif", "tiff"]
MAX_IMAGE_UPLOAD_MB = 20   # the image uploader's own limit (the server allows more, for models)
MAX_UPLOAD_SIDE = 1024   # uploads are shrunk to this after decoding (the model sees 32 px)
DEFAULT_URL = "http://localhost:8501/"

Dims = tuple[tuple[int, int], int, int]   # (grid, depth, heads)


# ----------------------------------------------------------------------------- text
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]#!|<>~$:])")


def escape_md(text: str) -> str:
    """Escape Markdown so text from a URL is shown literally (no links, images or HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", text)


def no_checkpoints_info() -> None:
    root = cache.checkpoint_root()
    st.info(
        f"No checkpoints found in `{root}`.\n\n"
        "Train the shipped set (resumable, about an hour per model on a GPU):\n\n"
        "```bash\nbash scripts/train_checkpoints.sh data 15\n```\n\n"
        "or one model:\n\n"
        "```bash\npython -m vitpe_core train --encoding sape2+ape --dataset cifar10 --preset compact "
        "--data-dir data --download --checkpoint checkpoints/sape2+ape.safetensors\n```\n\n"
        f"To use another folder, set `{cache.ENV_VAR}=/path/to/folder` before `streamlit run app.py`.")


def show_notes(notes: Sequence[str]) -> None:
    for note in notes:
        st.warning(escape_md(note), icon="⚠️")


# ----------------------------------------------------------------------------- view state
def query_dict() -> dict[str, list[str]]:
    qp = st.query_params
    return {k: list(qp.get_all(k)) for k in qp.keys()}


def _as_text(key: str, value: Any) -> Any:
    """Session-state value -> its query-string text (anything odd is passed on for
    parse_view to refuse with a note)."""
    if key == "patch" and isinstance(value, (tuple, list)) and len(value) == 2:
        return f"{value[0]},{value[1]}"
    if key == "head" and value is None:
        return MEAN_HEAD
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    return value


def dims_of(name: str) -> Dims | None:
    """(grid, depth, heads) of checkpoint `name`; None if there is none or it cannot be read."""
    if not name:
        return None
    try:
        cfg = cache.get_checkpoint(name).config
    except (CheckpointError, OSError):
        return None
    return cfg.grid, cfg.depth, cfg.heads


def current_view(page: str, checkpoints: Sequence[str], *,
                 dims_for: Callable[[str], Dims | None] = dims_of) -> ViewState:
    """The validated view for this run (see the module docstring), committed to
    session_state and the URL; invalid values are reported with st.warning."""
    ss = st.session_state
    images = gallery_ids()
    url = {k: v for k, v in query_dict().items() if k in KEYS}
    synced = ss.get(SYNCED)
    from_url = synced is None or (bool(url) and {k: v[-1] for k, v in url.items() if v} != synced)
    params: dict[str, Any] = {k: _as_text(k, ss[k]) for k in VIEW_KEYS if k in ss and ss[k] != ""}
    if from_url:
        params.update(url)
    params.setdefault("page", page)
    first, _ = parse_view(params, checkpoints=checkpoints, images=images, grid=(1024, 1024),
                          depth=1024, heads=1024)
    grid, depth, heads = dims_for(first.ckpt) or ((8, 8), 1, 1)
    view, notes = parse_view(params, checkpoints=checkpoints, images=images, grid=grid, depth=depth, heads=heads)
    show_notes(notes)
    view = ViewState(**{**view.__dict__, "page": page})
    commit(view)
    return view


def commit(view: ViewState) -> None:
    """Write `view` to session_state and the URL."""
    ss = st.session_state
    ss["ckpt"], ss["image"], ss["patch"] = view.ckpt, view.image, tuple(view.patch)
    ss["layer"], ss["head"] = view.layer, view.head
    q = to_query(view)
    if {k: v[-1] for k, v in query_dict().items() if v} != q:
        st.query_params.from_dict(q)
    ss[SYNCED] = q


def share_link(view: ViewState, url: str | None = None) -> str:
    """The full link that reopens `view`: the app's root with `?page=...&ckpt=...`."""
    url = url or getattr(st.context, "url", None) or DEFAULT_URL
    parts = urlsplit(url)
    path = parts.path or "/"
    for page in PAGES:
        if path.rstrip("/").endswith("/" + page):
            path = path.rstrip("/")[: -len(page)]
            break
    if not path.endswith("/"):
        path += "/"
    return urlunsplit((parts.scheme, parts.netloc, path, urlencode(to_query(view), safe=",", quote_via=quote), ""))


def render_share(view: ViewState, *, upload_active: bool = False) -> None:
    with st.sidebar:
        st.markdown("**Link to this view**")
        st.code(share_link(view), language=None, wrap_lines=True)
        if upload_active:
            st.caption("Uploaded images cannot be shared by link: the link opens the gallery image "
                       f"{view.image!r} instead.")


# ----------------------------------------------------------------------------- controlled widgets
def bound(widget: Callable[..., Any], key: str, canon: str, *, to_widget: Callable[[Any], Any] = lambda v: v,
          from_widget: Callable[[Any], Any] = lambda v: v, **kwargs) -> Any:
    """Draw `widget(key=key)` showing `session_state[canon]`; a change writes it back."""
    st.session_state[key] = to_widget(st.session_state[canon])

    def changed() -> None:
        st.session_state[canon] = from_widget(st.session_state[key])

    return widget(key=key, on_change=changed, **kwargs)


def checkpoint_select(prefix: str, names: Sequence[str], *, label: str = "Checkpoint") -> str:
    return bound(st.selectbox, f"{prefix}_ckpt", "ckpt", label=label, options=list(names),
                 help="Checkpoints in the folder; '+' composes encodings (e.g. sape2+ape).")


def layer_head_controls(prefix: str, depth: int, heads: int) -> tuple[int, int | None]:
    """Layer slider and head select (`None` = mean over heads), bound to the view."""
    if depth > 1:
        bound(st.select_slider, f"{prefix}_layer", "layer", label="Layer", options=list(range(depth)))
    else:
        st.caption("Layer 0 (the model has one layer)")
    bound(st.selectbox, f"{prefix}_head", "head", label="Head", options=[MEAN_HEAD, *map(str, range(heads))],
          format_func=lambda h: "mean over heads" if h == MEAN_HEAD else f"head {h}",
          to_widget=lambda h: MEAN_HEAD if h is None else str(h),
          from_widget=lambda h: None if h == MEAN_HEAD else int(h))
    return st.session_state["layer"], st.session_state["head"]


def patch_controls(prefix: str, grid: tuple[int, int]) -> tuple[int, int]:
    """Row / column number inputs (the keyboard-accessible way to choose a patch)."""
    H, W = grid
    r_col, c_col = st.columns(2)

    def changed() -> None:
        st.session_state["patch"] = (int(st.session_state[f"{prefix}_row"]), int(st.session_state[f"{prefix}_col"]))

    r, c = st.session_state["patch"]
    st.session_state[f"{prefix}_row"], st.session_state[f"{prefix}_col"] = int(r), int(c)
    r_col.number_input("Row r", min_value=0, max_value=H - 1, step=1, key=f"{prefix}_row", on_change=changed)
    c_col.number_input("Column c", min_value=0, max_value=W - 1, step=1, key=f"{prefix}_col", on_change=changed)
    return st.session_state["patch"]


def patch_text(patch: tuple[int, int], grid: tuple[int, int]) -> None:
    r, c = patch
    st.markdown(f"**Patch ({r}, {c})** — token n = r·W + c = {r * grid[1] + c} of {grid[0]}×{grid[1]}")


def clickable(img: Image.Image, key: str, to_patch: Callable[[float, float, float, float], tuple[int, int]]) -> None:
    """An image that sets `session_state["patch"]` where it is clicked."""
    from streamlit_image_coordinates import streamlit_image_coordinates

    def clicked() -> None:
        v = st.session_state.get(key)
        if isinstance(v, dict) and all(isinstance(v.get(k), (int, float)) for k in ("x", "y", "width", "height")):
            st.session_state["patch"] = to_patch(v["x"], v["y"], v["width"], v["height"])

    streamlit_image_coordinates(img, key=key, on_click=clicked, cursor="crosshair")


# ----------------------------------------------------------------------------- images
@st.cache_data(max_entries=8, show_spinner=False)
def _decode(data: bytes) -> Image.Image | str:
    try:
        img = load_image(data)
    except ImageError as e:
        return str(e)
    img.thumbnail((MAX_UPLOAD_SIDE, MAX_UPLOAD_SIDE), Image.LANCZOS)
    return img


def decode_upload(data: bytes) -> tuple[Image.Image | None, str | None]:
    """Uploaded bytes -> (RGB image, None) or (None, the reason it was refused).
    Decoding is `images.load_image`; large images are shrunk to 1024 px on the long side."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None, f"Expected the file's bytes, got {type(data).__name__}."
    out = _decode(bytes(data))
    return (None, out) if isinstance(out, str) else (out, None)


def image_source(prefix: str) -> tuple[Image.Image, str, str, bool]:
    """Gallery choice (bound to the view's `image`) or an upload.
    Returns (image, cache key, caption, is_upload)."""
    ids = gallery_ids()
    bound(st.selectbox, f"{prefix}_image", "image", label="Sample image", options=ids, format_func=gallery_caption)
    up = st.file_uploader(f"…or upload an image ({', '.join(sorted(ALLOWED_FORMATS))})", type=UPLOAD_TYPES,
                          key=f"{prefix}_upload", max_upload_size=MAX_IMAGE_UPLOAD_MB,
                          help="Uploaded images are not stored and cannot be shared by link.")
    if up is not None:
        img, err = decode_upload(up.getvalue())
        if err is not None:
            st.error(f"{up.name}: {err}")
        else:
            return img, cache.image_key(img), f"uploaded: {up.name}", True
    image_id = st.session_state["image"]
    return gallery_image(image_id), image_id, gallery_caption(image_id), False


# ----------------------------------------------------------------------------- output
def chart(fig, name: str, key: str) -> None:
    """A Plotly chart whose camera button saves `name`.png."""
    st.plotly_chart(fig, config=figures.export_config(name), key=key)


def _csv(a: np.ndarray) -> bytes:
    a = np.asarray(a)
    a2 = a.reshape(-1, a.shape[-1]) if a.ndim != 2 else a
    buf = io.StringIO()
    np.savetxt(buf, a2, delimiter=",", fmt="%.6g")
    return buf.getvalue().encode()


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.asarray(a), allow_pickle=False)
    return buf.getvalue()


def downloads(name: str, shown: np.ndarray, key: str, *, full: np.ndarray | None = None) -> None:
    """CSV of the map shown and NPY of the full array (`full`, default the map)."""
    safe = figures.export_config(name)["toImageButtonOptions"]["filename"]
    a, b = st.columns(2)
    a.download_button("Data (CSV)", data=lambda: _csv(shown), file_name=f"{safe}.csv", mime="text/csv",
                      key=f"{key}_csv", on_click="ignore")
    full = shown if full is None else full
    b.download_button(f"Array (NPY, shape {tuple(np.shape(full))})", data=lambda: _npy(full),
                      file_name=f"{safe}.npy", mime="application/octet-stream", key=f"{key}_npy", on_click="ignore")


def load_checkpoint_or_error(name: str):
    """The checkpoint, or None after an st.error saying why it cannot be used."""
    try:
        return cache.get_checkpoint(name)
    except (ValueError, OSError) as e:   # CheckpointError is a ValueError
        st.error(f"Checkpoint {name!r} cannot be used: {e}")
        return None


def load_checkpoints(names: Sequence[str]) -> dict:
    """name -> checkpoint for every one that loads; an st.error for each that does not."""
    loaded = {name: load_checkpoint_or_error(name) for name in names}
    return {name: ckpt for name, ckpt in loaded.items() if ckpt is not None}


def patch_picker(page: str, img: Image.Image, ckpt, patch: tuple[int, int], caption: str, *,
                 max_side: int = 320) -> np.ndarray:
    """The image as `ckpt`'s model sees it (its crop, at least 20 px per patch) with its patch
    grid, clickable, plus the keyboard row/column inputs; returns the displayed image
    `(h, w, 3)` for overlays."""
    grid = ckpt.config.grid
    st.caption(caption)
    display = figures.display_image(cache.model_crop(img, ckpt), ckpt.config.img_size,
                                    max_side=max(max_side, 20 * max(grid)))
    clickable(figures.grid_image(display, grid, patch), f"{page}_click",
              lambda x, y, w, h: figures.pixel_to_patch(x, y, w, h, grid))
    patch_controls(page, grid)
    patch_text(patch, grid)
    return display


# ----------------------------------------------------------------------------- bring your own ViT
def model_import_form(page: str) -> str | None:
    """Upload and import a pretrained ViT into this session (see `cache.import_upload`); the
    name it got, or None. Errors and the importer's notes are shown on the page."""
    from vitpe_core.importers import FAMILIES

    gone = st.session_state.pop("_vitpe_models_gone", None)
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


def epoch_control(page: str, name: str) -> int | None:
    """A slider over the epochs recorded in the checkpoint's history (None = final weights)."""
    epochs = sorted(cache.get_checkpoint(name).history)
    if not epochs:
        st.sidebar.caption("This checkpoint recorded no training history.")
        return None
    options = [*epochs, "final"]
    if st.session_state.get("_sim_epoch") not in options:
        st.session_state["_sim_epoch"] = "final"
    with st.sidebar:
        bound(st.select_slider, f"{page}_epoch", "_sim_epoch", label="Epoch (table recorded during training)",
                 options=options, help="Watch the row/column structure emerge as training proceeds.")
    value = st.session_state["_sim_epoch"]
    return None if value == "final" else int(value)
