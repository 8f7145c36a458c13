"""Page helpers for the Streamlit app (widgets, share links, uploads, downloads); everything
they show is computed in vitpe_core, through the caches of `pages.common.cache`.

The view state (`viewstate.ViewState`) lives in `st.session_state` under the plain keys
`ckpt`, `image`, `patch` (a tuple `(r, c)`), `layer`, `head` (`None` = mean over heads),
`epoch` (`None` = final weights), and in the URL query string, kept in sync:

* the URL is read on a session's first run (a shared or pasted link: opening a URL starts a
  new session) and on a run started by the browser's back / forward buttons; on every other
  run session_state wins and the URL is only written. The browser sends its address bar with
  every rerun, and quick actions (keyboard auto-repeat on a slider) send one the app has not
  replaced yet: treating such a stale URL as a pasted link set the view back and lost the
  next action;
* every value is validated by `viewstate.parse_view` against the selected checkpoint
  (grid, depth, heads, recorded epochs); an invalid one falls back to its default with an
  `st.warning`;
* widgets are "controlled": each has its own key, is set from the view before it is drawn
  (only when the two differ, so a newer value in the browser is never overwritten by an
  older one), and writes the view back in its `on_change` callback, so views survive page
  switches.

An accepted image upload (decoded, at most `MAX_UPLOAD_SIDE` px a side) is put, as PNG, in the
server's upload store (`cache.image_store`) and becomes the view's image `upload:<sha256>`: it
follows the visitor from page to page until another is uploaded, a sample image is chosen or it
is cleared, and a share link carrying it opens the same image for anyone on this server (an
evicted one falls back to the first sample image with a warning).

The patch picker (`clickable`) is a Plotly chart of the image with one invisible marker per
patch centre and `on_select="rerun"`: no iframe. Its axes are the image's pixels; hover picks
the nearest centre anywhere on the image (`hoverdistance=-1`), so a click anywhere in a patch
selects it.
"""
from __future__ import annotations

import base64
import functools
import io
import logging
import re
from typing import Any, Callable, Sequence
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import numpy as np
import streamlit as st
from PIL import Image

from vitpe_core import figures, views

from . import cache
from vitpe_core.checkpoint import GROUPS, CheckpointError, in_group
from vitpe_core.gallery import gallery_caption, gallery_ids, gallery_image
from vitpe_core.images import ALLOWED_FORMATS, ImageError, load_image_info
from vitpe_core.inputs import preprocess_of
from vitpe_core.viewstate import (FINAL_EPOCH, KEYS, MEAN_HEAD, NATIVE_SIZE, PAGES, STRESS_KEYS, StressLimits,
                                  ViewState, is_upload_id, parse_view, to_query)

log = logging.getLogger(__name__)

VIEW_KEYS = ("ckpt", "image", "patch", "layer", "head", "epoch", *STRESS_KEYS, "show")
SYNCED = "_vitpe_synced_query"
UPLOAD = "_vitpe_upload"           # this session's uploaded image: {"name", "id" (upload:<sha256>), "notes"}
UPLOAD_GEN = "_vitpe_upload_gen"   # bumped when the upload is set aside: the uploaders start empty
UPLOAD_ERROR = "_vitpe_upload_error"   # (uploader key, why its file was refused), shown while the file is there
LINK_MODEL_NOTES = "_vitpe_link_model_notes"   # open_link_model's note, shown by current_view
FIT = "_vitpe_fit"                 # "crop" (the model's centre crop) or "pad" (letterbox): for every page
NARROW_PX = 768                    # up to this width the sidebar starts collapsed: the main area says so
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
    if key == "epoch" and value is None:
        return FINAL_EPOCH
    if key in ("patch", "shift") and isinstance(value, (tuple, list)) and len(value) == 2:
        return f"{value[0]},{value[1]}"
    if key == "size" and value is None:
        return NATIVE_SIZE
    if key == "head" and value is None:
        return MEAN_HEAD
    if key == "show" and isinstance(value, (tuple, list)):
        return to_query(ViewState(show=tuple(value)))["show"]
    if key == "show" and value is None:
        return ""
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


