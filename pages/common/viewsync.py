"""The view state, kept in sync between `st.session_state` and the URL's query string, and the
share link that reopens it.

The view (`viewstate.ViewState`) lives in `st.session_state` under the plain keys `ckpt`,
`image`, `patch` (a tuple `(r, c)`), `layer`, `head` (`None` = mean over heads), `epoch`
(`None` = final weights), the stress test's and rollout's keys, `show` and `open` (the bias
explorer's open sections), and in the URL:

* the URL is read on a session's first run (a shared or pasted link: opening a URL starts a
  new session) and on a run started by the browser's back / forward buttons; on every other
  run session_state wins and the URL is only written. The browser sends its address bar with
  every rerun, and quick actions (keyboard auto-repeat on a slider) send one the app has not
  replaced yet: treating such a stale URL as a pasted link set the view back and lost the
  next action;
* every value is validated by `viewstate.parse_view` against the selected checkpoint
  (grid, depth, heads, recorded epochs); an invalid one falls back to its default with an
  `st.warning`;
* the widgets that show the view are bound to these keys (`widgets.bound`), so views survive
  page switches.

A link's uploaded image (`image=upload:<sha256>`) opens from the server's upload store
(`upload_store.stored_image`); an evicted one falls back to the first sample image with a warning.
A link's imported model (`model=<sha256>`) is listed in the session by `open_link_model`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import numpy as np
import streamlit as st

from vitpe_core.checkpoint import CheckpointError
from vitpe_core.gallery import gallery_ids
from vitpe_core.viewstate import (FINAL_EPOCH, KEYS, MEAN_HEAD, NATIVE_SIZE, PAGES, STRESS_KEYS, UPLOAD_PREFIX,
                                  StressLimits, ViewState, implied_sections, is_model_id, is_upload_id, parse_view,
                                  to_query)

from . import cache, imported, upload_store
from .messages import show_notes

VIEW_KEYS = ("ckpt", "image", "patch", "layer", "head", "epoch", *STRESS_KEYS, "show", "open")
# The keys whose valid values the checkpoint decides (its grid, depth, heads, shifts, sizes): one the
# session carried over from another checkpoint (a pick in the select box, an import) quietly falls
# back to the new one's default; only a link's is reported (issue 44, 11c: "Ignored patch='4,4':
# outside the 4x4 patch grid" right after an import, for a patch the visitor never typed).
PER_MODEL_KEYS = ("patch", "layer", "head", *STRESS_KEYS)
SYNCED = "_vitpe_synced_query"                  # the query string this session last wrote
LINK_MODEL_NOTES = "_vitpe_link_model_notes"   # open_link_model's note, shown by current_view
DEFAULT_URL = "http://localhost:8501/"
SHARE_KEY = "share"   # the share popover's key: `.st-key-share` in the page (benchmarks.harness.share_link)

Dims = tuple[tuple[int, int], int, int]   # (grid, depth, heads)


def short_id(image_id: str) -> str:
    """What the pages show of an uploaded image's id `upload:<sha256>`: its hash's first 12 digits."""
    return image_id[len(UPLOAD_PREFIX):][:12]


def query_dict() -> dict[str, list[str]]:
    """The URL's query string: key -> every value it carries."""
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
    if key == "open" and isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    return value


def dims_of(name: str) -> Dims | None:
    """(grid, depth, heads) of checkpoint `name`; None if there is none or it cannot be read."""
    if not name:
        return None
    try:
        cfg = cache.checkpoint_config(name)
    except (CheckpointError, OSError):
        return None
    return cfg.grid, cfg.depth, cfg.heads


def epochs_of(name: str) -> list[int]:
    """The training epochs checkpoint `name` recorded a snapshot of (empty if none or unreadable)."""
    if not name:
        return []
    try:
        return list(cache.checkpoint_header(name).epochs)
    except (CheckpointError, OSError):
        return []


def stress_limits_of(name: str) -> StressLimits:
    """The stress test's and rollout's options for checkpoint `name` (shifts, input heights,
    prefix tokens); only the defaults if there is none or it cannot be read."""
    from vitpe_core import positional, stress

    if not name:
        return StressLimits()
    try:
        cfg = cache.checkpoint_config(name)
    except (CheckpointError, OSError):
        return StressLimits()
    native = tuple(cfg.img_size)
    return StressLimits(shifts=tuple(stress.shift_options(cfg.patch_size)),
                        heights=tuple(h for h, _ in stress.size_options(native, cfg.patch_size)), native=native[0],
                        sources=tuple(positional.rollout_sources(getattr(cfg, "num_prefix", 0),  # Swin: none
                                                                 getattr(cfg, "prefix_names", list)())))


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
    if not from_url:   # another checkpoint, another grid, depth, heads, shifts and sizes: the session's values
        notes = [n for n in notes if not n.startswith(tuple(f"Ignored {k}=" for k in PER_MODEL_KEYS))]
    if is_upload_id(view.image) and upload_store.stored_image(view.image) is None:
        notes.append(f"The uploaded image of this link ({short_id(view.image)}…) is not on this server: it was "
                     "never uploaded here, or removed to make room for newer uploads. Showing the sample image "
                     "instead; upload the photo again to share it.")
        view = ViewState(**{**view.__dict__, "image": images[0] if images else ""})
    if from_url and "open" not in url:   # a link from before `open`: its stress or rollout settings open their sections
        view = ViewState(**{**view.__dict__, "open": implied_sections(view)})
    show_notes([*st.session_state.pop(LINK_MODEL_NOTES, []), *notes])
    view = ViewState(**{**view.__dict__, "page": page, "model": imported.uploaded_models().get(view.ckpt, "")})
    commit(view)
    return view


def open_link_model() -> None:
    """A link's imported model (`ckpt=NAME&model=<sha256>`, see `viewstate`): on a run that
    reads the URL (as `current_view`), list it in this session from the server's store and
    point the URL's `ckpt` at its name here, before the page lists the checkpoints. The app
    calls it before every page; a note (the store no longer holds it) waits for `current_view`."""
    ss, qp = st.session_state, st.query_params
    if not (ss.get(SYNCED) is None or (bool(qp) and history_navigation())):
        return
    sha = qp.get("model", "")
    if not is_model_id(sha):
        return
    name, notes = imported.open_shared_model(str(qp.get("ckpt", "")), sha)
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
    ss["open"] = tuple(view.open)
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
    """The sidebar's "Share this view" button: a popover with the link to `view` (an uploaded image
    included: `image=upload:<sha256>`) and its copy button. In a popover, whose content the
    browser draws only when opened, the code block's highlighter (1.5 MB of JavaScript, 0.25 s of
    the browser's main thread on 2 cores) is not part of the first page (BENCHMARKS.md section 4)."""
    with st.sidebar, st.popover("Share this view", icon=":material/link:", key=SHARE_KEY, width="stretch"):
        st.markdown("**Link to this view** — it reopens this page with the same checkpoint, image, patch, "
                    "layer and head:")
        st.code(share_link(view), language=None, wrap_lines=True)
        if upload_active:
            st.caption("The link opens your uploaded image for anyone on this server, as long as the server "
                       "keeps it (the oldest uploads make room for new ones).")
