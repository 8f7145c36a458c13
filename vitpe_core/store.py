"""A bounded, thread-safe least-recently-used store for imported models held in memory.

The app keeps visitors' uploaded models here (one store per server process): at most
`max_models` and `max_bytes` of parameters in total; adding one past either limit evicts
the least recently used, and `put` says which, so the page can tell the visitors whose model
went. Keys are content hashes, so two visitors uploading the same file share one model.
No Streamlit: the store is plain Python and tested on its own.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


def model_bytes(model: torch.nn.Module) -> int:
    """Memory held by a model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


class LRUStore(Generic[T]):
    """`key -> (value, size in bytes)`, least recently used first out."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        if max_items < 1 or max_bytes < 1:
            raise ValueError("a store needs room for at least one item")
        self.max_items, self.max_bytes = max_items, max_bytes
        self._items: OrderedDict[str, tuple[T, int]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: str, value: T, size: int) -> list[str]:
        """Add (or refresh) `key`; returns the keys evicted to make room. A value larger than
        the whole store is refused with ValueError (nothing is evicted for it)."""
        if size > self.max_bytes:
            raise ValueError(f"needs {size / 2**20:.0f} MiB; this server keeps at most "
                             f"{self.max_bytes / 2**20:.0f} MiB of uploaded models")
        evicted = []
        with self._lock:
            self._items.pop(key, None)
            while self._items and (len(self._items) >= self.max_items or self.bytes_locked() + size > self.max_bytes):
                evicted.append(self._items.popitem(last=False)[0])
            self._items[key] = (value, size)
        return evicted

    def get(self, key: str) -> T | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def bytes_locked(self) -> int:
        return sum(size for _, size in self._items.values())

    @property
    def bytes(self) -> int:
        with self._lock:
            return self.bytes_locked()