def epochs_of(name: str) -> list[int]:
    """The training epochs checkpoint `name` recorded a snapshot of (empty if none or unreadable)."""
    if not name:
        return []
    try:
        return sorted(cache.get_checkpoint(name).history)
    except (CheckpointError, OSError):
        return []


def stress_limits_of(name: str) -> StressLimits:
    """The stress test's and rollout's options for checkpoint `name` (shifts, input heights,
    prefix tokens); only the defaults if there is none or it cannot be read."""
    from vitpe_core import positional, stress

    if not name:
        return StressLimits()
    try:
        ckpt = cache.get_checkpoint(name)
    except (CheckpointError, OSError):
        return StressLimits()
    cfg = ckpt.config
    native = tuple(cfg.img_size)
    return StressLimits(shifts=tuple(stress.shift_options(cfg.patch_size)),
                        heights=tuple(h for h, _ in stress.size_options(native, cfg.patch_size)), native=native[0],
                        sources=tuple(positional.rollout_sources(cfg.num_prefix, ckpt.model.prefix_names())))


def history_navigation() -> bool:
    """Whether the browser's back / forward buttons started this run (then the URL holds the
    view to restore). Streamlit records it on the run's context; False where it cannot tell."""
    try:
        from streamlit.runtime.scriptrunner import get_script_run_ctx
    except ImportError:
        return False
    return bool(getattr(get_script_run_ctx(), "is_history_navigation", False))


def current_view(page: str, checkpoints: Sequence[str], *,
                 dims_for: Callable[[str], Dims | None] = dims_of,
                 epochs_for: Callable[[str], Sequence[int]] = epochs_of,
                 stress_for: Callable[[str], StressLimits] = stress_limits_of) -> ViewState:
    """The validated view for this run (see the module docstring), committed to
    session_state and the URL; invalid values are reported with st.warning."""
    ss = st.session_state
    images = gallery_ids()
    url = {k: v for k, v in query_dict().items() if k in KEYS}
    from_url = ss.get(SYNCED) is None or (bool(url) and history_navigation())
    params: dict[str, Any] = {k: _as_text(k, ss[k]) for k in VIEW_KEYS if k in ss and ss[k] != ""}
    if from_url:
        params.update(url)
    params.pop("model", None)          # it follows from the checkpoint (set below; open_link_model read it)
    params.setdefault("page", page)
    first, _ = parse_view(params, checkpoints=checkpoints, images=images, grid=(1024, 1024),
                          depth=1024, heads=1024)
    grid, depth, heads = dims_for(first.ckpt) or ((8, 8), 1, 1)
    epochs = list(epochs_for(first.ckpt))
    if not from_url and ss.get("epoch") is not None and ss["epoch"] not in epochs:
        params.pop("epoch", None)            # another checkpoint, another history: quietly the final table
    view, notes = parse_view(params, checkpoints=checkpoints, images=images, grid=grid, depth=depth, heads=heads,
                             epochs=epochs, stress=stress_for(first.ckpt))
    if not from_url:   # another checkpoint, other shifts and sizes: the session's values quietly fall back
        notes = [n for n in notes if not n.startswith(tuple(f"Ignored {k}=" for k in STRESS_KEYS))]
    if is_upload_id(view.image) and cache.stored_image(view.image) is None:
        notes.append(f"The uploaded image of this link ({view.image[7:19]}…) is not on this server: it was "
                     "never uploaded here, or removed to make room for newer uploads. Showing the sample image "
                     "instead; upload the photo again to share it.")
        view = ViewState(**{**view.__dict__, "image": images[0] if images else ""})
    show_notes([*st.session_state.pop(LINK_MODEL_NOTES, []), *notes])
    view = ViewState(**{**view.__dict__, "page": page, "model": cache.uploaded_models().get(view.ckpt, "")})
    commit(view)
    return view


def open_link_model() -> None:
    """A link's imported model (`ckpt=NAME&model=<sha256>`, see `viewstate`): on a run that
    reads the URL (as `current_view`), list it in this session from the server's store and
    point the URL's `ckpt` at its name here, before the page lists the checkpoints. The app
    calls it before every page; a note (the store no longer holds it) waits for `current_view`."""
    from vitpe_core.viewstate import is_model_id

    ss, qp = st.session_state, st.query_params
    if not (ss.get(SYNCED) is None or (bool(qp) and history_navigation())):
        return
    sha = qp.get("model", "")
    if not is_model_id(sha):
        return
    name, notes = cache.open_shared_model(str(qp.get("ckpt", "")), sha)
    if name is None:
        del qp["ckpt"]                  # the note says why: the default checkpoint, without a second note
        ss[LINK_MODEL_NOTES] = notes
    elif qp.get("ckpt") != name:
        qp["ckpt"] = name


