"""The house rules a newcomer relies on: the library runs without Streamlit, pages only lay out."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE_MAX_LINES = 130

BLOCK_APP_PACKAGES = r"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("streamlit", "playwright", "plotly_express"):
            raise ImportError(f"{name} is blocked: vitpe_core must work without it")
sys.meta_path.insert(0, Block())
import pkgutil, vitpe_core
for m in pkgutil.walk_packages(vitpe_core.__path__, "vitpe_core."):
    __import__(m.name)
print("ok", len(sys.modules))
"""


def test_every_library_module_imports_without_streamlit():
    res = subprocess.run([sys.executable, "-c", BLOCK_APP_PACKAGES], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and res.stdout.startswith("ok"), res.stderr[-2000:]


def test_the_blocker_would_catch_a_streamlit_import(tmp_path):
    """The check above can fail: the same blocker stops a module that imports Streamlit."""
    bad = tmp_path / "uses_streamlit.py"
    bad.write_text("import streamlit\n")
    code = BLOCK_APP_PACKAGES.split("import pkgutil")[0] + "import uses_streamlit\n"
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "blocked" in res.stderr


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_pages_only_lay_out():
    """No page does array maths (no numpy or torch: that lives in vitpe_core.views / analysis)
    and none is longer than a screenful or two."""
    pages = sorted((REPO / "pages").glob("*.py"))
    assert {p.stem for p in pages} >= {"bias", "similarity", "compare", "checkpoints"}
    for page in pages:
        assert not _imports(page) & {"numpy", "torch"}, page.name
        assert len(page.read_text().splitlines()) <= PAGE_MAX_LINES, page.name


def test_ruff_is_clean():
    """pyproject.toml's [tool.ruff] rules hold on the whole tree (ruff is a test dependency)."""
    import shutil
    import pytest
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -r requirements-dev.txt)")
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True)
    files = tracked.stdout.split() if tracked.returncode == 0 and tracked.stdout.strip() else ["."]
    # the repository's own files (a build or cache folder a user keeps in the clone is not the tree's)
    res = subprocess.run([ruff, "check", "--force-exclude", "--output-format", "concise", *files], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]


def test_the_router_can_draw_before_torch_is_imported():
    """app.py draws the page title before its heavy imports (cold start): `vitpe_core.viewstate`,
    which it imports first, must not pull in torch, and vitpe_core's lazy top-level names must
    all resolve."""
    import vitpe_core
    code = "import sys, vitpe_core.viewstate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr
    assert vitpe_core.__all__ == sorted(vitpe_core._LAZY)
    for name in vitpe_core.__all__:
        assert getattr(vitpe_core, name) is not None


def test_the_readme_does_not_promise_a_browser_the_config_does_not_open():
    """`.streamlit/config.toml` runs Streamlit headless: the README's first command must not say
    it opens a browser."""
    import tomllib
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    readme = (REPO / "README.md").read_text()
    if config.get("server", {}).get("headless"):
        assert "opens http://localhost" not in readme
        assert "open http://localhost:8501 in a browser" in readme
