"""vitpe_core.turns: one run at a time holds a big model's turn, given back when the run ends."""
from __future__ import annotations

import contextlib
import threading

import pytest

from vitpe_core.turns import Turns


@contextlib.contextmanager
def another_run_holding_the_turn(turns: Turns):
    """Another visitor's run (a thread) holding `turns`' turn until the block ends."""
    held, done = threading.Event(), threading.Event()

    def run():
        with turns.scope():
            turns.take()
            held.set()
            done.wait(60)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert held.wait(30)
        yield
    finally:
        done.set()
        t.join(30)


def test_a_second_run_waits_until_the_first_run_ends():
    turns, order, waiting = Turns(slots=1, wait_s=60), [], []
    first_in, release_first, second_waits = threading.Event(), threading.Event(), threading.Event()

    def first():
        with turns.scope():
            assert turns.take("a")
            order.append("first took")
            first_in.set()
            release_first.wait(30)
            order.append("first ends")

    def second():
        first_in.wait(30)
        with turns.scope():
            assert turns.take("b", on_wait=lambda: _Recorder(waiting, second_waits))
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
        assert turns.take() and turns.take() and turns.holds()
        with turns.scope():                 # a nested scope does not give it back
            pass
        assert turns.holds()
        raise RuntimeError("the page failed")
    assert not turns.holds()
    with turns.scope():                     # the turn came back: no wait
        assert turns.take()
    assert turns.taken == 2 and turns.waited == 0


def test_outside_a_run_nothing_is_taken():
    turns = Turns(slots=1)
    assert not turns.take() and not turns.holds() and turns.taken == 0


def test_a_run_that_waits_too_long_goes_on_without_a_turn():
    turns, waits = Turns(slots=1, wait_s=0.2), []
    with another_run_holding_the_turn(turns), turns.scope():
        assert not turns.take("late", on_wait=lambda: _Recorder(waits))
        assert not turns.holds()
        assert not turns.take("later in the same run")      # no second wait in one run
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