def commit(view: ViewState) -> None:
    """Write `view` to session_state and the URL."""
    ss = st.session_state
    ss["ckpt"], ss["image"], ss["patch"] = view.ckpt, view.image, tuple(view.patch)
    ss["layer"], ss["head"], ss["epoch"] = view.layer, view.head, view.epoch
    ss["shift"], ss["size"], ss["fill"] = tuple(view.shift), view.size, view.fill
    ss["rollout"], ss["fusion"], ss["show"] = view.rollout, view.fusion, view.show
    q = to_query(view)
    # Compared with what the app last wrote too: the URL this rerun carries may be stale, and
    # equal to the new view while the address bar already shows a later one.
    if q != ss.get(SYNCED) or {k: v[-1] for k, v in query_dict().items() if v} != q:
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
    """The sidebar's link to `view` (an uploaded image included: `image=upload:<sha256>`)."""
    with st.sidebar:
        st.markdown("**Link to this view**")
        st.code(share_link(view), language=None, wrap_lines=True)
        if upload_active:
            st.caption("The link opens your uploaded image for anyone on this server, as long as the server "
                       "keeps it (the oldest uploads make room for new ones).")


# ----------------------------------------------------------------------------- controlled widgets
def show_in_widget(key: str, value: Any) -> None:
    """Set widget `key` to `value` before it is drawn, only if it shows something else: writing
    an unchanged value would send it to the browser again and could undo a newer change
    made there while this run was under way."""
    ss = st.session_state
    if key not in ss or ss[key] != value:
        ss[key] = value


def bound(widget: Callable[..., Any], key: str, canon: str, *, to_widget: Callable[[Any], Any] = lambda v: v,
          from_widget: Callable[[Any], Any] = lambda v: v, then: Callable[[], None] | None = None,
          **kwargs) -> Any:
    """Draw `widget(key=key)` showing `session_state[canon]`; a change writes it back (and
    calls `then`)."""
    show_in_widget(key, to_widget(st.session_state[canon]))

    def changed() -> None:
        st.session_state[canon] = from_widget(st.session_state[key])
        if then is not None:
            then()

    return widget(key=key, on_change=changed, **kwargs)


def checkpoint_select(prefix: str, names: Sequence[str], *, label: str = "Checkpoint") -> str:
    return bound(st.selectbox, f"{prefix}_ckpt", "ckpt", label=label, options=list(names),
                 help="Checkpoints in the folder; '+' composes encodings (e.g. sape2+ape).")


def checkpoints_pick(prefix: str, names: Sequence[str]) -> list[str]:
    """Multiselect of checkpoints, in the order picked, bound to the view's `show` (the link keeps
    it); `None` there = the main folder's checkpoints and this session's imported models, not the
    groups' (`long/...`), unless there is nothing else."""
    default = [n for n in names if not in_group(n)] or list(names)
    return bound(st.multiselect, f"{prefix}_show", "show", label="Checkpoints to show", options=list(names),
                 to_widget=lambda v: list(default if v is None else v),
                 from_widget=lambda v: None if list(v) == default else tuple(v),
                 placeholder="Pick checkpoints to compare",
                 help="In the order picked; the share link keeps the pick. " + (
                     "Shown at first: all but the longer-budget runs (" + ", ".join(f"{g}/" for g in GROUPS)
                     + "), which you can add here." if len(default) < len(names) else "Shown at first: all."))


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


