"""Import the app's heavy modules once at server start, before the first visitor arrives.

On a cold start the first script run used to import pandas, torch, Plotly and vitpe_core
itself (about 2 s of its 5) after the browser had connected, while the server sat idle for the
second or so the browser spends loading Streamlit's JavaScript. `streamlit run app.py` finds
the `st.App` in app.py (made only when the file is imported as a module, not in a visitor's
run), whose lifespan calls `start`: one daemon thread does those imports. A visitor's first run
calls `wait` before its own imports, so the two never import the same modules at once (a
half-imported module seen from another thread broke Plotly once; RELIABILITY.md).

Where nothing calls `start` (AppTest; `VITPE_WARMUP=0` turns it off), `wait` returns at once.
Nothing heavy imported here: app.py imports this module on every run. The server log says how
long the imports took ("warm-up imports took 2.1 s").
"""
from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from typing import Any, AsyncIterator

from streamlit.logger import get_logger   # the server's log format and level

log = get_logger(__name__)

# In the order a page's first run imports them (app.py, then the pages through pages.common).
MODULES = ("pandas", "torch", "plotly.graph_objects", "vitpe_core.model", "vitpe_core.analysis",
           "vitpe_core.figures", "vitpe_core.views", "vitpe_core.positional", "vitpe_core.stress",
           "pages.common.cache", "pages.common.ui", "pages.common.status", "pages.common.position",
           "pages.common.stress", "pages.common.film")
WAIT_S = 120.0                  # a visitor waits at most this long; the imports then run in its own script

_done = threading.Event()
_started = False
_lock = threading.Lock()
seconds: float | None = None    # how long the imports took (None until done)


def _run() -> None:
    global seconds
    t0 = time.perf_counter()
    try:
        for name in MODULES:
            importlib.import_module(name)
        _first_forward()
    except Exception:  # noqa: BLE001 — the visitor's own import then reports it where it can be seen
        log.exception("warm-up import failed; the first page run imports it instead")
    finally:
        seconds = time.perf_counter() - t0
        log.info("warm-up imports took %.2f s", seconds)
        _done.set()


def _first_forward() -> None:
    """One forward pass of a tiny SaPE² + APE model: torch's first call of each operator (and
    the C++ SaPE² kernel's loading) happen here instead of in the first visitor's trace."""
    import torch

    from vitpe_core.config import preset_config
    from vitpe_core.model import ViT

    with torch.no_grad():
        ViT(preset_config("tiny", encoding="sape2+ape")).eval()(torch.zeros(1, 3, 32, 32))


def start() -> None:
    """Start the warm-up imports in a daemon thread (once per process; not with `VITPE_WARMUP=0`)."""
    global _started
    with _lock:
        if _started or os.environ.get("VITPE_WARMUP", "").strip() == "0":
            return
        _started = True
    threading.Thread(target=_run, name="vitpe-warmup", daemon=True).start()


def wait(timeout: float = WAIT_S) -> None:
    """Block until the warm-up imports are done (at once if none were started)."""
    if _started:
        _done.wait(timeout)


@contextlib.asynccontextmanager
async def lifespan(_app: Any) -> AsyncIterator[None]:
    """The `st.App` lifespan: start the warm-up, serve."""
    start()
    yield
