"""Shared fixtures. `shared_dir` is ../shared (data for CI and developers); tests that need it
skip with a reason on a user's fresh clone, where it does not exist."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

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