def controls_hint(prefix: str, layer: int, head: int | None) -> None:
    """On screens up to `NARROW_PX` wide (a phone: the sidebar starts collapsed) the main area
    says which layer and head the maps show and where their controls are. A second set of
    controls here would fight the sidebar's: a rerun carries every widget's value from the
    browser, and the copy the browser had not yet updated would set the view back."""
    box = f"{prefix}_controls_hint"
    st.html(f"<style>@media (min-width: {NARROW_PX + 1}px) {{ .st-key-{box} {{ display: none; }} }}</style>")
    with st.container(key=box):
        st.caption(f"Showing layer {layer}, {'mean over heads' if head is None else f'head {head}'}. The image, "
                   "layer and head controls are in the sidebar: tap › at the top left.")


def patch_controls(prefix: str, grid: tuple[int, int]) -> tuple[int, int]:
    """Row / column number inputs (the keyboard-accessible way to choose a patch)."""
    H, W = grid
    r_col, c_col = st.columns(2)

    def changed() -> None:
        st.session_state["patch"] = (int(st.session_state[f"{prefix}_row"]), int(st.session_state[f"{prefix}_col"]))

    r, c = st.session_state["patch"]
    show_in_widget(f"{prefix}_row", int(r))
    show_in_widget(f"{prefix}_col", int(c))
    r_col.number_input("Row r", min_value=0, max_value=H - 1, step=1, key=f"{prefix}_row", on_change=changed)
    c_col.number_input("Column c", min_value=0, max_value=W - 1, step=1, key=f"{prefix}_col", on_change=changed)
    return st.session_state["patch"]


def patch_text(patch: tuple[int, int], grid: tuple[int, int]) -> None:
    r, c = patch
    st.markdown(f"**Patch ({r}, {c})** — token n = r·W + c = {r * grid[1] + c} of {grid[0]}×{grid[1]}")


def _centres(to_patch: Callable[[float, float, float, float], tuple[int, int]], w: int, h: int
             ) -> tuple[dict[int, float], dict[int, float]]:
    """Pixel centre of every column and row of patches, from `to_patch` sampled along the image's
    middle row and column (pickers map x to a column and y to a row independently)."""
    cols: dict[int, list[float]] = {}
    rows: dict[int, list[float]] = {}
    for x in range(w):
        cols.setdefault(to_patch(x + 0.5, h / 2, w, h)[1], []).append(x + 0.5)
    for y in range(h):
        rows.setdefault(to_patch(w / 2, y + 0.5, w, h)[0], []).append(y + 0.5)
    return ({c: (v[0] + v[-1]) / 2 for c, v in cols.items()}, {r: (v[0] + v[-1]) / 2 for r, v in rows.items()})


@st.cache_data(max_entries=64, show_spinner=False)
def _picker_spec(png: bytes, w: int, h: int, cols: dict[int, float], rows: dict[int, float]) -> dict:
    """The picker's Plotly figure as a dict (built once per image; the selected patch is added
    per run): the image, and one transparent marker per patch centre carrying `(r, c)`."""
    pts = [(r, c) for r in sorted(rows) for c in sorted(cols)]
    hidden = {"marker": {"opacity": 0}}
    return {"data": [
        {"type": "image", "source": "data:image/png;base64," + base64.b64encode(png).decode(), "x0": 0.5, "dx": 1,
         "y0": 0.5, "dy": 1, "hoverinfo": "skip"},
        {"type": "scatter", "mode": "markers", "x": [cols[c] for _, c in pts], "y": [rows[r] for r, _ in pts],
         "customdata": [[r, c] for r, c in pts], "marker": {"size": 12, "opacity": 0, "color": "#ffffff"},
         "selected": hidden, "unselected": hidden, "showlegend": False,
         "hovertemplate": "patch (%{customdata[0]}, %{customdata[1]}) — click to select<extra></extra>"}],
        "layout": {"xaxis": {"range": [0, w], "visible": False, "fixedrange": True, "constrain": "domain"},
                   "yaxis": {"range": [h, 0], "visible": False, "fixedrange": True, "scaleanchor": "x",
                             "constrain": "domain"},
                   "margin": {"l": 0, "r": 0, "t": 0, "b": 0}, "height": min(h, 420), "hovermode": "closest",
                   "hoverdistance": -1, "clickmode": "event+select", "dragmode": False,
                   "plot_bgcolor": "rgba(0,0,0,0)", "paper_bgcolor": "rgba(0,0,0,0)"}}


