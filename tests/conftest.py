"""Shared fixtures. `shared_dir` is ../shared (data for CI and developers); tests that need it
skip with a reason on a user's fresh clone, where it does not exist."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.harness import APP_ENCODINGS, write_random_checkpoints

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "data").is_dir():
        pytest.skip(f"../shared not found at {SHARED}: it exists only in this project's dev checkout and CI")
    return SHARED


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ----------------------------------------------------------------------------- app checkpoints
@pytest.fixture(scope="session")
def app_checkpoint_dir(tmp_path_factory) -> Path:
    """A folder of tiny random-weight checkpoints (8x8 grid, D 32, 2 layers, 2 heads), one per
    APP_ENCODINGS, with minimal metrics and a two-epoch history, for the Streamlit app tests
    (`benchmarks.harness.write_random_checkpoints`, which the load test and the benchmark use too)."""
    return write_random_checkpoints(tmp_path_factory.mktemp("app_checkpoints"), APP_ENCODINGS)


# ----------------------------------------------------------------------------- browser tests
BROWSER_EXPECT_TIMEOUT_MS = 60_000


def pytest_runtest_setup(item) -> None:
    """Browser tests: playwright's `expect` waits up to 60 s for its condition (its default is
    5 s), as their page calls do; on a loaded 2-core machine the app's first run takes longer."""
    if item.get_closest_marker("browser") is not None:
        from playwright.sync_api import expect

        expect.set_options(timeout=BROWSER_EXPECT_TIMEOUT_MS)


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium through playwright for a browser test module (module scope: it is
    closed before tests/test_load.py starts its own, async, playwright)."""
    from playwright.sync_api import sync_playwright

    from benchmarks import harness
    with sync_playwright() as p:
        b = harness.launch_chromium(p)
        yield b
        b.close()
