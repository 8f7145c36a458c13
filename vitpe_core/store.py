"""Bounded stores for what visitors upload: imported models in memory (`LRUStore`) and images
on disk, shareable by link (`ImageStore`).

`LRUStore` is a thread-safe least-recently-used store for imported models held in memory.

The app keeps visitors' uploaded models here (one store per server process): at most
`max_models` and `max_bytes` of parameters in total; adding one past either limit evicts
the least recently used, and `put` says which, so the page can tell the visitors whose model
went. Keys are content hashes, so two visitors uploading the same file share one model.
No Streamlit: the store is plain Python and tested on its own.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Generic, TypeVar

import torch

T = TypeVar("T")
log = logging.getLogger(__name__)


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
            total, count = self.bytes_locked(), len(self._items)
        for key_out in evicted:
            log.info("model store: evicted %s (least recently used) to make room", key_out[:12])
        log.info("model store: %s stored (%.1f MiB); %d model(s), %.1f of %.0f MiB held",
                 key[:12], size / 2**20, count, total / 2**20, self.max_bytes / 2**20)
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


# ----------------------------------------------------------------------------- shareable uploads
UPLOAD_DIR_VAR = "VITPE_UPLOAD_DIR"
HASH_RE = re.compile(r"[0-9a-f]{64}")


def default_upload_dir() -> Path:
    """`$VITPE_UPLOAD_DIR`, else the user's cache folder (`$XDG_CACHE_HOME/vitpe/uploads`,
    default `~/.cache/vitpe/uploads`): never the repository."""
    value = os.environ.get(UPLOAD_DIR_VAR, "").strip()
    if value:
        return Path(value).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(cache) / "vitpe" / "uploads"


class ImageStore:
    """Accepted uploads, normalised to PNG, on disk under their SHA-256, so that a link carrying
    `image=upload:<hash>` opens the same image for anyone on this server, after restarts too.
    Bounded: past `max_bytes` the least recently used files go (reading one refreshes it).
    Only a validated 64-hex-digit hash ever reaches the filesystem."""

    def __init__(self, folder: str | Path | None = None, max_bytes: int = 500 * 2**20) -> None:
        self.folder = Path(folder) if folder is not None else default_upload_dir()
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def _path(self, digest: str) -> Path:
        if not isinstance(digest, str) or not HASH_RE.fullmatch(digest):
            raise ValueError("not an upload id: expected 64 hexadecimal digits")
        return self.folder / f"{digest}.png"

    def put(self, png: bytes) -> str:
        """Store PNG bytes; returns their SHA-256 (the upload id). Evicts old files past the cap."""
        digest = hashlib.sha256(png).hexdigest()
        path = self._path(digest)
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(png)
                os.replace(tmp, path)
                log.info("upload store: stored %s (%d bytes) in %s", digest[:12], len(png), self.folder)
            else:
                path.touch()
            self._evict(keep=path)
        return digest

    def get(self, digest: str) -> bytes | None:
        """The stored PNG bytes, or None if unknown or evicted (also for a malformed id)."""
        try:
            path = self._path(digest)
        except ValueError:
            return None
        with self._lock:
            try:
                data = path.read_bytes()
            except OSError:
                return None
            path.touch()
        return data

    def size(self) -> tuple[int, int]:
        """(files, bytes) in the store."""
        sizes = []
        for f in (self.folder.glob("*.png") if self.folder.is_dir() else []):
            try:
                sizes.append(f.stat().st_size)
            except OSError:          # evicted while we looked
                pass
        return len(sizes), sum(sizes)

    def _evict(self, keep: Path) -> None:
        files = sorted(self.folder.glob("*.png"), key=lambda f: f.stat().st_mtime_ns)
        total = sum(f.stat().st_size for f in files)
        for f in files:
            if total <= self.max_bytes:
                break
            if f != keep:
                size = f.stat().st_size
                total -= size
                f.unlink(missing_ok=True)
                log.info("upload store: evicted %s (%d bytes, least recently used; cap %d bytes)",
                         f.stem[:12], size, self.max_bytes)


def png_bytes(img) -> bytes:
    """A PIL image as the PNG the store keeps (RGB)."""
    buf = io.BytesIO()
    img.convert("RGB").save(buf, "PNG")
    return buf.getvalue()
