"""Bounded stores for what visitors upload: imported models in memory (`LRUStore`) and on disk
(`ModelStore`), and images on disk (`ImageStore`); what is on disk is shareable by link with every
process that sees the same folder (replicas behind a load balancer, a restarted server).

`LRUStore` is a thread-safe least-recently-used store for imported models held in memory.

The app keeps visitors' uploaded models here (one store per server process): at most
`max_items` models, their parameters counted in bytes against the process's one memory budget
(`vitpe_core.membudget`, shared with every cache of the app); adding one past either limit
evicts the least recently used, and `put` says which of its models went, so the page can tell
the visitors whose model went. Keys are content hashes, so two visitors uploading the same file share one model.
No Streamlit: the store is plain Python and tested on its own.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from .membudget import Budget

if TYPE_CHECKING:   # torch is imported where it is used: the app draws its first page before torch is loaded
    import torch

T = TypeVar("T")
log = logging.getLogger(__name__)


def model_bytes(model: torch.nn.Module) -> int:
    """Memory held by a model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


class LRUStore(Generic[T]):
    """`key -> (value, size in bytes)`, least recently used first out: a pool of a memory
    `Budget` (`vitpe_core.membudget`), at most `max_items` entries. With `budget` the store
    shares that budget (the app: the process's one budget, `membudget.shared()`, so a model
    put here may evict traces or checkpoints and the other way round); without it, a budget of
    its own of `max_bytes`."""

    def __init__(self, max_items: int, max_bytes: int | None = None, *, budget: Budget | None = None,
                 name: str = "imported models") -> None:
        if max_items < 1 or (budget is None and (max_bytes is None or max_bytes < 1)):
            raise ValueError("a store needs room for at least one item")
        self.max_items = max_items
        self.budget = budget if budget is not None else Budget(max_bytes)
        self._pool = self.budget.pool(name, max_items=max_items)

    @property
    def max_bytes(self) -> int:
        """The bytes this store may hold at most: its budget's (shared with other pools)."""
        return self.budget.max_bytes

    def put(self, key: str, value: T, size: int) -> list[str]:
        """Add (or refresh) `key`; returns this store's keys evicted to make room (other pools'
        entries may go too). A value larger than the whole budget is refused with ValueError
        (nothing is evicted for it)."""
        if size > self.max_bytes:
            raise ValueError(f"needs {size / 2**20:.0f} MiB; this server keeps at most "
                             f"{self.max_bytes / 2**20:.0f} MiB of uploaded models and caches")
        evicted = self._pool.put(key, value, size)
        for key_out in evicted:
            log.info("model store: evicted %s (least recently used) to make room", key_out[:12])
        log.info("model store: %s stored (%.1f MiB); %d model(s), %.1f MiB held; %.1f of %.0f MiB budget used",
                 key[:12], size / 2**20, len(self._pool), self._pool.bytes / 2**20, self.budget.total / 2**20,
                 self.max_bytes / 2**20)
        return evicted

    def get(self, key: str) -> T | None:
        return self._pool.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self._pool

    def __len__(self) -> int:
        return len(self._pool)

    @property
    def bytes(self) -> int:
        return self._pool.bytes


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


class _HashedFiles:
    """Files named by a content hash in one folder, bounded by bytes (least recently used out: a
    read touches a file), shared by every process that sees the folder. Only a validated
    64-hex-digit hash ever reaches the filesystem. `suffix`: the files' (`sidecars`: files beside
    each, removed with it); `what`: the store's name in the log; `id_name`: what an id is, in errors."""

    suffix, sidecars, what, id_name = "", (), "store", "an id"

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def _path(self, digest: str) -> Path:
        if not isinstance(digest, str) or not HASH_RE.fullmatch(digest):
            raise ValueError(f"not {self.id_name}: expected 64 hexadecimal digits")
        return self.folder / f"{digest}{self.suffix}"

    def __contains__(self, digest: str) -> bool:
        try:
            return self._path(digest).is_file()
        except ValueError:
            return False

    def _files(self) -> list[tuple[int, int, Path]]:
        """(last use, bytes, path) of every stored file (one removed meanwhile by another process left out)."""
        out = []
        for f in (self.folder.glob(f"*{self.suffix}") if self.folder.is_dir() else []):
            if HASH_RE.fullmatch(f.stem):
                try:
                    st = f.stat()
                except OSError:
                    continue
                out.append((st.st_mtime_ns, st.st_size, f))
        return out

    def size(self) -> tuple[int, int]:
        """(files, bytes) in the store."""
        files = self._files()
        return len(files), sum(size for _, size, _ in files)

    def _remove(self, path: Path) -> None:
        for f in (path, *(path.with_suffix(s) for s in self.sidecars)):
            f.unlink(missing_ok=True)

    def _evict(self, keep: Path) -> None:
        """The least recently used files out until the store is within `max_bytes` (`keep` stays)."""
        files = sorted(self._files())
        total = sum(size for _, size, _ in files)
        for _, size, f in files:
            if total <= self.max_bytes:
                break
            if f != keep:
                total -= size
                self._remove(f)
                log.info("%s: evicted %s (%d bytes, least recently used; cap %d bytes)", self.what, f.stem[:12], size,
                         self.max_bytes)