@functools.lru_cache(maxsize=32)
def _png_of(mode: str, size: tuple[int, int], raw: bytes) -> bytes:
    buf = io.BytesIO()
    Image.frombytes(mode, size, raw).convert("RGB").save(buf, "PNG", optimize=False, compress_level=1)
    return buf.getvalue()


def _png(img: Image.Image) -> bytes:
    """`img` as PNG; the last 32 images' are remembered by content (a click redraws the picker
    with the same image: encoding it again cost ~20 ms of the server's CPU per click)."""
    return _png_of(img.mode, img.size, img.tobytes())


def clickable(img: Image.Image, key: str, to_patch: Callable[[float, float, float, float], tuple[int, int]], *,
              selected: tuple[int, int] | None = None, box: tuple[float, float, float, float] | None = None) -> None:
    """An image that sets `session_state["patch"]` where it is clicked: a Plotly chart with one
    invisible marker per patch (selection event, no iframe). `to_patch(x, y, width, height)` maps
    a pixel to its patch; `box` (x0, y0, x1, y1 in pixels) outlines the `selected` patch."""
    import plotly.graph_objects as go

    w, h = img.size
    cols, rows = _centres(to_patch, w, h)
    spec = _picker_spec(_png(img), w, h, cols, rows)
    if box is not None:
        x0, y0, x1, y1 = box
        spec = {**spec, "layout": {**spec["layout"], "shapes": [
            {"type": "rect", "x0": x0, "y0": y0, "x1": x1, "y1": y1,
             "line": {"color": figures.HIGHLIGHT, "width": 3}}]}}
    valid = {(r, c) for r in rows for c in cols}

    def clicked() -> None:
        points = ((st.session_state.get(key) or {}).get("selection") or {}).get("points") or []
        for p in points[:1]:
            rc = p.get("customdata") if isinstance(p, dict) else None
            if isinstance(rc, (list, tuple)) and len(rc) == 2 and tuple(rc) in valid:
                st.session_state["patch"] = (int(rc[0]), int(rc[1]))

    st.plotly_chart(go.Figure(spec, _validate=False), key=key, on_select=clicked, selection_mode="points",
                    config={"displayModeBar": False, "scrollZoom": False, "doubleClick": False})


# ----------------------------------------------------------------------------- images
@st.cache_data(max_entries=8, show_spinner=False)
def _decode(data: bytes) -> tuple[Image.Image, list[str]] | str:
    try:
        img, info = load_image_info(data)
    except ImageError as e:
        return str(e)
    img.thumbnail((MAX_UPLOAD_SIDE, MAX_UPLOAD_SIDE), Image.LANCZOS)
    return img, info.notes()


def decode_upload(data: bytes) -> tuple[Image.Image | None, str | None]:
    """Uploaded bytes -> (RGB image, None) or (None, the reason it was refused).
    Decoding is `images.load_image`; large images are shrunk to 1024 px on the long side."""
    img, err, _ = decode_upload_notes(data)
    return img, err


