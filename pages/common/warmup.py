"""Do the first visitor's slow work once at server start, before anyone arrives.

On a cold start the first script run used to import pandas, torch, Plotly and vitpe_core
(about 2 s of its 5), then load the default checkpoint and trace the default image, all after
the browser had connected, while the server had sat idle for the second or so the browser
spends loading Streamlit's JavaScript. `streamlit run app.py` finds the `st.App` in app.py
(made only when the file is imported as a module, not in a visitor's run), whose lifespan
calls `start`: one daemon thread does those imports, one forward pass of a tiny model, and
puts the default view's checkpoint and trace in the app's caches (`pages.common.cache`). A
visitor's first run calls `wait` before its own imports, so the two never import the same
modules at once (a half-imported module seen from another thread broke Plotly once;
RELIABILITY.md).

Where nothing calls `start` (AppTest; `VITPE_WARMUP=0` turns it off), `wait` returns at once.
Nothing heavy is imported here: app.py imports this module on every run. The server log says
how long it took ("warm-up done in 2.9 s").
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
import time
from typing import Any, AsyncIterator

from streamlit.logger import get_logger   # the server's log format and level

log = get_logger(__name__)

# In the order a page's first run imports them (app.py, then the pages through pages.common). Kept by hand;
# tests/test_app.py checks that it covers every module the pages import at module level.
MODULES = ("pandas", "torch", "plotly.graph_objects", "vitpe_core.model", "vitpe_core.analysis",
           "vitpe_core.figures", "vitpe_core.figures.picker", "vitpe_core.views", "vitpe_core.positional",
           "vitpe_core.stress",
           "pages.common.cache", "pages.common.messages", "pages.common.viewsync", "pages.common.status",
           "pages.common.widgets", "pages.common.explain", "pages.common.loading", "pages.common.output",
           "pages.common.picker", "pages.common.uploads", "pages.common.import_form",
           "pages.common.position_panel", "pages.common.stress_panel", "pages.common.film")
THREAD = "vitpe-warmup"
WAIT_S = 120.0                  # a visitor waits at most this long; the imports then run in its own script

_done = threading.Event()
_started = False
_lock = threading.Lock()
seconds: float | None = None    # how long the warm-up took (None until done)


def _run() -> None:
    global seconds
    t0 = time.perf_counter()
    try:
        for name in MODULES:
            importlib.import_module(name)
        _first_forward()
        _default_view()
    except Exception:  # noqa: BLE001 — the visitor's own run then meets it where the page shows it
        log.exception("warm-up failed; the first page run does that work instead")
    finally:
        seconds = time.perf_counter() - t0
        log.info("warm-up done in %.2f s (imports, a first forward pass, the default view's checkpoint and trace)",
                 seconds)
        _done.set()


def _first_forward() -> None:
    """One forward pass of a tiny SaPE² + APE model: torch's first call of each operator (and
    the C++ SaPE² kernel's loading) happen here instead of in the first visitor's trace."""
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


def _default_view() -> None:
    """The default view's checkpoint and the trace of its image into the app's caches (what the
    first visitor's bias page asks for first)."""
    from pages.common import cache
    from vitpe_core.checkpoint import listed_checkpoints
    from vitpe_core.gallery import gallery_ids
    from vitpe_core.viewstate import default_view

    view = default_view(checkpoints=listed_checkpoints(cache.checkpoint_root()), images=gallery_ids())
    if view.ckpt:
        cache.trace(view.ckpt, view.image)


def start() -> None:
    """Start the warm-up in a daemon thread (once per process; not with `VITPE_WARMUP=0`)."""
    global _started
    with _lock:
        if _started or os.environ.get("VITPE_WARMUP", "").strip() == "0":
            return
        _started = True
    get_logger("streamlit.runtime.scriptrunner_utils.script_run_context").addFilter(_NotFromWarmup())
    threading.Thread(target=_run, name=THREAD, daemon=True).start()


def wait(timeout: float = WAIT_S) -> None:
    """Block until the warm-up is done (at once if none was started)."""
    if _started:
        _done.wait(timeout)


@contextlib.asynccontextmanager
async def lifespan(_app: Any) -> AsyncIterator[None]:
    """The `st.App` lifespan: start the warm-up, serve."""
    start()
    yield
