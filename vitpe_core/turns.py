"""Big models take turns: at most `slots` runs of a process (threads: Streamlit runs each session's
script in its own) hold a big model at once.

The memory budget (`vitpe_core.membudget`) counts a model while it is an entry. A run that is
using a model keeps it alive after the budget evicted it, so visitors each clicking their own
ViT-B/16 held several at once outside the budget, and the budget, which holds one, evicted and
reloaded them in turn (issue 47: a replica's resident memory swung between 700 and 1,200 MiB as
five such models went through it). A run takes a turn (`Turns.take`) before it loads or uses a big
model and gives it back when the run ends (`Turns.scope`, around the whole run); smaller models
never wait, and outside a scope (a notebook, a test calling a page function) nothing is taken.
No Streamlit: plain threads, tested on their own (tests/test_turns.py).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable, ContextManager, Iterator

log = logging.getLogger(__name__)


class Turns:
    """A semaphore of `slots` turns, taken at most once per run (a thread inside `scope`) and given
    back when the run's scope ends. A run that waits longer than `wait_s` goes on without a turn
    (logged): a stuck run never stops the others for good."""

    def __init__(self, slots: int = 1, wait_s: float = 300.0) -> None:
        if slots < 1:
            raise ValueError("turns need at least one slot")
        self.slots, self.wait_s = slots, wait_s
        self._sem = threading.BoundedSemaphore(slots)
        self._local = threading.local()
        self._count = threading.Lock()
        self.taken = self.waited = self.timeouts = 0     # for the status panel and the tests

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """One run: a turn taken inside it is given back when the outermost scope of this thread ends
        (also when the run stops early: a rerun, a page switch, an error)."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                self._local.skipped = False
                if getattr(self._local, "held", False):
                    self._local.held = False
                    self._sem.release()

    def holds(self) -> bool:
        """Whether this thread's run holds a turn."""
        return bool(getattr(self._local, "held", False))

    def take(self, why: str = "", on_wait: Callable[[], ContextManager] | None = None) -> bool:
        """This run's turn (once per run; nothing outside a scope: no end to give it back at). When every
        turn is held, waits inside `on_wait()` (a spinner) for one, at most once per run; True when this
        run holds a turn."""
        if not getattr(self._local, "depth", 0):
            return False
        if self.holds():
            return True
        if getattr(self._local, "skipped", False):      # this run waited its limit once: no second wait
            return False
        if not self._sem.acquire(blocking=False):
            t0 = time.monotonic()
            with (on_wait() if on_wait is not None else contextlib.nullcontext()):
                got = self._sem.acquire(timeout=self.wait_s)
            with self._count:
                self.waited += 1
                self.timeouts += not got
            if not got:
                self._local.skipped = True
                log.warning("turns: no turn for %s after %.0f s; going on without one", why or "a big model",
                            time.monotonic() - t0)
                return False
            log.info("turns: %s waited %.1f s for its turn", why or "a big model", time.monotonic() - t0)
        with self._count:
            self.taken += 1
        self._local.held = True
        return True