def decode_upload_notes(data: bytes) -> tuple[Image.Image | None, str | None, list[str]]:
    """`decode_upload` plus notes on what was done to the file (an animation's first frame)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None, f"Expected the file's bytes, got {type(data).__name__}.", []
    out = _decode(bytes(data))
    return (None, out, []) if isinstance(out, str) else (out[0], None, out[1])


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
    img, err, notes = decode_upload_notes(up.getvalue())
    if err is not None:
        ss[UPLOAD_ERROR] = (key, f"{up.name}: {err}")
        ss.pop(UPLOAD, None)
        return
    try:
        image_id = cache.store_upload(img)
    except OSError as e:
        log.warning("upload store not writable: %s", e)
        ss[UPLOAD_ERROR] = (key, f"{up.name} could not be kept on the server ({type(e).__name__}); try again later.")
        return
    ss[UPLOAD] = {"name": up.name, "id": image_id, "notes": notes}
    ss["image"] = image_id


def image_source(prefix: str) -> tuple[Image.Image, str, str, bool]:
    """Gallery choice (bound to the view's `image`) or this session's upload (kept across
    pages until another file is uploaded, a sample is chosen or it is cleared).
    Returns (image, cache key, caption, is_upload)."""
    ss = st.session_state
    ids = gallery_ids()
    current = ss.get("image", "")
    held = ss.get(UPLOAD) if (ss.get(UPLOAD) or {}).get("id") == current else None
    img = cache.stored_image(current) if is_upload_id(current) else None
    if img is None and is_upload_id(current):          # evicted since the view was checked
        clear_upload()
        current, held = ss.get("image", ""), None
    name = held["name"] if held else (f"shared upload {current[7:19]}…" if img is not None else "")

    def label(i: str) -> str:
        return f"your upload: {name}" if is_upload_id(i) else gallery_caption(i)

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
    st.caption(f"Showing {'your upload' if held else 'the shared upload'} **{escape_md(name)}** "
               f"(`{current[7:19]}`) on every page of this session.")
    st.button("Clear the upload (back to the sample image)", key=f"{prefix}_clear_upload", on_click=clear_upload)
    return img, current, f"uploaded: {name}", True


def fit_image(prefix: str, img: Image.Image, key: str, ckpt, is_upload: bool
              ) -> tuple[Image.Image, str, Image.Image | None]:
    """Notes on how `ckpt`'s model takes `img` (an animation's first frame, a tiny image
    enlarged, a crop that leaves part of it out) and, when the crop leaves part out, the choice
    to pad instead (letterbox, session-wide). Returns (the image, its cache key, the image to
    pass to the caches: None for an unchanged sample image)."""
    if is_upload:
        for note in (st.session_state.get(UPLOAD) or {}).get("notes", []):
            st.info(note)
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
        st.info(fit.crop_note(), icon="✂️")
        return plain
    pre = preprocess_of(ckpt)
    crop_pct = float(pre["crop_pct"]) if pre else 1.0
    padded = views.letterbox(img, ckpt.config.img_size, crop_pct)
    H, W = ckpt.config.img_size
    st.caption(f"Padded: the whole {img.width}×{img.height} px image on grey bars, to the model's {W}×{H} shape.")
    return padded, f"{key}|pad{H}x{W}@{crop_pct:g}", padded


# ----------------------------------------------------------------------------- output
def chart(fig, name: str, key: str) -> None:
    """A Plotly chart whose camera button saves `name`.png or `name`.svg: the sidebar's "Figure
    download format" (drawn by a run's first chart, then set aside: a second draw of its key
    raises; kept for the session in `session_state["_vitpe_figure_format"]`). SVG is drawn by
    the browser's Plotly, vector and editable, as PNG is: no server-side image export."""
    from streamlit.errors import StreamlitDuplicateElementKey

    ss, formats = st.session_state, ["png", "svg"]
    chosen = ss.setdefault("_vitpe_figure_format", "png")
    try:                                               # the widget starts at the session's choice on every page
        st.sidebar.radio("Figure download format", formats, index=formats.index(chosen), key="figure_format",
                         horizontal=True, format_func=str.upper,
                         on_change=lambda: ss.__setitem__("_vitpe_figure_format", ss["figure_format"]),
                         help="What the camera button at the top right of every chart saves: PNG (twice the "
                              "screen size) or SVG (vector, for papers).")
    except StreamlitDuplicateElementKey:
        pass                                           # an earlier chart of this run drew it
    config = figures.export_config(name)
    config["toImageButtonOptions"]["format"] = ss["_vitpe_figure_format"]
    st.plotly_chart(fig, config=config, key=key)


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


def downloads(name: str, shown: np.ndarray, key: str, *, full: np.ndarray | None = None,
              shown_what: str = "the map shown", full_what: str | None = None) -> None:
    """CSV of the map shown and NPY of the full array (`full`, default the map), each button
    saying what it holds (`shown_what`, `full_what`: e.g. "shown map, normalised 0–1" and
    "raw bias, all layers × heads"; the shapes in their tooltips). The labels wrap rather than
    being cut off in a narrow column."""
    safe = figures.export_config(name)["toImageButtonOptions"]["filename"]
    full = shown if full is None else full
    with st.container(horizontal=True, key=f"{key}_row"):
        st.download_button(f"CSV: {shown_what}", data=lambda: _csv(shown), file_name=f"{safe}.csv", mime="text/csv",
                           key=f"{key}_csv", on_click="ignore", wrap=True,
                           help=f"Comma-separated, shape {tuple(np.shape(shown))} (2-D: one line per row)")
        st.download_button(f"NPY: {full_what or shown_what}", data=lambda: _npy(full), file_name=f"{safe}.npy",
                           mime="application/octet-stream", key=f"{key}_npy", on_click="ignore", wrap=True,
                           help=f"numpy.load() it: shape {tuple(np.shape(full))}, {np.asarray(full).dtype}")


