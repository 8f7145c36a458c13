"""What git tracks: nothing a training run writes (runs/, `*.pt` states) and no file over 5 MB
(the shipped checkpoints are about 2-3 MB each). Skipped where the tree is not a git checkout
(an sdist, a copied folder) or git is not installed."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAX_TRACKED_BYTES = 5 * 1024 * 1024


def _git(*args: str, check: bool = True, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=check, input=stdin, timeout=60)


@pytest.fixture(scope="module")
def tracked() -> dict[str, int]:
    """Every tracked path (the index: what the next commit holds) -> its size in bytes, the larger
    of the staged blob and the working-tree file (a commit -a would take that one)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    top = _git("rev-parse", "--show-toplevel", check=False)
    if top.returncode != 0 or Path(top.stdout.decode().strip()).resolve() != REPO:
        pytest.skip(f"{REPO} is not the top of a git checkout")
    entries = [e for e in _git("ls-files", "-s", "-z").stdout.decode().split("\0") if e]
    blobs, paths = [], []
    for e in entries:                                     # "<mode> <sha> <stage>\t<path>"
        meta, path = e.split("\t", 1)
        mode, sha, _ = meta.split()
        if mode != "160000":                              # a submodule's commit is no blob
            blobs.append(sha)
            paths.append(path)
    sizes = _git("cat-file", "--batch-check=%(objectsize)", stdin="\n".join(blobs).encode() + b"\n").stdout.split()
    out = {}
    for path, size in zip(paths, sizes):
        f = REPO / path
        out[path] = max(int(size), f.stat().st_size if f.is_file() and not f.is_symlink() else 0)
    return out


def test_nothing_under_runs_is_tracked(tracked):
    runs = sorted(p for p in tracked if p == "runs" or p.startswith("runs/"))
    assert not runs, f"training output is tracked by git (git rm --cached -r runs): {runs[:10]}"


def test_no_training_state_is_tracked(tracked):
    states = sorted(p for p in tracked if p.endswith(".pt"))
    assert not states, f"training states (*.pt) are tracked by git: {states[:10]}"


def test_no_tracked_file_is_over_5_mb(tracked):
    big = {p: s for p, s in tracked.items() if s > MAX_TRACKED_BYTES}
    assert not big, "tracked files over 5 MB: " + ", ".join(f"{p} ({s / 2**20:.1f} MB)" for p, s in sorted(big.items()))


@pytest.mark.parametrize("path", ["runs/ape/state.pt", "runs/long/sape2/final.safetensors", "runs/x/metrics.json",
                                  "state.pt", "checkpoints/state.pt", "somewhere/deep/model.pt"])
def test_gitignore_keeps_training_output_out(tracked, path):
    """.gitignore ignores runs/ and `*.pt` states wherever they are written."""
    assert _git("check-ignore", "-q", "--no-index", path, check=False).returncode == 0, f"{path} is not ignored"