class ImageStore(_HashedFiles):
    """Accepted uploads, normalised to PNG, on disk under their SHA-256, so that a link carrying
    `image=upload:<hash>` opens the same image for anyone on this server, after restarts too.
    Bounded: past `max_bytes` the least recently used files go (reading one refreshes it).
    Only a validated 64-hex-digit hash ever reaches the filesystem."""

    suffix, what, id_name = ".png", "upload store", "an upload id"

    def __init__(self, folder: str | Path | None = None, max_bytes: int = 500 * 2**20) -> None:
        super().__init__(Path(folder) if folder is not None else default_upload_dir(), max_bytes)

    def put(self, png: bytes) -> str:
        """Store PNG bytes; returns their SHA-256 (the upload id). Evicts old files past the cap."""
        digest = hashlib.sha256(png).hexdigest()
        path = self._path(digest)
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            if not path.exists():   # a temporary of its own, renamed: processes sharing the folder never tear it
                from .checkpoint import atomic_write_bytes
                atomic_write_bytes(path, png)
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


# ----------------------------------------------------------------------------- imported models on disk
MODEL_DIR_VAR = "VITPE_MODEL_DIR"


def default_model_dir() -> Path:
    """`$VITPE_MODEL_DIR`, else `models/` in the upload folder (`default_upload_dir`)."""
    value = os.environ.get(MODEL_DIR_VAR, "").strip()
    return Path(value).expanduser() if value else default_upload_dir() / "models"


class ModelStore(_HashedFiles):
    """Imported models on disk as vitpe checkpoints (`<sha256>.safetensors` and its JSON sidecar),
    keyed by the content hash of what was uploaded, so that a link carrying `model=<sha256>` opens
    the model on any process that sees the folder, after an eviction from memory or a restart.

    Safe as the image store is: only a validated 64-hex-digit hash reaches the filesystem; a file
    is written to a temporary name and renamed (`checkpoint.save_checkpoint`), so a reader sees a
    whole file or none, and two processes storing the same model at once write the same bytes;
    loading reads safetensors (no code runs) and checks the file as any checkpoint
    (`load_checkpoint`). Bounded: past `max_bytes` the least recently used models go (a read
    refreshes one); a model larger than the cap is not kept (`put` says so)."""

    suffix, sidecars, what, id_name = ".safetensors", (".json",), "model store", "a model id"

    def __init__(self, folder: str | Path | None = None, max_bytes: int = 2 * 2**30) -> None:
        super().__init__(Path(folder) if folder is not None else default_model_dir(), max_bytes)

    def file_bytes(self, digest: str) -> int:
        """The stored file's size (0: not stored): what loading it reads."""
        try:
            return self._path(digest).stat().st_size
        except (ValueError, OSError):
            return 0

    def put(self, digest: str, ckpt, dtype: torch.dtype) -> bool:
        """Keep `ckpt` (a `checkpoint.Checkpoint`, its name in its metrics as `upload_name`) under
        `digest`, its weights in `dtype` (the file's own precision: exact); False when it is larger
        than the cap (not kept). Evicts the least recently used past the cap."""
        from .checkpoint import save_checkpoint
        path = self._path(digest)
        if path.is_file():
            path.touch()
            return True
        metrics = {**ckpt.metrics, "upload_name": ckpt.name}
        save_checkpoint(path, ckpt.model, metrics=metrics, dtype=dtype)
        size = path.stat().st_size
        log.info("model store: stored %s (%s, %d bytes) in %s", digest[:12], ckpt.name, size, self.folder)
        with self._lock:
            self._evict(keep=path)
        if size > self.max_bytes:
            self._remove(path)
            return False
        return True

    def get(self, digest: str):
        """The stored model (a `Checkpoint` named as it was imported; a half-precision file's layer
        weights held in its precision, as the import held them: `held_precision`), or None if
        unknown, evicted, malformed or unreadable (a damaged file is removed)."""
        from .checkpoint import CheckpointError
        try:
            path = self._path(digest)
        except ValueError:
            return None
        if not path.is_file():
            return None
        try:
            ckpt = _load_held(path)
        except (CheckpointError, OSError, ValueError) as e:
            log.warning("model store: %s cannot be read (%s); removed", digest[:12], e)
            self._remove(path)
            return None
        path.touch()
        ckpt.name = str(ckpt.metrics.get("upload_name") or digest[:12])
        return ckpt


def _load_held(path: Path):
    """A stored import, built as the import built it (`foreign.assigned_model`: on the meta device,
    filled by assignment, a half-precision file's layer weights held in its precision): the file's
    tensors and the model never twice in memory (a ViT-B/16 in float16: 173 MB read, not 830 MB)."""
    import json

    import torch

    from .checkpoint import HISTORY, Checkpoint, CheckpointError, read_checkpoint_file, read_config
    from .foreign import assigned_model
    meta, tensors = read_checkpoint_file(path)
    config = read_config(path)
    try:
        metrics = json.loads(meta.get("metrics") or "{}")
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path.name}: its metrics are not JSON ({e})") from None
    held = getattr(torch, str(metrics.get("source_dtype", "")), None)
    held = held if held in (torch.float16, torch.bfloat16) else None
    weights = {k: v for k, v in tensors.items() if not k.startswith(HISTORY)}
    model = assigned_model(config, weights, path.name, spent=tensors, held=held)
    return Checkpoint(model, config, metrics, {}, path.stem)


def png_bytes(img) -> bytes:
    """A PIL image as the PNG the store keeps (RGB)."""
    buf = io.BytesIO()
    img.convert("RGB").save(buf, "PNG")
    return buf.getvalue()
