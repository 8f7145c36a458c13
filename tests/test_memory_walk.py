"""The memory walk's big-model run, short (`python -m benchmarks.memory_walk --big`, CI's
version): a real server under a 1 GiB limit (a cgroup where one can be made, else an RSS watch),
two visitors importing ViT-S/16-shaped models (float16 files, each held in float16: 42 MiB, under
an 80 MiB memory budget: the second import evicts the first, and each upload makes room for
itself) and visiting two distinct uploaded images (one per model) on the bias, compare and
similarity pages. The full run (two ViT-B/16, 60 images, the default budget) is
the lead's: `python -m benchmarks.memory_walk --big` (RELIABILITY.md, Deploy)."""
from __future__ import annotations

import json

import pytest

from benchmarks.memory_walk import main


@pytest.mark.slow
def test_big_models_walk_stays_under_the_peak_with_evictions_and_no_page_error(app_checkpoint_dir, tmp_path):
    out = tmp_path / "walk.json"
    code = main(["--big", "--shape", "s16", "--models", "2", "--images", "2", "--cache-mb", "80",
                 "--peak-mb", "900", "--checkpoints", str(app_checkpoint_dir), "--timeout", "240",
                 "--out", str(out)])
    report = json.loads(out.read_text())
    steps = [(s["step"], s["hwm_mb"], s["exceptions"]) for s in report["steps"]]
    assert report["exceptions"] == [], steps
    assert report["images_visited"] == 2 and report["server_alive"] and report["healthy_after"]
    assert report["evictions_logged"], report["server_log_tail"]
    assert report["pools"]["imported models"]["evicted"] >= 1, report["pools"]   # the second import evicted the first
    # room made for an upload before Streamlit read its bytes (pages/common/upload_room.py)
    assert any("to make room for an upload of" in line for line in report["evictions_logged"]), \
        report["evictions_logged"][:20]
    peak = max(report["peak_rss_mb"], report["watched_peak_mb"])
    assert peak <= 900, steps
    assert code == 0
