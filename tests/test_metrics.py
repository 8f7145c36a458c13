"""`metrics.sanitize_metrics`: the shapes of a checkpoint's metrics that the app relies on."""
from __future__ import annotations

from vitpe_core.metrics import sanitize_metrics


def test_sanitize_metrics_keeps_what_train_writes_and_names_what_it_drops():
    good = {"test": {"top1": 74.7, "top5": 98.3, "loss": 0.8}, "epochs": 15, "recipe": {"preset": "compact"},
            "resolution": {"24": {"top1": 70.3, "grid": [6, 6]}}, "translation": {"half_x": {"agreement": 80.1,
            "shift_px": [0, 2]}}, "curves": {"epoch": [1, 2], "test_top1": [37.1, 48.6]}, "notes": "n",
            "git_commit": "a" * 40, "structure": {"spearman": 0.51}, "class_names": ["a", "b"]}
    assert sanitize_metrics(good) == (good, [])
    bad = {"test": {"top1": "high", "top5": float("nan")}, "epochs": True, "structure": 3,
           "resolution": {"24": "x", "40": {"top1": 70.0}}, "curves": {"epoch": [1, 2], "train_loss": [2.3],
           "test_top1": [None, "a"], "test_top5": [90.0, 91.0]}, "notes": 7}
    clean, problems = sanitize_metrics(bad)
    assert clean["test"] == {"top1": None, "top5": None}
    assert "epochs" not in clean and "structure" not in clean and "notes" not in clean
    assert clean["resolution"] == {"40": {"top1": 70.0}}
    assert clean["curves"] == {"epoch": [1, 2], "test_top5": [90.0, 91.0]}
    joined = "; ".join(problems)
    for word in ("epochs", "structure", "notes", "resolution: 1 entries", "train_loss", "test_top1"):
        assert word in joined, (word, joined)
    assert sanitize_metrics([1, 2]) == ({}, ["metrics is a list, not an object"])
