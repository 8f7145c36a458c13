"""vitpe_core.turns: one run at a time holds a big model's turn, given back when the run ends."""
from __future__ import annotations

import threading
import time

import pytest

from vitpe_core.turns import Turns


def test_a_second_run_waits_until_the_first_run_ends():
    turns, order, waiting = Turns(slots=1, wait_s=60), [], []
    first_in, release_first, second_waits = threading.Event(), threading.Event(), threading.Event()

    def first():
        with turns.scope():
            assert turns.take("model A")
            order.append("first took")
            first_in.set()
            release_first.wait(30)
            order.append("first ends")

    def second():
        first_in.wait(30)
        with turns.scope():
            assert turns.take("model B", on_wait=lambda: _Recorder(waiting, second_waits))
            order.append("second took")

    a, b = threading.Thread(target=first), threading.Thread(target=second)
    a.start(), b.start()
    assert second_waits.wait(30)            # b found the turn taken and waits in its spinner
    assert order == ["first took"]
    release_first.set()
    a.join(30), b.join(30)
    assert order == ["first took", "first ends", "second took"] and waiting == ["entered", "left"]
    assert turns.taken == 2 and turns.waited == 1 and turns.timeouts == 0


def test_a_run_takes_one_turn_however_often_it_asks_and_gives_it_back_on_an_error():
    turns = Turns(slots=1, wait_s=0.05)
    with pytest.raises(RuntimeError), turns.scope():
        assert turns.take("m") and turns.take("another model") and turns.holds()
        with turns.scope():                 # a nested scope does not give it back
            pass
        assert turns.holds()
        raise RuntimeError("the page failed")
    assert not turns.holds()
    with turns.scope():                     # the turn came back: no wait
        assert turns.take("another model")
    assert turns.taken == 2 and turns.waited == 0


def test_outside_a_run_nothing_is_taken():
    turns = Turns(slots=1)
    assert not turns.take("m") and not turns.holds() and turns.taken == 0


def test_a_run_that_waits_too_long_goes_on_without_a_turn():
    turns, held, done = Turns(slots=1, wait_s=0.2), threading.Event(), threading.Event()

    def holder():
        with turns.scope():
            turns.take("model A")
            held.set()
            done.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(30)
    waits = []
    with turns.scope():
        assert not turns.take("model B", "late", on_wait=lambda: _Recorder(waits))
        assert not turns.holds()
        assert not turns.take("model B", "later in the same run")      # no second wait in one run
    done.set()
    t.join(30)
    assert waits == ["entered", "left"] and turns.timeouts == 1


class _Recorder:
    """A stand-in for the page's spinner: records that the wait began and ended."""

    def __init__(self, log, entered: threading.Event | None = None):
        self.log, self.entered = log, entered

    def __enter__(self):
        self.log.append("entered")
        if self.entered is not None:
            self.entered.set()

    def __exit__(self, *exc):
        self.log.append("left")


def _hold(turns, key, entered: threading.Event, release: threading.Event, log: list | None = None):
    with turns.scope():
        turns.take(key)
        if log is not None:
            log.append(key)
        entered.set()
        release.wait(30)


def test_runs_on_the_model_in_use_share_its_turn():
    """Visitors of one shared link do not queue behind each other: a second run on the model in use
    joins its turn at once, and another model waits until both have ended."""
    turns = Turns(slots=1, wait_s=60)
    events = [(threading.Event(), threading.Event()) for _ in range(2)]
    threads = [threading.Thread(target=_hold, args=(turns, "model A", e, r)) for e, r in events]
    for t in threads:
        t.start()
    assert all(e.wait(30) for e, _ in events)            # both in, neither waited
    assert turns.in_use() == {"model A": 2} and turns.waited == 0
    b_in, b_release, order = threading.Event(), threading.Event(), []
    b = threading.Thread(target=_hold, args=(turns, "model B", b_in, b_release, order))
    b.start()
    assert not b_in.wait(0.3)                            # B waits for both runs on A
    events[0][1].set()
    threads[0].join(30)
    assert not b_in.wait(0.3) and turns.in_use() == {"model A": 1}
    events[1][1].set()
    assert b_in.wait(30) and turns.in_use() == {"model B": 1}
    b_release.set()
    for t in (*threads, b):
        t.join(30)
    assert turns.in_use() == {} and turns.taken == 3 and turns.waited == 1


def test_a_waiting_model_is_not_starved_by_new_runs_on_the_busy_one():
    """First come, first served: once a run waits for model B, a new run on the model in use (A)
    waits behind it instead of joining A's turn and keeping B out for good."""
    turns = Turns(slots=1, wait_s=60)
    a_in, a_release = threading.Event(), threading.Event()
    b_in, b_release = threading.Event(), threading.Event()
    a2_in, a2_release = threading.Event(), threading.Event()
    order: list = []
    a = threading.Thread(target=_hold, args=(turns, "model A", a_in, a_release, order))
    a.start()
    assert a_in.wait(30)
    b = threading.Thread(target=_hold, args=(turns, "model B", b_in, b_release, order))
    b.start()
    deadline = time.monotonic() + 30
    while not turns._queue and time.monotonic() < deadline:   # B is in line
        time.sleep(0.01)
    a2 = threading.Thread(target=_hold, args=(turns, "model A", a2_in, a2_release, order))
    a2.start()
    assert not a2_in.wait(0.3)                           # behind B, although A is in use
    a_release.set()
    assert b_in.wait(30) and not a2_in.wait(0.3)
    b_release.set()
    assert a2_in.wait(30)
    a2_release.set()
    for t in (a, b, a2):
        t.join(30)
    assert order == ["model A", "model B", "model A"]