def load_checkpoint_or_error(name: str):
    """The checkpoint, or None after an st.error saying why it cannot be used."""
    try:
        return cache.get_checkpoint(name)
    except (ValueError, OSError) as e:   # CheckpointError is a ValueError
        st.error(f"Checkpoint {name!r} cannot be used: {e}")
        return None


def checkpoint_configs(names: Sequence[str]) -> dict:
    """name -> model config for every checkpoint whose header reads (no model is loaded); an
    st.error for each that does not."""
    configs = {}
    for name in names:
        try:
            configs[name] = cache.checkpoint_config(name)
        except (ValueError, OSError) as e:   # CheckpointError is a ValueError
            st.error(f"Checkpoint {name!r} cannot be used: {e}")
    return configs


def load_checkpoints(names: Sequence[str]) -> dict:
    """name -> checkpoint for every one that loads; an st.error for each that does not. The
    first visit reads them from disk, behind a spinner that says so."""
    with st.spinner(f"Loading {len(names)} checkpoints (the first visit reads them from disk)…"):
        loaded = {name: load_checkpoint_or_error(name) for name in names}
    return {name: ckpt for name, ckpt in loaded.items() if ckpt is not None}


def load_shown(ref: str, shown: Sequence[str]) -> tuple[dict, list[str], Any]:
    """Load checkpoint `ref` and the `shown` ones, no others: (name -> checkpoint, the shown
    names that loaded, the reference checkpoint: `ref`, else the first that loaded, else None)."""
    ckpts = load_checkpoints(list(dict.fromkeys([ref, *shown])))
    return ckpts, [n for n in shown if n in ckpts], ckpts.get(ref) or next(iter(ckpts.values()), None)


@st.cache_data(max_entries=32, show_spinner=False)
def _grid_picture(display: np.ndarray, grid: tuple[int, int]) -> Image.Image:
    return figures.grid_image(display, grid)


def patch_picker(page: str, img: Image.Image, ckpt, patch: tuple[int, int], caption: str, *,
                 max_side: int = 320) -> np.ndarray:
    """The image as `ckpt`'s model sees it (its crop, at least 20 px per patch) with its patch
    grid, clickable, plus the keyboard row/column inputs; returns the displayed image
    `(h, w, 3)` for overlays."""
    grid = ckpt.config.grid
    st.caption(caption)
    display = figures.display_image(cache.model_crop(img, ckpt), ckpt.config.img_size,
                                    max_side=max(max_side, 20 * max(grid)))
    H, W = grid
    h_px, w_px = display.shape[:2]
    ph, pw = h_px / H, w_px / W
    clickable(_grid_picture(display, grid), f"{page}_click",
              lambda x, y, w, h: figures.pixel_to_patch(x, y, w, h, grid),
              box=(patch[1] * pw, patch[0] * ph, (patch[1] + 1) * pw, (patch[0] + 1) * ph))
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


def epoch_control(page: str, view: ViewState) -> ViewState:
    """A slider over the epochs recorded in the view's checkpoint's history, bound to the
    view's `epoch` (None = final weights; in the share link); returns the view."""
    epochs = epochs_of(view.ckpt)
    if view.epoch is not None and view.epoch not in epochs:       # the page showed another checkpoint
        view = ViewState(**{**view.__dict__, "epoch": None})
        commit(view)
    if not epochs:
        st.sidebar.caption("This checkpoint recorded no training history.")
        return view
    with st.sidebar:
        bound(st.select_slider, f"{page}_epoch", "epoch", label="Epoch (table recorded during training)",
              options=[*epochs, FINAL_EPOCH], help="Watch the row/column structure emerge as training proceeds.",
              to_widget=lambda e: FINAL_EPOCH if e is None else e,
              from_widget=lambda v: None if v == FINAL_EPOCH else int(v))
    return view


