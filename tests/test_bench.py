"""The benchmark script's smoke path: `python -m vitpe_core.bench --quick --skip-app` writes
BENCHMARKS.md and benchmarks.json with every section and sane numbers. Nothing here asserts
on speed (benchmarks are not timed tests: STYLE.md)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SECTIONS_MD = ("## Machine and run", "## Targets", "## 1. Attention layer", "## 2. Training throughput",
               "## 3. Click compute", "## 4. App cold start", "## 5. Peak memory")
POSITIVE_KEYS = ("median_ms", "min_ms", "vs_none", "vs_none_best", "vs_rpb", "vs_rpb_best", "images_per_s",
                 "median_step_ms", "min_step_ms", "throughput_vs_none", "throughput_vs_none_best", "throughput_vs_ape",
                 "throughput_vs_ape_best", "p50_ms", "p95_ms", "max_ms", "vmhwm_mib", "vmrss_mib", "wall_time_s")


def numbers(x, path=""):
    """Every (path, number) in a JSON value; booleans are not numbers."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from numbers(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from numbers(v, f"{path}[{i}]")
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, x


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, "-m", "vitpe_core.bench", "--quick", "--skip-app", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc


@pytest.mark.slow
def test_quick_run_writes_every_section(quick_run):
    out, proc = quick_run
    md = (out / "BENCHMARKS.md").read_text()
    for heading in SECTIONS_MD:
        assert heading in md, heading
    assert "QUICK smoke run" in md
    assert "python -m vitpe_core.bench --quick --skip-app --out" in md   # the exact command
    assert "--skip-app" in md.split("## 4.")[1]                           # the app part says it was skipped
    targets = md.split("## Targets")[1].split("## 1.")[0]
    assert targets.count("**NOT MEASURED**") == 5                         # the app's targets, skipped
    assert targets.count("**PASS**") + targets.count("**MISS**") == 6
    assert targets.count("**Why:**") == targets.count("**MISS**")        # one placeholder per miss
    assert "PASS" in proc.stdout or "MISS" in proc.stdout                # the summary printed


@pytest.mark.slow
def test_quick_run_json_is_complete_and_sane(quick_run):
    from vitpe_core.encodings import available_encodings

    out, _ = quick_run
    res = json.loads((out / "benchmarks.json").read_text())
    assert res["mode"] == "quick"
    for key in ("environment", "attention", "training", "memory", "clicks", "app", "targets", "wall_time_s"):
        assert key in res, key
    env = res["environment"]
    for key in ("cpu", "cores", "python", "torch", "streamlit", "date", "command"):
        assert env[key], key
    assert res["app"] == {"skipped": True}

    encs = available_encodings()
    attn = {(r["width"], r["batch"], r["encoding"]) for r in res["attention"]}
    assert attn == {(w, b, e) for w in ("compact", "vit-s") for b in (1, 128) for e in encs}
    variants = {r["variant"] for r in res["training"]}
    assert set(encs) <= variants and any("reference" in v for v in variants)
    for kind in ("bias_patch", "bias_image", "compare_patch", "compare_image"):
        assert res["clicks"][kind]["n"] >= 1
    assert len(res["memory"]["training"]) >= 2

    for path, value in numbers(res):
        assert math.isfinite(value), path
        if path.rsplit(".", 1)[-1] in POSITIVE_KEYS or "samples_ms" in path:
            assert value > 0 or "cpu_" in path, (path, value)

    by_key = {t["key"]: t for t in res["targets"]}
    for key in ("sape2_attention_vs_rpb", "sape2_training_vs_ape", "bias_click_patch_p95", "bias_click_image_p95",
                "compare_click_patch_p95", "compare_click_image_p95"):
        assert by_key[key]["status"] in ("PASS", "MISS"), key
        assert by_key[key]["measured"] > 0
    for key in ("cold_start_http", "cold_start_first_element", "cold_start_first_run", "app_memory_peak",
                "app_memory_rss"):
        assert by_key[key]["status"] == "NOT MEASURED", key


def test_target_verdicts_and_miss_amounts():
    from vitpe_core.bench import Target

    slow = Target("k", "layer / rpb", 1.5, "max", "x", measured=1.8, check=1.4)
    assert slow.status == "MISS" and "0.30x over the limit (20 % over)" in slow.miss_by
    assert "verdict differs" in slow.check_text
    fast = Target("k", "throughput / ape", 0.7, "min", "x", measured=0.63, check=0.64)
    assert fast.status == "MISS" and "(10 % under)" in fast.miss_by and "same verdict" in fast.check_text
    assert Target("k", "p95", 50, "max", "ms", measured=12.0).status == "PASS"
    assert Target("k", "cold start", 5, "max", "s").status == "NOT MEASURED"


def test_why_lines_survive_a_rewrite(tmp_path):
    from vitpe_core.bench import WHY_TODO, written_whys

    md = tmp_path / "BENCHMARKS.md"
    md.write_text(f"* **MISS — a**: x\n  **Why:** {WHY_TODO} <!-- why:a -->\n"
                  "* **MISS — b**: y\n  **Why:** the bias is dense (B, h, N, N). <!-- why:b -->\n")
    assert written_whys(md) == {"b": "the bias is dense (B, h, N, N)."}
    assert written_whys(tmp_path / "missing.md") == {}
