"""One memory budget for the whole process: every cache and store of the app counts its entries
in bytes against it, and the least recently used entry of any of them goes first.

A `Budget` holds named `Pool`s (the checkpoint cache, the imported-model store, the trace cache,
figure and array caches, ...): each pool is a `key -> (value, nbytes)` map, and all pools share
one least-recently-used order and one byte limit. Putting an entry evicts the least recently
used entries of *any* pool until the total fits; a pool may also cap its own entry count
(`max_items`). Reading an entry (`get`) makes it the most recent. Every eviction is logged
(`vitpe_core.membudget`, INFO) and counted per pool (`Budget.sizes`, the app's "Server status").

`estimate_bytes` sizes what the caches hold: tensors, numpy arrays, modules (parameters and
buffers), PIL images, Plotly figures, bytes, and containers / dataclasses of them (each
storage counted once). `Pool.memoize` turns a function into a cache of its results in the pool,
keyed by its arguments by value (arguments whose names start with `_` are left out of the key,
as in Streamlit's caches); a result larger than the whole budget is returned uncached.

The process's budget (`shared()`) is `$VITPE_CACHE_MB` MiB, default `DEFAULT_CACHE_MB`. No
Streamlit here: the app's caches (pages/common/cache.py) and the model store (store.py) use it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import inspect
import logging
import os
import sys
import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterator

log = logging.getLogger(__name__)

ENV_VAR = "VITPE_CACHE_MB"
# The default keeps the whole server under 900 MiB (issue 30's target, a 1 GiB host's margin)
# with the 14 shipped checkpoints and visitors' imported ViT-B/16 (86.6 M parameters: 165 MiB
# held as a float16 file has them, `held_precision`; 330 MiB from a float32 file, which fits it,
# alone, through a hub id):
#    900 MiB  the target
# −  440 MiB  the warm server before any cache: Python, torch, Streamlit, Plotly, pandas and
#             vitpe_core imported, the warm-up's first forward pass (measured)
# −  ~80 MiB  a page run's transient arrays (VmHWM over VmRSS in the walk below)
# ≈  380 MiB  for every cache and store together, an upload in flight included (a big upload
#             makes room for its bytes before they arrive: pages/common/upload_room.py): the
#             shipped checkpoints (51 MiB), one ViT-B/16 and its float16 traces (11–42 MiB each);
#             the next import evicts the least recently used. 360 leaves a margin.
# Measured (`python -m benchmarks.memory_walk --big --images 60 --shape b16 --limit-mb 0`, two
# ViT-B/16 imports, 60 images; RELIABILITY.md "Deploy"): peak 885 MiB at 360, 915 MiB at 400; since
# the attention statistics go one layer at a time (2026-12-05), 830–835 MiB at 360.
DEFAULT_CACHE_MB = 360


# ----------------------------------------------------------------------------- sizes
def estimate_bytes(obj: Any) -> int:
    """Approximate memory held by `obj`: tensor / array data (each storage once), a module's
    parameters and buffers, a PIL image's pixels, a Plotly figure's data, bytes and strings,
    and containers, dataclasses and plain objects of these (recursively)."""
    return _Sizer().size(obj)


def _imported(name: str) -> Any:
    """Module `name` if it is imported and initialized, else None. Another thread may be importing
    it right now (the app's warm-up imports torch while visitors' runs size their cache entries):
    `sys.modules` then holds it half made ("partially initialized module 'torch' has no attribute
    'Tensor'"), and no object of its types can exist yet."""
    module = sys.modules.get(name)
    return None if getattr(getattr(module, "__spec__", None), "_initializing", False) else module


class _Sizer:
    def __init__(self) -> None:
        self.seen: set[int] = set()

    def size(self, obj: Any) -> int:  # noqa: C901 — one branch per kind
        if obj is None or isinstance(obj, (bool, int, float, complex)):
            return 0
        if id(obj) in self.seen:
            return 0
        self.seen.add(id(obj))
        if isinstance(obj, (bytes, bytearray, memoryview, str)):
            return sys.getsizeof(obj)
        np = _imported("numpy")
        if np is not None and isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            if base is not obj and id(base) in self.seen:
                return 0
            self.seen.add(id(base))
            return int(base.nbytes) + 112
        torch = _imported("torch")
        if torch is not None:
            if isinstance(obj, torch.Tensor):
                storage = obj.untyped_storage()
                key = ("storage", storage.data_ptr())
                if key in self.seen:
                    return 0
                self.seen.add(key)
                return int(storage.nbytes()) + 200
            if isinstance(obj, torch.nn.Module):
                return sum(self.size(t) for t in (*obj.parameters(), *obj.buffers())) + 1000
        pil = _imported("PIL.Image")
        if pil is not None and isinstance(obj, pil.Image):
            return obj.width * obj.height * max(1, len(obj.getbands())) + 500
        go = _imported("plotly.graph_objects")
        if go is not None and isinstance(obj, go.Figure):
            return self.size(obj.to_plotly_json())
        if isinstance(obj, dict):
            return sys.getsizeof(obj) + sum(self.size(k) + self.size(v) for k, v in obj.items())
        if isinstance(obj, (list, tuple, set, frozenset)):
            return sys.getsizeof(obj) + sum(self.size(v) for v in obj)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return 64 + sum(self.size(getattr(obj, f.name, None)) for f in dataclasses.fields(obj))
        if hasattr(obj, "__dict__") and not isinstance(obj, type):
            return 64 + self.size(vars(obj))
        return sys.getsizeof(obj)


# ----------------------------------------------------------------------------- the budget
class Budget:
    """Named pools of `key -> (value, nbytes)` sharing one byte limit and one least recently
    used order. Thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError("a memory budget needs at least one byte")
        self.max_bytes = int(max_bytes)
        self._lru: OrderedDict[tuple[str, Hashable], tuple[Any, int]] = OrderedDict()
        self._pools: dict[str, Pool] = {}
        self._lock = threading.RLock()
        self.total = 0
        self.reserved = 0                # held by `reserve` blocks: counted against the limit, not an entry
        self._evicted_bytes = 0          # evicted since the last `_collect`

    def pool(self, name: str, *, max_items: int | None = None) -> "Pool":
        """The pool `name` (made on first use; `max_items` caps its entries, None: only bytes)."""
        with self._lock:
            p = self._pools.get(name)
            if p is None:
                p = self._pools[name] = Pool(self, name, max_items)
            elif max_items is not None:
                p.max_items = max_items
            return p

    def _put(self, pool: "Pool", key: Hashable, value: Any, nbytes: int) -> list[tuple[str, Hashable]]:
        if nbytes > self.max_bytes:
            raise ValueError(f"needs {nbytes / 2**20:.0f} MiB; this server keeps at most "
                             f"{self.max_bytes / 2**20:.0f} MiB in memory for all its caches ({ENV_VAR})")
        full = (pool.name, key)
        evicted = []
        with self._lock:
            self._drop(full)
            if pool.max_items is not None:
                while pool.count >= pool.max_items:
                    evicted.append(self._evict_oldest(pool.name))
            evicted += self._evict_for(nbytes)
            self._lru[full] = (value, nbytes)
            pool.count += 1
            pool.bytes += nbytes
            self.total += nbytes
            total = self.total
        for name, k in evicted:
            log.info("memory budget: evicted %s %s (least recently used) for %s %s (%.1f MiB)",
                     name, _short(k), pool.name, _short(key), nbytes / 2**20)
        self._collect()
        log.debug("memory budget: %s %s stored (%.1f MiB); %.1f of %.0f MiB held", pool.name, _short(key),
                  nbytes / 2**20, total / 2**20, self.max_bytes / 2**20)
        return evicted

    def _evict_for(self, nbytes: int) -> list[tuple[str, Hashable]]:
        """Evict the least recently used entries of any pool until `nbytes` more fit beside the
        entries and the reserved room (or nothing is left); what went. Lock held."""
        evicted = []
        while self._lru and self.total + self.reserved + nbytes > self.max_bytes:
            evicted.append(self._evict_oldest(None))
        return evicted

    def _evict_oldest(self, pool_name: str | None) -> tuple[str, Hashable]:
        """Remove the least recently used entry (of pool `pool_name`, or of any); lock held."""
        full = next((k for k in self._lru if k[0] == pool_name), None) if pool_name else next(iter(self._lru))
        self._evicted_bytes += self._lru[full][1]
        self._drop(full)
        self._pools[full[0]].evictions += 1
        return full

    def _collect(self) -> None:
        """Once `COLLECT_AFTER` bytes were evicted: a full garbage collection, then the freed pages
        back to the system. An evicted entry can still be reachable from reference cycles left by
        a page run (Streamlit's or ours) until Python's next full collection, which may not come
        for many runs: an evicted ViT-B stayed in memory beside the model imported in its place
        (issue 30's memory walk), its eviction counted but its 165 MiB not freed."""
        with self._lock:
            if self._evicted_bytes < COLLECT_AFTER:
                return
            self._evicted_bytes = 0
        gc.collect()
        release_freed_memory()

    def _drop(self, full: tuple[str, Hashable]) -> bool:
        item = self._lru.pop(full, None)
        if item is None:
            return False
        p = self._pools[full[0]]
        p.count -= 1
        p.bytes -= item[1]
        self.total -= item[1]
        return True

    def _get(self, full: tuple[str, Hashable]) -> tuple[bool, Any]:
        with self._lock:
            item = self._lru.get(full)
            if item is None:
                return False, None
            self._lru.move_to_end(full)
            return True, item[0]

    def make_room(self, nbytes: int, why: str = "") -> list[tuple[str, Hashable]]:
        """Evict least recently used entries until `nbytes` more would fit (or nothing is left),
        before a big allocation that is not an entry yet (an upload on its way); returns what went."""
        return self._make_room(nbytes, why)

    @contextlib.contextmanager
    def reserve(self, nbytes: int, why: str = "") -> Iterator[None]:
        """Room for `nbytes` that are not an entry yet (an import's model while it is built):
        made at once (`make_room`) and kept for the block, so the entries other sessions put
        meanwhile evict each other instead of growing back into it (issue 30's load test:
        50 sessions refilled the room during a 60 s import, and the build's peak came on top).
        The room is made and counted under one lock: no entry slips in between."""
        self._make_room(nbytes, why, reserve=nbytes)
        try:
            yield
        finally:
            with self._lock:
                self.reserved -= nbytes

    def _make_room(self, nbytes: int, why: str, reserve: int = 0) -> list[tuple[str, Hashable]]:
        """Evict for `nbytes` and count `reserve` of them as reserved, under one lock."""
        with self._lock:
            evicted = self._evict_for(nbytes)
            self.reserved += reserve
        for name, k in evicted:
            log.info("memory budget: evicted %s %s (least recently used) to make room for %s (%.1f MiB)",
                     name, _short(k), why or "a new entry", nbytes / 2**20)
        self._collect()
        return evicted

    def resize(self, max_bytes: int) -> list[tuple[str, Hashable]]:
        """Set the limit, evicting down to it (room reserved by `reserve` counts); returns what went."""
        if max_bytes < 1:
            raise ValueError("a memory budget needs at least one byte")
        with self._lock:
            self.max_bytes = int(max_bytes)
            return self._evict_for(0)

    def clear(self) -> None:
        with self._lock:
            for full in list(self._lru):
                self._drop(full)

    def sizes(self) -> dict[str, dict[str, int]]:
        """pool name -> {"entries", "bytes", "evictions"}, for the operators' status panel."""
        with self._lock:
            return {name: {"entries": p.count, "bytes": p.bytes, "evictions": p.evictions}
                    for name, p in sorted(self._pools.items())}


def _short(key: Hashable) -> str:
    text = str(key)
    return text if len(text) <= 60 else text[:57] + "..."


class Pool:
    """One named cache or store in a `Budget` (`Budget.pool`): `key -> value`, each entry sized
    in bytes against the budget shared with every other pool."""

    def __init__(self, budget: Budget, name: str, max_items: int | None) -> None:
        if max_items is not None and max_items < 1:
            raise ValueError("a pool needs room for at least one entry")
        self.budget, self.name, self.max_items = budget, name, max_items
        self.count = self.bytes = self.evictions = 0

    def put(self, key: Hashable, value: Any, nbytes: int | None = None) -> list[Hashable]:
        """Add (or replace) `key`; returns the keys of *this* pool evicted to make room (entries
        of other pools may go too). ValueError if `nbytes` exceeds the whole budget."""
        nbytes = estimate_bytes(value) if nbytes is None else int(nbytes)
        return [k for name, k in self.budget._put(self, key, value, nbytes) if name == self.name]

    def get(self, key: Hashable, default: Any = None) -> Any:
        found, value = self.budget._get((self.name, key))
        return value if found else default

    def discard(self, key: Hashable) -> None:
        with self.budget._lock:
            self.budget._drop((self.name, key))

    def clear(self) -> None:
        with self.budget._lock:
            for full in [k for k in self.budget._lru if k[0] == self.name]:
                self.budget._drop(full)

    def __contains__(self, key: Hashable) -> bool:
        with self.budget._lock:
            return (self.name, key) in self.budget._lru

    def __len__(self) -> int:
        return self.count

    def keys(self) -> list[Hashable]:
        with self.budget._lock:
            return [k for name, k in self.budget._lru if name == self.name]

    def memoize(self, fn: Callable | None = None, *, size: Callable[[Any], int] = estimate_bytes,
                freeze: bool = True) -> Callable:
        """Decorator: cache `fn`'s results in this pool, keyed by its arguments by value
        (arguments named `_...` are left out; bytes and arrays are keyed by a digest of their
        content). `freeze`: numpy arrays in a result are made read-only (the result is shared by
        every caller, not copied). The wrapper's `.clear()` empties the pool, `.is_cached(...)`
        says whether a call would be answered from it."""
        if fn is None:
            return functools.partial(self.memoize, size=size, freeze=freeze)
        sig = inspect.signature(fn)
        locks: dict[Hashable, threading.Lock] = {}
        guard = threading.Lock()

        def key_of(*args, **kwargs) -> Hashable:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            return (fn.__qualname__, *(freeze_key(v) for n, v in bound.arguments.items() if not n.startswith("_")))

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            key = key_of(*args, **kwargs)
            found, value = self.budget._get((self.name, key))
            if found:
                return value
            with guard:
                lock = locks.setdefault(key, threading.Lock())
            try:
                with lock:                  # one caller computes, the others wait for its result
                    found, value = self.budget._get((self.name, key))
                    if not found:
                        value = fn(*args, **kwargs)
                        if freeze:
                            _freeze_arrays(value)
                        nbytes = size(value)
                        if nbytes <= self.budget.max_bytes:
                            self.put(key, value, nbytes)
                        else:
                            log.info("memory budget: %s %s (%.0f MiB) is larger than the budget: not kept",
                                     self.name, _short(key), nbytes / 2**20)
            finally:
                with guard:
                    locks.pop(key, None)
            return value

        wrapper.clear, wrapper.pool = self.clear, self
        wrapper.is_cached = lambda *args, **kwargs: key_of(*args, **kwargs) in self
        return wrapper


def freeze_key(value: Any) -> Hashable:
    """`value` as a hashable cache key by content: containers become tuples, bytes longer than
    64 and numpy arrays a SHA-1 digest (with shape and dtype), so no key keeps big data alive."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return data if len(data) <= 64 else ("sha1", hashlib.sha1(data).hexdigest())
    np = _imported("numpy")
    if np is not None and isinstance(value, np.ndarray):
        return ("array", value.shape, str(value.dtype), hashlib.sha1(np.ascontiguousarray(value).data).hexdigest())
    if isinstance(value, dict):
        return ("dict", tuple((freeze_key(k), freeze_key(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return (type(value).__name__, tuple(freeze_key(v) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(map(repr, value))))
    hash(value)                         # anything else must be hashable (ValueError-like TypeError if not)
    return value


def _freeze_arrays(obj: Any, depth: int = 0) -> None:
    np = _imported("numpy")
    if np is None or depth > 4:
        return
    if isinstance(obj, np.ndarray):
        obj.setflags(write=False)
    elif isinstance(obj, dict):
        for v in obj.values():
            _freeze_arrays(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _freeze_arrays(v, depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _freeze_arrays(getattr(obj, f.name, None), depth + 1)


# ----------------------------------------------------------------------------- the allocator
COLLECT_AFTER = 16 << 20     # evicted bytes that make the budget run a full garbage collection (`Budget._collect`)
MMAP_THRESHOLD = 1 << 20     # blocks from 1 MiB up get their own mapping: freed, they leave the process
ARENA_MAX = 2                # malloc arenas (glibc's default, 8 per core, each keeps what it freed)


def _libc():
    import ctypes
    import ctypes.util
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def tune_allocator() -> bool:
    """Make freed memory leave the process (glibc only; False elsewhere): a fixed mmap threshold
    (`M_MMAP_THRESHOLD` 1 MiB: glibc otherwise raises it up to 32 MiB after the first big free,
    and an evicted trace's or model's blocks then stay in the heap, counted in RSS) and at most
    `ARENA_MAX` arenas (Streamlit runs each session's script in its own thread). What the
    budget evicts then really shrinks the server. Set once at server start (pages/common/cache.py)."""
    libc = _libc()
    if libc is None:
        return False
    M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_ARENA_MAX, ARENA_MAX))


def release_freed_memory() -> None:
    """Give the heap's free pages back to the system (glibc `malloc_trim(0)`; nothing elsewhere):
    after an import or a burst of evictions."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


# ----------------------------------------------------------------------------- the process's budget
_shared: Budget | None = None
_shared_lock = threading.Lock()


def budget_bytes() -> int:
    """`$VITPE_CACHE_MB` MiB (default `DEFAULT_CACHE_MB`); ValueError for a value that is not a
    positive number."""
    value = os.environ.get(ENV_VAR, "").strip()
    try:
        mb = float(value) if value else DEFAULT_CACHE_MB
    except ValueError:
        raise ValueError(f"{ENV_VAR}={value!r}: expected a number of MiB, e.g. {DEFAULT_CACHE_MB}") from None
    if mb <= 0:
        raise ValueError(f"{ENV_VAR}={value!r}: expected a positive number of MiB")
    return int(mb * 2**20)


def shared() -> Budget:
    """The process's one budget (made on first use from `$VITPE_CACHE_MB`)."""
    global _shared
    if _shared is None:
        with _shared_lock:
            if _shared is None:
                _shared = Budget(budget_bytes())
                log.info("memory budget: %.0f MiB for every cache and store (%s)", _shared.max_bytes / 2**20, ENV_VAR)
    return _shared
