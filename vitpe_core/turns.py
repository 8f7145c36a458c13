"""Big models take turns: the runs of a process (threads: Streamlit runs each session's script in
its own) use at most `slots` big models at once; any number of runs share the model in use.

The memory budget (`vitpe_core.membudget`) counts a model while it is an entry. A run that is
using a model keeps it alive after the budget evicted it, so visitors each clicking their own
ViT-B/16 held several at once outside the budget, and the budget, which holds one, evicted and
reloaded them in turn (issue 47: a replica's resident memory swung between 700 and 1,200 MiB as
five such models went through it). A run takes a turn for its model (`Turns.take(key)`) before it
loads or uses it and gives it back when the run ends (`Turns.scope`, around the whole run). Runs on
the model in use join its turn (visitors of one shared link never queue behind each other); a run
on another model waits until every run on that one has ended, and runs that come after it wait
behind it (first come, first served: a busy model does not starve the others). Smaller models
never take a turn, and outside a scope (a notebook, a test calling a page function) nothing is
taken. No Streamlit: plain threads, tested on their own (tests/test_turns.py).
"""
from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from typing import Callable, ContextManager, Hashable, Iterator

log = logging.getLogger(__name__)


class Turns:
    """Turns by key (a model's id): at most `slots` keys in use at once, each by any number of runs
    (a thread inside `scope`), taken at most once per run and given back when the run's scope ends.
    Waiting runs are served in the order they came. A run that waits longer than `wait_s` goes on
    without a turn (logged): a stuck run never stops the others for good."""

    def __init__(self, slots: int = 1, wait_s: float = 300.0) -> None:
        if slots < 1:
            raise ValueError("turns need at least one slot")
        self.slots, self.wait_s = slots, wait_s
        self._cond = threading.Condition()
        self._users: dict[Hashable, int] = {}                 # key in use -> runs using it
        self._queue: collections.deque[object] = collections.deque()   # waiting runs' tickets, oldest first
        self._local = threading.local()
        self.taken = self.waited = self.timeouts = 0          # for the status panel and the tests

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
                key, self._local.key = getattr(self._local, "key", None), None
                if key is not None:
                    with self._cond:
                        self._users[key] -= 1
                        if not self._users[key]:
                            del self._users[key]
                        self._cond.notify_all()

    def holds(self) -> bool:
        """Whether this thread's run holds a turn."""
        return getattr(self._local, "key", None) is not None

    def in_use(self) -> dict[Hashable, int]:
        """Key -> runs using it now."""
        with self._cond:
            return dict(self._users)

    def _enter(self, key: Hashable) -> None:            # lock held
        self._users[key] = self._users.get(key, 0) + 1
        self.taken += 1
        self._local.key = key

    def _open_to(self, key: Hashable) -> bool:          # lock held
        return key in self._users or len(self._users) < self.slots

    def take(self, key: Hashable, why: str = "", on_wait: Callable[[], ContextManager] | None = None) -> bool:
        """This run's turn for `key` (once per run: a run holding a turn keeps it for every model it
        uses; nothing outside a scope: no end to give it back at). When `key` cannot be used now,
        waits inside `on_wait()` (a spinner), at most once per run; True when this run holds a turn."""
        if not getattr(self._local, "depth", 0):
            return False
        if self.holds():
            return True
        if getattr(self._local, "skipped", False):      # this run waited its limit once: no second wait
            return False
        with self._cond:
            if not self._queue and self._open_to(key):
                self._enter(key)
                return True
        ticket, t0 = object(), time.monotonic()
        with (on_wait() if on_wait is not None else contextlib.nullcontext()), self._cond:
            self._queue.append(ticket)
            got = self._cond.wait_for(lambda: self._queue[0] is ticket and self._open_to(key), timeout=self.wait_s)
            self._queue.remove(ticket)
            if got:
                self._enter(key)
            self.waited += 1
            self.timeouts += not got
            self._cond.notify_all()                    # the next in line may use the same key
        if not got:
            self._local.skipped = True
            log.warning("turns: no turn for %s after %.0f s; going on without one", why or key,
                        time.monotonic() - t0)
            return False
        log.info("turns: %s waited %.1f s for its turn", why or key, time.monotonic() - t0)
        return True
