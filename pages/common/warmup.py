"""Do the first visitor's slow work at server start, around the first page rather than before it.

On a cold start the first page used to wait for torch's import (1 s of CPU, 2 s beside the
browser loading Streamlit's and Plotly's code on 2 cores), the fused kernel and the default
view's trace. `streamlit run app.py` finds the `st.App` in app.py (made only when the file is
imported as a module, not in a visitor's run), whose lifespan calls `start`: one daemon thread

1. imports Plotly and the default page's modules (`CHARTING`, `PAGE_MODULES`: none imports torch
   or pandas, tests/test_app.py checks it) and reads the default view's checkpoint header and the trace
   stored beside it (`vitpe_core.stored_trace`): the first page is drawn from these, no torch;
2. waits until the first visitor's first page was sent and `SETTLE_S` has passed for the browser
   to draw it (`page_sent`), or until a run needs a model (`wait_for_torch`, called by
   `cache.load_model`), or `VISITOR_GRACE_S` from the start when no visitor came;
3. imports torch, loads (or first compiles) the fused C++ kernel, runs one forward pass of a
   tiny model, puts the default view's checkpoint and trace in the app's caches, and imports
   pandas and the other pages' modules (`LATER_MODULES`).

A visitor's run calls `wait_visibly` (step 1) before its own imports, so that the two never
import the same modules at once (a half-imported module seen from another thread broke Plotly
once; RELIABILITY.md), and `wait_for_torch` before its first model (step 3's torch, kernel and
forward pass): what it waits for is said on the page ("Preparing the app: compiling the fused
SaPE²/CoPE attention kernel (once per install, 10–30 s)… 12 s"), replaced by the page when
ready. On a fresh install (an empty torch extension cache, or a cached build torch finds out of
date) the kernel compiles in 10–15 s on 2 cores (a minute under load): the log says when that
build starts and ends ("warm-up: compiling the fused SaPE²/CoPE kernel …", "… built in 41.2 s"),
and how long the whole warm-up took ("warm-up done in 2.9 s").

Where nothing calls `start` (AppTest; `VITPE_WARMUP=0` turns it off), `wait` and `wait_for_torch`
return at once. Nothing heavy is imported here: app.py imports this module on every run.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from streamlit.logger import get_logger   # the server's log format and level

log = get_logger(__name__)

# Imported first, so that a visitor's first run can draw a chart (`prefetch_frontend`).
# vitpe_core.figures makes Plotly's "is pandas loaded?" safe while another thread imports pandas (figures.threadsafe):
# so no page waits for pandas (0.3 s of CPU) before its first chart.
CHARTING = ("plotly.graph_objects", "plotly.io", "plotly.tools", "plotly.offline", "vitpe_core.figures")
# In the order the default page's first run imports them (app.py, then pages/bias.py through pages.common), neither
# torch nor pandas: the first page is drawn before either is imported (from a stored trace, vitpe_core.stored_trace).
# Kept by hand; tests/test_app.py checks that it covers every module the default page imports at module level, and
# with LATER_MODULES every module of the other pages.
PAGE_MODULES = ("vitpe_core.analysis", "vitpe_core.figures.picker", "vitpe_core.views",
                "vitpe_core.positional", "vitpe_core.stress", "vitpe_core.stored_trace",
                "pages.common.cache", "pages.common.messages", "pages.common.viewsync", "pages.common.status",
                "pages.common.widgets", "pages.common.explain", "pages.common.loading", "pages.common.output",
                "pages.common.picker", "pages.common.uploads", "pages.common.import_form",
                "pages.common.stress_panel", "pages.common.film", "pages.common.report_button",
                "pages.common.prediction", "pages.common.swin_view", "pages.common.model_import")
# The other pages' tables (pandas): imported last, after the first page and torch (a page that needs them first
# imports them in its own run).
LATER_MODULES = ("pandas", "pages.common.position_panel", "pages.common.resolution")
# What any model needs: imported after the first visitor's first page is drawn (`_run`), or when a run needs it.
TORCH_MODULES = ("torch", "vitpe_core.model", "vitpe_core.swin.model")
THREAD = "vitpe-warmup"
WAIT_S = 120.0                  # a visitor waits at most this long; the imports then run in its own script
BUILD_WAIT_S = 900.0            # ... or this long while the kernel compiles (its own run would wait for it too)
SHOW_EVERY_S = 0.5              # how often the waiting page's message is brought up to date

# What the warm-up is doing, as the waiting page says it ("Preparing the app: <stage>… 12 s").
IMPORTING = "loading Plotly and the app's modules"
TORCH = "loading PyTorch"
KERNEL = "loading the fused SaPE²/CoPE attention kernel"
COMPILING = "compiling the fused SaPE²/CoPE attention kernel (once per install, 10–30 s)"
FORWARD = "running a first forward pass"
DEFAULT_VIEW = "loading the default checkpoint and tracing its image"

_done = threading.Event()
_charting = threading.Event()   # CHARTING imported: a visitor's run may draw a Plotly chart
_pages = threading.Event()      # PAGE_MODULES imported, the default view's stored trace read: a page may run
_visitor = threading.Event()    # a visitor's first run has drawn its title and the prefetch
_go = threading.Event()         # torch may be imported now: the first page is drawn, or a run needs a model
_torch = threading.Event()      # torch imported, the kernel loaded, a first forward pass run: a run may use a model
VISITOR_GRACE_S = 5.0           # the warm-up waits this long from its start for a first visitor, then imports torch
SETTLE_S = 2.5                  # ... or this long after that visitor's first page was sent (the browser draws it)
FIRST_PAGE_WAIT_S = 30.0        # ... but no longer than this for that page
_started = False
_lock = threading.Lock()
_stage: tuple[str, float] = (IMPORTING, time.monotonic())   # (what it does now, since when: time.monotonic())
seconds: float | None = None    # how long the warm-up took (None until done)


def _set_stage(text: str) -> None:
    global _stage
    _stage = (text, time.monotonic())


def _run() -> None:
    global seconds
    t0 = time.perf_counter()
    log.info("warm-up: started (imports, the fused kernel, a first forward pass, the default view)")
    try:
        _set_stage(IMPORTING)
        for name in CHARTING:
            importlib.import_module(name)
        _charting.set()
        for name in PAGE_MODULES:
            importlib.import_module(name)
        _stored_view()
        _pages.set()
        # A browser that connects now loads Streamlit's page and Plotly's code (about 2 s of CPU on
        # its side); torch's import (1 s of CPU, most of it holding the GIL, so that the server
        # answers the browser late) slowed both by about as much, and the first page waited for it.
        # Now that page is drawn from the trace stored with the checkpoint, and torch waits until
        # it was sent and drawn (SETTLE_S), or until a run needs a model (`wait_for_torch`), or
        # VISITOR_GRACE_S from the start when no visitor came.
        if not _visitor.wait(max(0.0, VISITOR_GRACE_S - (time.perf_counter() - t0))):
            _go.set()
        _go.wait(FIRST_PAGE_WAIT_S)
        _set_stage(TORCH)
        for name in TORCH_MODULES:
            importlib.import_module(name)
        _load_kernel()
        _set_stage(FORWARD)
        _first_forward()
        _torch.set()    # before the default view: a run waiting for torch may hold a cache entry that one needs
        _set_stage(DEFAULT_VIEW)
        _default_view()
        for name in LATER_MODULES:
            importlib.import_module(name)
    except Exception:  # noqa: BLE001 — the visitor's own run then meets it where the page shows it
        log.exception("warm-up failed; the first page run does that work instead")
    finally:
        _charting.set()
        _pages.set()
        _torch.set()
        seconds = time.perf_counter() - t0
        log.info("warm-up done in %.2f s (imports, a first forward pass, the default view's checkpoint and trace)",
                 seconds)
        _done.set()


def kernel_needs_build() -> bool:
    """Whether the fused C++ kernel (`vitpe_core.encodings._kernels`) will be compiled, not only
    loaded, by its first use: its build folder holds no built library (a fresh install, an empty
    `TORCH_EXTENSIONS_DIR`, an edited source). False with `VITPE_NO_CPP=1`. (torch's ninja may
    still rebuild a cached one it finds out of date: `_load_kernel` notices that as it happens.)"""
    from vitpe_core.encodings import _kernels

    if os.environ.get("VITPE_NO_CPP", "") not in ("", "0"):
        return False
    name = _kernels.extension_name()
    folder = Path(_kernels.build_directory(name))
    return not any((folder / f"{name}{ext}").exists() for ext in (".so", ".pyd"))


def _compiler_running() -> bool:
    """Whether torch's build tool (`ninja`, which runs the compiler) is a child of this process
    now (Linux's /proc; False elsewhere)."""
    me = str(os.getpid())
    try:
        entries = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return False
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat") as f:
                comm, _, rest = f.read().rpartition(")")
        except OSError:
            continue
        fields = rest.split()
        if len(fields) > 1 and fields[1] == me and comm.endswith("(ninja"):
            return True
    return False


class _Build:
    """Says, once, in the log and on the waiting page, that the kernel is being compiled, and
    then how long that took."""

    def __init__(self, folder: str) -> None:
        self.folder, self.t0 = folder, None

    def started(self, why: str) -> None:
        if self.t0 is not None:
            return
        self.t0 = time.perf_counter()
        _set_stage(COMPILING)
        log.info("warm-up: compiling the fused SaPE²/CoPE kernel (%s; 10–30 s) in %s …", why, self.folder)

    def ended(self, built: bool) -> None:
        if self.t0 is None:
            return
        if built:
            log.info("warm-up: … fused SaPE²/CoPE kernel built in %.1f s", time.perf_counter() - self.t0)
        else:
            log.warning("warm-up: … the fused SaPE²/CoPE kernel could not be built (%.1f s); the slower eager "
                        "PyTorch path is used", time.perf_counter() - self.t0)


def _load_kernel() -> None:
    """Load the fused kernel, compiling it where no build of it is cached (10–15 s on 2
    cores: the longest part of a first start), or where torch finds the cached build out of date
    (a compiler then runs under this process): the log and the waiting page say so."""
    from vitpe_core.encodings import _kernels

    if os.environ.get("VITPE_NO_CPP", "") not in ("", "0"):
        return
    build = _Build(_kernels.build_directory(_kernels.extension_name()))
    loaded = threading.Event()
    if kernel_needs_build():
        build.started("first start after an install")
    else:
        _set_stage(KERNEL)

        def watch() -> None:    # a load is a second or two; a rebuild runs ninja under this process
            while not loaded.wait(0.5):
                if _compiler_running():
                    build.started("its cached build is out of date")
                    return

        threading.Thread(target=watch, name=f"{THREAD}-build-watch", daemon=True).start()
    try:
        built = _kernels.kernels() is not None
    finally:
        loaded.set()
    build.ended(built)


def _first_forward() -> None:
    """One forward pass of a tiny SaPE² + APE model: torch's first call of each operator (and of
    the C++ SaPE² kernel, `_load_kernel` loaded it) happens here instead of in the first visitor's trace."""
    import torch

    from vitpe_core.config import preset_config
    from vitpe_core.model import ViT

    with torch.no_grad():
        ViT(preset_config("tiny", encoding="sape2+ape")).eval()(torch.zeros(1, 3, 32, 32))


class _NotFromWarmup(logging.Filter):
    """Drops Streamlit's "missing ScriptRunContext" warnings of this thread: the caches' spinners
    have no page to draw on here, as intended."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != THREAD


def _default() -> tuple[str, str]:
    """(checkpoint, image) of the default view: what the first visitor's bias page shows first."""
    from pages.common import cache
    from vitpe_core.checkpoint import listed_checkpoints
    from vitpe_core.gallery import gallery_ids
    from vitpe_core.viewstate import default_view

    view = default_view(checkpoints=listed_checkpoints(cache.checkpoint_root()), images=gallery_ids())
    return view.ckpt, view.image


def _stored_view() -> None:
    """The default view's checkpoint header and its stored trace into the app's caches, where
    the checkpoint has one (`vitpe_core.stored_trace`): the first page, without torch."""
    from pages.common import cache

    name, image = _default()
    if name and cache.has_stored_trace(name, image):
        cache.checkpoint_header(name)
        cache.trace(name, image)


def _default_view() -> None:
    """The default view's checkpoint and the trace of its image into the app's caches (what the
    first visitor's other views ask for: the model)."""
    from pages.common import cache
    from vitpe_core.swin.explore import is_swin_model

    name, image = _default()
    if name:
        swin = is_swin_model(cache.checkpoint_config(name))
        cache.get_checkpoint(name)
        (cache.swin_trace if swin else cache.trace)(name, image)


def start() -> None:
    """Start the warm-up in a daemon thread (once per process; not with `VITPE_WARMUP=0`)."""
    global _started
    with _lock:
        if _started or os.environ.get("VITPE_WARMUP", "").strip() == "0":
            return
        _started = True
    get_logger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(_NotFromWarmup())
    threading.Thread(target=_run, name=THREAD, daemon=True).start()


def message() -> str | None:
    """What a waiting visitor is told ("Preparing the app: <stage>… 12 s"), None when nothing is
    to wait for."""
    if not _started or _done.is_set():
        return None
    text, since = _stage
    return f"Preparing the app: {text}… {time.monotonic() - since:.0f} s"


def wait(timeout: float = WAIT_S, show: Callable[[str], Any] | None = None,
         until: threading.Event | None = None) -> None:
    """Block until the warm-up is done (`until`: or has reached that stage; at once if none was
    started), at most `timeout` s (at least `BUILD_WAIT_S` while the kernel compiles). `show(text)`,
    if given, is called at once and then whenever `message()` changes (every `SHOW_EVERY_S` s at
    most) while it waits."""
    if not _started:
        return
    until = _done if until is None else until
    t0, shown = time.monotonic(), None
    while not until.is_set():
        waited = time.monotonic() - t0
        limit = max(timeout, BUILD_WAIT_S) if _stage[0] == COMPILING else timeout
        if waited >= limit:
            return
        text = message()
        if show is not None and text is not None and text != shown:
            show(text)
            shown = text
        until.wait(min(SHOW_EVERY_S, limit - waited))


def wait_for_torch() -> None:
    """Before a run's first use of a model: let the warm-up import torch now if it still waits for
    the first page to be drawn, and wait until torch, the kernel and a first forward pass are
    done (not the default view: this run may be computing an entry of the caches it fills),
    saying so in the page where the run is drawn (a visitor's model-free first page never calls
    it). At once where nothing is to wait for, and in the warm-up's own thread."""
    if not _started or _torch.is_set() or threading.current_thread().name == THREAD:
        return
    _go.set()
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    if get_script_run_ctx(suppress_warning=True) is None:
        wait(until=_torch)
        return
    import streamlit as st

    _wait_in(st.empty(), _torch)


def _wait_in(note: Any, until: threading.Event) -> None:
    """`wait` for `until`, saying what it waits for in `note` (an `st.empty`), then empty it."""
    wait(show=lambda text: note.info(text, icon=":material/hourglass_top:"), until=until)
    note.empty()


def page_sent() -> None:
    """A visitor's run ended (app.py): after the first one, the warm-up imports torch once the
    browser has had `SETTLE_S` to draw the page."""
    if _started and not _go.is_set() and _visitor.is_set():
        threading.Timer(SETTLE_S, _go.set).start()


def wait_visibly() -> None:
    """`wait` for the page modules (`PAGE_MODULES`, not torch), with its message on the page (an
    info box under the title; the page replaces it when ready). A visitor's run calls it; nothing
    is drawn when nothing is to wait for.
    Where a warm-up was started, every run keeps the (empty) slot: had only the runs that waited
    drawn it, the next run's page would sit one element higher, and Streamlit would mount every
    widget again, dropping a file the visitor was uploading into it (a second uploader's file
    was lost that way on a cold server)."""
    if not _started:
        return
    import streamlit as st

    note = st.empty()
    if _pages.is_set():
        return
    _wait_in(note, _pages)


PREFETCHED = "_vitpe_prefetched"   # session_state: this browser session was sent the prefetch
CHARTING_WAIT_S = 5.0


def prefetch_frontend() -> Any:
    """The slot (`st.empty`) of a hidden Plotly chart drawn in a session's first run, right under
    the title; app.py empties it after the page. Streamlit's browser code loads each kind of
    element's JavaScript when the first such element arrives: Plotly's is 4.7 MB (about a second
    to parse and compile on 2 cores). Sent here, the browser loads it while the server still warms
    up or computes the page, instead of after the page's first chart arrives: on a cold start the
    charts were drawn 2 s after the script run ended, with this 0.4 s (BENCHMARKS.md section 4).
    (The first page has no code block: the share link's is in a popover, drawn when opened.)
    Waits (at most `CHARTING_WAIT_S`) until the warm-up has imported Plotly (`CHARTING`), so that
    no two threads import it at once. Only where a warm-up was started (a server; not AppTest);
    None elsewhere."""
    if not _started:
        return None
    import streamlit as st

    slot = st.empty()                  # on every run, so that the page below never moves up a slot
    if st.session_state.get(PREFETCHED) or not _charting.wait(CHARTING_WAIT_S):
        _visitor.set()
        return slot
    st.session_state[PREFETCHED] = True
    import plotly.graph_objects as go

    with slot.container(key="vitpe_prefetch"):
        st.html("<style>.st-key-vitpe_prefetch { position: absolute; left: -10000px; width: 320px; height: 1px; "
                "overflow: hidden; }</style>")
        st.plotly_chart(go.Figure(go.Scatter(x=[0], y=[0])), height=100, key="vitpe_prefetch_chart",
                        config={"staticPlot": True})
    _visitor.set()                     # the warm-up goes on with torch (`_run`)
    return slot


@contextlib.asynccontextmanager
async def lifespan(_app: Any) -> AsyncIterator[None]:
    """The `st.App` lifespan: start the warm-up, serve."""
    start()
    yield
