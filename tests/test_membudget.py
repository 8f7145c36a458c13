"""vitpe_core.membudget: one byte budget, named pools, one least-recently-used order."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from vitpe_core import membudget
from vitpe_core.membudget import Budget, estimate_bytes


def test_pools_share_one_budget_and_the_least_recently_used_of_any_pool_goes_first(caplog):
    caplog.set_level(logging.INFO, logger="vitpe_core.membudget")
    b = Budget(100)
    traces, models = b.pool("traces"), b.pool("models")
    assert traces.put("t1", "T1", 30) == [] and models.put("m1", "M1", 40) == []
    assert traces.put("t2", "T2", 20) == [] and b.total == 90
    assert traces.get("t1") == "T1"                      # order now: m1, t2, t1
    assert traces.put("t3", "T3", 25) == []              # the models pool's m1 (the oldest) made room
    assert "m1" not in models and "t1" in traces and "t2" in traces and b.total == 75
    assert b.sizes()["models"] == {"entries": 0, "bytes": 0, "evictions": 1}
    assert "evicted models m1" in caplog.text
    assert models.put("m2", "M2", 60) == []              # t2 then t1 went from the traces pool
    assert list(traces.keys()) == ["t3"] and b.total == 85 and b.sizes()["traces"]["evictions"] == 2
    assert sum(p["bytes"] for p in b.sizes().values()) == b.total


def test_eviction_order_is_by_last_use_across_pools():
    b = Budget(10)
    a, c = b.pool("a"), b.pool("c")
    a.put(1, "a1", 3)
    c.put(1, "c1", 3)
    a.put(2, "a2", 3)
    a.get(1)                                             # order now: c1, a2, a1
    assert c.put(2, "c2", 3) == [1]                      # c's own c1 was the oldest
    assert a.put(3, "a3", 4) == [2]                      # then a2 (the oldest left) goes
    assert 1 in a and 2 in c and 3 in a and b.total == 10


def test_a_pool_can_cap_its_entries_and_a_refresh_never_double_counts():
    b = Budget(1000)
    p = b.pool("p", max_items=2)
    p.put("x", 1, 10)
    p.put("y", 2, 10)
    assert p.put("z", 3, 10) == ["x"] and len(p) == 2
    assert p.put("z", 4, 50) == [] and p.bytes == 60 and b.total == 60 and p.get("z") == 4


def test_an_entry_larger_than_the_budget_is_refused_and_evicts_nothing():
    b = Budget(100)
    p = b.pool("p")
    p.put("a", 1, 60)
    with pytest.raises(ValueError, match="at most 0 MiB"):
        p.put("huge", 2, 101)
    assert "a" in p and b.total == 60


def test_resize_and_clear():
    b = Budget(100)
    p = b.pool("p")
    for i in range(5):
        p.put(i, i, 20)
    assert b.resize(50) == [("p", 0), ("p", 1), ("p", 2)] and b.total == 40
    b.clear()
    assert b.total == 0 and len(p) == 0


def test_estimate_bytes_counts_data_once():
    a = np.zeros((100, 100), np.float32)
    assert 40_000 <= estimate_bytes(a) < 41_000
    assert estimate_bytes([a, a, a[:10]]) < 41_000          # the same buffer and its view: once
    t = torch.zeros(1000, dtype=torch.float64)
    assert 8000 <= estimate_bytes({"t": t, "v": t[:5]}) < 9000
    m = torch.nn.Linear(100, 100)
    assert 40_400 <= estimate_bytes(m) < 42_000

    @dataclass
    class Box:
        x: np.ndarray
        y: dict

    assert estimate_bytes(Box(a, {"b": np.zeros(1000, np.float16)})) > 42_000
    from PIL import Image
    assert estimate_bytes(Image.new("RGB", (100, 50))) >= 15_000
    import plotly.graph_objects as go
    fig = go.Figure(go.Heatmap(z=np.zeros((200, 200))))
    assert estimate_bytes(fig) > 200 * 200 * 8 * 0.9
    assert estimate_bytes(b"x" * 5000) >= 5000


def test_memoize_keys_by_value_leaves_out_underscore_arguments_and_sizes_by_bytes():
    b = Budget(12_000)
    calls = []

    @b.pool("arrays").memoize
    def make(n: int, tag: str, _note=None):
        calls.append(n)
        return np.zeros(n, np.uint8)

    x = make(1000, "a", _note=object())
    assert make(1000, "a", _note=object()) is x and calls == [1000]   # `_note` is not in the key
    assert not x.flags.writeable                                      # shared, so read-only
    make(5000, "b")
    make(6000, "c")                                                   # 1000 + 5000 + 6000 (+ headers) > 12 000
    assert calls == [1000, 5000, 6000] and not make.is_cached(1000, "a")
    assert make.is_cached(5000, "b") and make.is_cached(6000, "c")
    assert b.sizes()["arrays"]["evictions"] == 1
    make(20_000, "too big")                                           # returned, not kept
    assert not make.is_cached(20_000, "too big") and b.total <= 12_000


def test_memoize_keys_bytes_and_arrays_by_content():
    b = Budget(10**6)
    calls = []

    @b.pool("p").memoize
    def f(data: bytes, arr: np.ndarray, d: dict):
        calls.append(1)
        return len(data)

    f(b"z" * 1000, np.arange(4), {"k": [1, 2]})
    f(bytes(b"z" * 1000), np.arange(4).copy(), {"k": [1, 2]})
    assert len(calls) == 1
    f(b"z" * 1000, np.arange(5), {"k": [1, 2]})
    assert len(calls) == 2
    assert all(len(repr(k)) < 300 for k in b.pool("p").keys())        # no key holds the data itself


def test_concurrent_callers_compute_once():
    b = Budget(10**6)
    calls, gate = [], threading.Event()

    @b.pool("p").memoize
    def slow(n):
        calls.append(n)
        gate.wait(2)
        return n

    threads = [threading.Thread(target=slow, args=(7,)) for _ in range(4)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join()
    assert calls == [7]


def test_the_process_budget_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(membudget.ENV_VAR, "123")
    assert membudget.budget_bytes() == 123 * 2**20
    monkeypatch.delenv(membudget.ENV_VAR)
    assert membudget.budget_bytes() == membudget.DEFAULT_CACHE_MB * 2**20
    for bad in ("lots", "0", "-5"):
        monkeypatch.setenv(membudget.ENV_VAR, bad)
        with pytest.raises(ValueError, match=membudget.ENV_VAR):
            membudget.budget_bytes()
    monkeypatch.delenv(membudget.ENV_VAR)
    assert membudget.shared() is membudget.shared()


def test_make_room_evicts_the_least_recently_used_before_a_big_allocation():
    b = Budget(100)
    p = b.pool("p")
    for i in range(4):
        p.put(i, i, 25)
    p.get(0)
    assert b.make_room(40, "an import") == [("p", 1), ("p", 2)] and b.total == 50
    assert b.make_room(500) == [("p", 3), ("p", 0)] and b.total == 0


def test_a_reservation_keeps_its_room_while_others_put_entries():
    """An import's model while it is built (pages/common/model_import.py): the room `reserve`
    makes stays counted, so entries put meanwhile evict each other instead of filling it; after
    the block the room is the budget's again."""
    b = Budget(100)
    p = b.pool("p")
    for i in range(4):
        p.put(i, i, 25)
    with b.reserve(70, "an import"):
        assert b.total == 25 and b.reserved == 70 and p.keys() == [3]
        p.put(4, 4, 10)                                    # 25 + 10 + 70 > 100: 3 goes
        assert p.keys() == [4] and b.total == 10
        p.put(5, 5, 5)                                     # fits beside the room
        assert p.keys() == [4, 5]
        with pytest.raises(RuntimeError):
            with b.reserve(10):
                raise RuntimeError("a failed build")
        assert b.reserved == 70                            # given back even when the block fails
    assert b.reserved == 0
    for i in range(6, 12):
        p.put(i, i, 10)
    assert b.total == 75 and len(p) == 8


