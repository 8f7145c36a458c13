"""The modules the app's first page needs import without torch.

Importing torch takes about 2 s cold. The app draws its first page before torch is imported
(app.py imports only torch-free modules first); pages/common/warmup.py imports torch after that,
in a background thread. So the library modules below import torch, the models and the
encodings (which import torch) only inside the functions that use them, and name torch types
under `TYPE_CHECKING` alone. These tests run in a fresh interpreter (the test process itself has
imported torch already, in conftest.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

LIGHT_MODULES = (
    "vitpe_core.analysis", "vitpe_core.positional", "vitpe_core.stress", "vitpe_core.inputs",
    "vitpe_core.images", "vitpe_core.store", "vitpe_core.checkpoint", "vitpe_core.views",
    "vitpe_core.swin.explore",
)

# A finder that refuses torch: any module that imports it at module level fails to import.
BLOCK_TORCH = r"""
import importlib, importlib.abc, json, sys
class BlockTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch imported")
sys.meta_path.insert(0, BlockTorch())
failed = {}
for name in MODULES:
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = f"{type(e).__name__}: {e}"
try:
    import vitpe_core.model
    blocks = False
except ImportError as e:
    blocks = "torch imported" in str(e)
print(json.dumps({"failed": failed, "blocks": blocks}))
"""

IMPORT_ALL = r"""
import importlib, sys
for name in MODULES:
    importlib.import_module(name)
print("torch" in sys.modules)
"""


def _run(code: str) -> str:
    res = subprocess.run([sys.executable, "-c", f"MODULES = {LIGHT_MODULES!r}\n{code}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip().splitlines()[-1]


def test_the_first_page_modules_import_with_torch_blocked():
    """Each module imports while every import of torch raises ImportError: none of them (nor
    anything they import from vitpe_core) imports torch at module level, so the app can draw its
    first page before torch is loaded. The same run checks that the blocker stops a module that
    does import torch (vitpe_core.model), so the check cannot pass by not blocking anything."""
    out = json.loads(_run(BLOCK_TORCH))
    assert out["failed"] == {}, "these modules import torch at module level: " + json.dumps(out["failed"], indent=1)
    assert out["blocks"], "the blocker let vitpe_core.model import torch"


def test_importing_the_first_page_modules_leaves_torch_unloaded():
    """Imported together and without a blocker (nothing swallows an ImportError), the modules
    leave torch out of `sys.modules`: pages/common/warmup.py is the one to import it, after
    the first page is drawn."""
    assert _run(IMPORT_ALL) == "False"


def test_the_torch_free_encoding_names_are_the_registered_ones():
    """`config.BUILT_IN_ENCODINGS` lets a checkpoint's config be checked without importing the
    encodings (torch): it must name exactly the encodings vitpe_core.encodings registers."""
    from vitpe_core.config import BUILT_IN_ENCODINGS, ENCODINGS, encoding_parts
    from vitpe_core.encodings.base import _REGISTRY

    built_in = {n for n, cls in _REGISTRY.items() if cls.__module__.startswith("vitpe_core.encodings.")}
    assert built_in == set(BUILT_IN_ENCODINGS) and set(_REGISTRY) <= set(ENCODINGS)
    assert encoding_parts("sape2+ape") == ["sape2", "ape"]
    with pytest.raises(ValueError, match="unknown encoding"):
        encoding_parts("sape9")