# ----------------------------------------------------------------------------- what am I looking at?
SPEC = "`docs/encodings.md` in the repository"
VIT_PAPER = "[the ViT paper](https://arxiv.org/abs/2010.11929)"
SAPE2_PAPER = "[the SaPE² paper](https://arxiv.org/abs/2505.09466)"
EXPLAIN = {
    "bias": f"""
A Vision Transformer cuts the image into patches (the grid over the picture) and lets every patch
*attend* to every other one. Pick a patch — click it, or type its row and column — and the maps show
how that patch, the *query*, relates to all the others.

* **Bias row.** Some position encodings add a number, a *bias*, to the attention score of every pair
  of patches. The bias row is that number from your query patch to each patch. **SaPE²**
  (semantic-aware position encoding, {SAPE2_PAPER}) computes it from the image itself: along the
  query's row and along its column it counts how many patches are "like" the query (the idea of
  CoPE, counted in 2D), and turns those counts into a distance between patches. Two patches far
  apart on the grid can be near in this distance when the content between them is alike.
* **x part, y part**: the distance counted along the row and along the column; their sum is the bias.
* **0 = near, 1 = far.** Every map is rescaled to 0–1 on its own (smallest value → 0, largest → 1):
  raw values differ a lot between layers, heads and models, and the *shape* of the map is what
  tells you something. 0 marks the patches the encoding counts as nearest the query (the query
  itself), 1 the farthest. The NPY download holds the raw values.
* **Attention row** (below): what the whole model does, content and position together — the softmax
  weights from the query patch to every patch, in one layer and head (or their mean).

Encodings with no bias (learned tables, RoPE) show only the attention row; the Compare page shows
each one's positional part. Equations: {SPEC}; background: {VIT_PAPER}.
""",
    "similarity": f"""
Encodings such as `ape` learn one vector per patch position (a *position embedding*) and add it to
the patch before the first layer. Nothing tells them that position (3, 4) is next to (3, 5): do they
learn it? {VIT_PAPER}'s Figure 7 shows it: tile (r, c) is the **cosine similarity** between the
embedding of patch (r, c) and that of every patch (1 = same direction, 0 = unrelated, −1 = opposite).
A table that learned 2D structure lights up around each tile's own position and along its row and
column. The colours are raw cosines on a fixed −1…1 scale (no normalisation).

The **2D structure** score sums this up: the rank correlation between similarity and closeness on
the grid (1 = similarity falls off perfectly with distance, 0 = no relation). The **epoch** slider
shows the table as it was during training. Equations: {SPEC}.
""",
    "compare": f"""
Every checkpoint on the same image and query patch, side by side (one run per encoding at first;
add the 50-epoch `long/` runs, or leave some out, under **Checkpoints to show**). In each panel the left map is
the encoding's own positional part and the right map the whole model's attention row from the
query patch:

* **bias row** (SaPE², CoPE, rpb): the bias added to attention scores, rescaled to 0–1 per map
  (0 = near, 1 = far; see the Bias explorer's explanation);
* **table similarity** (ape, ape2d, sincos2d): how similar the query's position embedding is to
  every other one (cosine, −1…1);
* **RoPE kernel** (rope_axial, rope_mixed): how much rotating q and k by position alone weighs
  each offset (mean cosine of the angle differences).

The table compares test accuracy, the table's 2D structure, and, at the chosen layer, how far
(in patches) and how spread out (entropy) the query's attention is. Equations: {SPEC}; the
SaPE² encoding: {SAPE2_PAPER}.
""",
    "checkpoints": f"""
The trained models this app explores: one small ViT per position encoding, trained with the same
recipe on CIFAR-10 (see the README), plus any pretrained ViT you import below for this session.
*2D structure* scores a learned position table (see the Embedding similarity page); the chosen
checkpoint's configuration, recipe and training curves are below the table. Equations: {SPEC};
background: {VIT_PAPER}.
""",
}


def explain(page: str) -> None:
    """The page's "What am I looking at?" expander (closed): what it shows, for a student who
    has read the ViT paper but not the SaPE² paper."""
    with st.expander("What am I looking at?", expanded=False):
        st.markdown(EXPLAIN[page])