def test_a_smaller_limit_counts_the_room_a_reservation_holds():
    """`resize` during a reservation (the operators' panel while an import builds): the entries
    are evicted down to the limit less the reserved room, not to the limit."""
    b = Budget(100)
    p = b.pool("p")
    with b.reserve(40):
        for i in range(6):
            p.put(i, i, 10)
        assert b.total == 60
        assert b.resize(80) == [("p", 0), ("p", 1)] and b.total == 40


def test_no_entry_is_put_between_making_a_reservations_room_and_counting_it():
    """`reserve` makes its room and counts it under one lock: an entry put by another session
    right after the room is made (here from `_collect`, which runs once the lock is let go) must
    find the room taken, not fill it (then the reservation would pass the limit)."""
    class Meddling(Budget):
        late = False

        def _collect(self) -> None:
            if self.late:
                self.late = False
                self.pool("p").put("late", 0, 30)

    b = Meddling(100)
    p = b.pool("p")
    for i in range(4):
        p.put(i, i, 25)
    b.late = True
    with b.reserve(60):
        assert b.total + b.reserved <= b.max_bytes and "late" in p


def test_an_evicted_entry_held_by_a_reference_cycle_is_freed_at_once():
    """Issue 30's memory walk: an evicted ViT-B stayed in memory beside the model imported in its
    place, reachable from a reference cycle a page run had left, until Python's next full
    collection. Once `COLLECT_AFTER` bytes were evicted, the budget collects them itself."""
    import gc
    import weakref

    class Entry:
        pass

    b = membudget.Budget(3 * membudget.COLLECT_AFTER)
    pool = b.pool("models")
    big = Entry()
    big.cycle = big                     # garbage only a full collection frees
    gone = weakref.ref(big)
    pool.put("a", big, 2 * membudget.COLLECT_AFTER)
    del big
    gc.disable()                        # no automatic collection may free it instead
    try:
        pool.put("b", Entry(), 2 * membudget.COLLECT_AFTER)      # evicts "a"
        assert gone() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("name", ["torch", "numpy", "PIL.Image", "plotly.graph_objects"])
def test_sizing_skips_a_module_another_thread_is_still_importing(monkeypatch, name):
    """The app's warm-up imports torch while visitors' runs size their cache entries: until the
    import is over `sys.modules` holds a half-made torch (a fresh-clone CI run met "partially
    initialized module 'torch' has no attribute 'Tensor'" on the bias page). Sizing leaves such a
    module alone (no object of its types can exist yet)."""
    import importlib.machinery
    import sys
    import types

    half = types.ModuleType(name)
    half.__spec__ = importlib.machinery.ModuleSpec(name, None)
    half.__spec__._initializing = True
    monkeypatch.setitem(sys.modules, name, half)
    assert membudget.estimate_bytes({"a": b"x" * 1000, "b": [1, 2]}) >= 1000
