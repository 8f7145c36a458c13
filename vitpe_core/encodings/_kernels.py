"""Fused C++ CPU kernels for the hot part of `sape2_attention` / `cope_attention`.

The source is `csrc/attend.cpp` (the operators) with `csrc/attend_kernels.h` (the kernels),
package data. It is built once, on first use, with
`torch.utils.cpp_extension.load` into `build_directory()`: `$TORCH_EXTENSIONS_DIR/<name>`, else
`<torch's default build root, ~/.cache/torch_extensions>/py<X.Y>_torch<version>/<name>`. The
name (`extension_name`) holds a hash of the source and the compiler flags and one of this torch
install's folder, so an edited source never loads a stale build and each virtual environment
keeps its own. A lock the OS releases with its holder serialises concurrent loads and builds
(`_held_by_this_process`). The kernels are used for CPU float32/float64 tensors.

What they fuse, per (batch, head) and with every `N x N` intermediate kept in cache instead of
written to memory:
* The whole attention, forward and backward (`sape2_attend_fwd` / `_bwd`, `cope_attend_fwd` /
  `_bwd`): the `(batch, head)` pairs in chunks whose `T x T` block (~256 KiB) fits the core's L2
  cache, each chunk in one thread from the matmul that writes it through the kernels below and
  the softmax (or its backward) to the matmuls that read it, the chunks handed out one at a
  time (a thread slowed by another process does fewer); the logits' gradient exists only as a
  chunk per thread. Op by op over the whole `(B, h, T, T)` tensor (8.6 MB at batch 128,
  65 tokens: out of L2, and a barrier between threads after every op) the same work took ~1.7x
  as long.
* SaPE² forward: the logits on every row and column line gathered and turned into gates by a
  vectorised σ, their reverse cumulative sums, the read-out interpolation (the descriptors
  `s_x, s_y`; the steps between read-outs formed here from `z = src·[E_x, E_y]`), and the
  Euclidean distances of the descriptors added into the logits: each pair `i < n` once (the
  matrix is symmetric, its diagonal 0), 8 (float) / 4 (double) columns at a time with the
  squared sum in a vector register. Only the descriptors and the line gates are kept
  (`(B, h, N, W + H)` values), not the eager path's two `N x N` `1/distance` buffers.
* SaPE² backward: the distance gradient (recomputed distances, upper triangle, weight
  `(G + Gᵀ)/distance` from the logits' gradient G, whose transpose is read in 8 x 8 tiles;
  the descriptors' gradient summed a row of coordinates at a time, so no horizontal sums),
  the line backward (read-out gradient, gate cumsum, `σ′`), the gate gradient added into the
  logits' gradient.
* CoPE forward / backward, keys in their own order: (gates from ATen's sigmoid) reverse cumsum,
  interpolation, bias added into the logits; backward scatter into the read-outs' gradient,
  cumsum, `σ′`, added into the logits' gradient.
  Only the gates are kept (the eager path keeps four `T x T` tensors).

No compiler, a failed build, or `VITPE_NO_CPP=1`: `kernels()` returns None (one warning when a
build was tried and failed) and functional.py runs its eager code, which the kernels match to
rounding (tests/test_cope_sape2.py runs both). The loops are plain C++ for the compiler to
vectorise (`-O3`, no `-march`), parallel over (batch, head) with `at::parallel_for` (torch's
thread count).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Iterator

__all__ = ["kernels", "available", "build_seconds", "extension_name", "build_directory", "SOURCE"]

SOURCE = Path(__file__).with_name("csrc") / "attend.cpp"     # the operators; it includes the kernels' header
_CFLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
_LDFLAGS = ["-fopenmp"]

_lock = threading.Lock()
_state: dict = {}
build_seconds: float | None = None


STALE_LOCK_S = 600   # a build takes ~15 s (a minute on a slow, busy machine): a lock this old is a killed build's


def _clear_stale_lock(name: str, max_age_s: float = STALE_LOCK_S) -> None:
    """torch's extension builder waits forever on the `lock` file of a build that was killed
    half-way: wait while a lock is younger than `max_age_s` (another process is building), and
    remove it once it is older (nobody is)."""
    lock = Path(build_directory(name)) / "lock"
    while lock.exists():
        try:
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return
        if age > max_age_s:
            warnings.warn(f"vitpe: removing a stale build lock {lock} ({age:.0f} s old, left by a killed build)",
                          stacklevel=4)
            lock.unlink(missing_ok=True)
            return
        time.sleep(1.0)


@contextlib.contextmanager
def _held_by_this_process(name: str) -> Iterator[bool]:
    """An advisory lock (`fcntl.flock`) on `vitpe.flock` in the extension's build folder, held
    while torch loads it: the kernel releases it when its holder dies, however it dies. Under
    it no other vitpe process is inside torch's loader, so torch's own `lock` file, which a
    process killed in the second or two of every load (torch runs ninja each time) leaves
    behind for good, is stale and removed. Yields False (nothing held) where `fcntl` is missing
    or the lock file cannot be opened; `_clear_stale_lock` then applies."""
    try:
        import fcntl

        folder = Path(build_directory(name))
        fd = os.open(folder / "vitpe.flock", os.O_RDWR | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)          # waits while another process loads or builds it
        (folder / "lock").unlink(missing_ok=True)
        yield True
    finally:
        os.close(fd)                            # releases the lock


def _source_bytes() -> bytes:
    """What the build is made of: `SOURCE` and the headers beside it (attend_kernels.h)."""
    return b"".join(f.read_bytes() for f in (SOURCE, *sorted(SOURCE.parent.glob("*.h"))))


def extension_name() -> str:
    """`vitpe_attend_<8 hex digits of the source and flags>_<8 hex digits of this torch's
    folder and of the source file's path>`. A changed `SOURCE` or header (or flags) is a new name, hence
    a fresh build, never a stale one loaded. Each virtual environment and each checkout gets its
    own build in the shared extension cache: one name for all made two environments (or two
    clones) rebuild it in turn, 15-40 s each time (torch's build.ninja holds the torch
    include paths and the source's path, and a different one makes ninja rebuild)."""
    import torch
    build = hashlib.sha256(_source_bytes() + repr((_CFLAGS, _LDFLAGS)).encode()).hexdigest()[:8]
    where = f"{Path(torch.__file__).resolve().parent}|{SOURCE.resolve()}"   # build.ninja names both paths
    tag = hashlib.sha256(where.encode()).hexdigest()[:8]
    return f"vitpe_attend_{build}_{tag}"


def build_directory(name: str) -> str:
    """The folder `name` is built in, created if missing: `$TORCH_EXTENSIONS_DIR/<name>` when
    that is set (as torch does), else `<torch's default build root>/py<X.Y>_torch<version>/<name>`."""
    import torch
    from torch.utils.cpp_extension import get_default_build_root
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if not root:
        tag = re.sub(r"[^\w.]", "_", f"py{sys.version_info.major}{sys.version_info.minor}_torch{torch.__version__}")
        root = os.path.join(get_default_build_root(), tag)
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    return folder


def _build():
    from torch.utils.cpp_extension import load
    name = extension_name()
    with _held_by_this_process(name) as held:
        if not held:
            _clear_stale_lock(name)
        load(name=name, sources=[str(SOURCE)], extra_cflags=_CFLAGS, extra_ldflags=_LDFLAGS,
             build_directory=build_directory(name), verbose=False, is_python_module=False)
    import torch
    return getattr(torch.ops, name)     # the operators the library registered (TORCH_LIBRARY, no pybind11)


def kernels():
    """The compiled operators (`.sape2_attend_fwd`, `.sape2_attend_bwd`, `.cope_attend_fwd`,
    `.cope_attend_bwd`), or None (eager): `VITPE_NO_CPP=1`, or no compiler / a failed build
    (warned once)."""
    global build_seconds
    if os.environ.get("VITPE_NO_CPP", "") not in ("", "0"):
        return None
    if "mod" in _state:
        return _state["mod"]
    with _lock:
        if "mod" not in _state:
            t0 = time.perf_counter()
            try:
                _state["mod"] = _build()
                build_seconds = time.perf_counter() - t0
            except Exception as exc:  # no compiler, failed build, unwritable cache dir
                _state["mod"] = None
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:200]
                warnings.warn(f"vitpe: the fused C++ CPU kernel could not be built ({first}); the eager "
                              f"PyTorch path is used (slower). Install a C++ compiler (e.g. `apt-get install "
                              f"g++`) to get it; set VITPE_NO_CPP=1 to skip it silently.", stacklevel=3)
    return _state["mod"]


def available() -> bool:
    return kernels() is not None
