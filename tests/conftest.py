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


# ----------------------------------------------------------------------------- app checkpoints
APP_ENCODINGS = ("ape", "sape2+ape", "rope_mixed", "rpb", "none")


@pytest.fixture(scope="session")
def app_checkpoint_dir(tmp_path_factory) -> Path:
    """A folder of tiny random-weight checkpoints (8x8 grid, D 32, 2 layers, 2 heads) with
    minimal metrics and a two-epoch history, for the Streamlit app tests."""
    from vitpe_core import ViTConfig, build_model
    from vitpe_core.checkpoint import history_params, save_checkpoint

    root = tmp_path_factory.mktemp("app_checkpoints")
    for i, enc in enumerate(APP_ENCODINGS):
        torch.manual_seed(i)
        model = build_model(ViTConfig(img_size=(32, 32), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=64,
                                      encoding=enc)).eval()
        first = history_params(model)
        with torch.no_grad():                      # epoch 1 differs from epoch 0
            for p in model.pos_enc.parameters():
                p.add_(0.01 * torch.randn_like(p))
        metrics = {"recipe": {"dataset": "cifar10", "encoding": enc, "epochs": 1}, "epochs": 1,
                   "test": {"top1": 10.0 + i, "top5": 50.0 + i, "loss": 2.3},
                   "curves": {"epoch": [1], "train_loss": [2.3], "train_acc": [10.0], "test_top1": [10.0 + i],
                              "test_top5": [50.0 + i], "test_loss": [2.3]}}
        if enc == "ape":
            metrics["resolution"] = {"24": {"top1": 9.0, "top5": 49.0, "grid": [6, 6]},
                                     "40": {"top1": 8.0, "top5": 48.0, "grid": [10, 10]}}
        save_checkpoint(root / f"{enc}.safetensors", model, metrics=metrics,
                        history={0: first, 1: history_params(model)})
    return root


def load_script(name: str):
    """scripts/<name>.py as a module (the browser and load tests share scripts/load_test.py)."""
    import importlib.util
    import sys
    mod_name = f"vitpe_scripts_{name}"
    if mod_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(mod_name, REPO / "scripts" / f"{name}.py")
        sys.modules[mod_name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[mod_name]
