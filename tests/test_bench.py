"""The benchmark (`python -m benchmarks.bench`): its report rendered from a small synthetic
results dict and from the committed benchmarks.json (sections, targets, PASS / MISS / NOT
MEASURED, the **Why** lines a rerun keeps), its click compute on the pages' `vitpe_core.views`
calls, its checkpoint set, and one tiny end-to-end run (slow). Nothing here times anything or
asserts on speed (benchmarks are not timed tests: STYLE.md)."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from benchmarks import bench, timing
from benchmarks.attention import BATCHES, FUNCTIONAL_BASE, WIDTHS
from benchmarks.checkpoints import SHIPPED, checkpoint_set
from benchmarks.clicks import bias_page_compute, click_patches, compare_cold, compare_page_compute
from benchmarks.layer_profile import PROFILE_BEFORE
from benchmarks.report import NOISY_NOTE, WHY_TODO, render_markdown, written_whys
from benchmarks.targets import Target, targets
from benchmarks.timing import FULL, QUICK, Plan

REPO = Path(__file__).resolve().parents[1]
SECTIONS_MD = ("# Benchmarks", "## Machine and run", "## Targets", "## 1. Attention layer", "## 2. Training throughput",
               "## 3. Click compute", "## 4. App cold start", "## 5. Peak memory")
TARGET_KEYS = ("sape2_attention_vs_rpb", "sape2_training_vs_ape", "cope_training_vs_ape", "bias_click_patch_p95",
               "bias_click_image_p95",
               "compare_click_patch_p95", "compare_click_image_p95", "cold_start_http", "cold_start_first_element",
               "cold_start_first_chart", "app_memory_peak", "app_memory_rss")
APP_KEYS = TARGET_KEYS[7:]


# ----------------------------------------------------------------------------- a synthetic run
def _ratio_cols(key: str, value: float, best: float | None = None, noisy: bool = False) -> dict:
    return {key: value, f"{key}_best": value if best is None else best, f"{key}_noisy": noisy}


def _clicks(p95: float) -> dict:
    return {"n": 8, "p50_ms": p95 / 2, "p95_ms": p95, "max_ms": p95 + 1, "cpu_p50_ms": p95 / 2, "cpu_p95_ms": p95}


def fake_results(*, mode: str = "full", skip_app: bool = False) -> dict:
    """A run's results as `bench.run` builds them, with chosen numbers: `sape2` attention /
    rpb 1.8 (MISS, best-of-N 1.25: the cross-check disagrees), training / ape 0.95 (PASS), bias
    clicks 10 (PASS) and 80 ms (MISS), compare clicks 100 (PASS) and 400 ms (MISS); app:
    HTTP 2 s (PASS), first element 4.9 s (PASS, borderline), first run 7 s (MISS), memory 500 /
    400 MiB (PASS)."""
    attention = []
    for width, (dim, heads) in WIDTHS.items():
        for batch in BATCHES:
            for enc, vs_none, vs_rpb in (("none", 1.0, 0.8), ("rpb", 1.25, 1.0), ("sape2", 2.2, 1.8)):
                noisy = (width, batch, enc) == ("vit-s", 1, "rpb")
                attention.append({"width": width, "dim": dim, "heads": heads, "tokens": 65, "batch": batch,
                                  "encoding": enc, "median_ms": 2.0 * vs_none, "min_ms": 1.9 * vs_none,
                                  **_ratio_cols("vs_none", vs_none, noisy=noisy),
                                  **_ratio_cols("vs_rpb", vs_rpb, best=1.25 if enc == "sape2" else None),
                                  "samples_ms": [2.0 * vs_none]})
    training = [{"variant": name, "images_per_s": 1000 * t_ape, "median_step_ms": 128 / t_ape,
                 "min_step_ms": 120 / t_ape,
                 **_ratio_cols("throughput_vs_none", t_none), **_ratio_cols("throughput_vs_ape", t_ape),
                 "samples_ms": [128 / t_ape]}
                for name, t_none, t_ape in (("none", 1.0, 1.05), ("ape", 0.95, 1.0), ("sape2", 0.9, 0.95),
                                            ("cope+ape", 0.6, 0.6), ("torch.nn ViT (reference)", 1.1, 1.15))]
    names = list(SHIPPED)
    res = {
        "schema": 1, "mode": mode, "plan": asdict(QUICK if mode == "quick" else FULL),
        "environment": {"date": "2025-01-01T00:00:00+00:00", "command": "python -m benchmarks.bench", "cpu": "test CPU",
                        "cores": 2, "usable_cores": 2, "torch_threads": 2, "platform": "Linux", "python": "3.11",
                        "torch": "2.13", "numpy": "2.0", "streamlit": "1.0", "playwright": "1.0",
                        "chromium": "Chromium 1", "git_commit": "abc1234", "loadavg_start": [1.0, 1.0, 1.0],
                        "loadavg_end": [2.0, 1.5, 1.0],
                        "background_start": [{"pid": 7, "state": "R", "args": "vitpe_core train --encoding none"}],
                        "background_end": []},
        "section_s": {"attention": 1.0, "training": 2.0, "clicks": 3.0}, "wall_time_s": 6.0,
        "attention": attention, "training": training,
        "memory": {"training": [{"encoding": "ape", "what": "import + build only (0 steps)", "vmhwm_mib": 300.0,
                                 "vmrss_mib": 290.0}]},
        "clicks": {"single": "sape2+ape", "single_fresh": True, "checkpoints": names, "fresh": names[1:],
                   "images": ["cifar10-test-0000", "photo-chelsea"], "bias_patch": _clicks(10),
                   "bias_image": _clicks(80), "compare_patch": _clicks(100), "compare_image": _clicks(400)},
    }
    if skip_app:
        res["app"] = {"skipped": True}
    else:
        mem = {"VmHWM": 500.0, "VmRSS": 400.0}
        run = {"health_s": 1.5, "get_root_s": 2.0, "first_element_s": 4.9, "first_run_s": 7.0, "first_chart_s": 7.5,
               "after_first_page_mib": {"VmHWM": 350.0, "VmRSS": 340.0}}
        res["app"] = {"checkpoints": names, "listed": names + ["long/none", "long/sape2"], "fresh": names[1:],
                      "default": "sape2+ape", "browser": True,
                      "browser_reason": None, "runs": [run], **{k: v for k, v in run.items() if k.endswith("_s")},
                      "first_run_max_s": run["first_run_s"], "first_chart_max_s": run["first_chart_s"],
                      "compare_first_run_s": 3.0, "after_compare": {"VmHWM": 450.0, "VmRSS": 380.0},
                      "after_compare_all": mem, "e2e_bias": [300.0, 310.0],
                      "e2e_compare": [900.0],
                      "floor_runs": [{"health_s": 0.9, "get_root_s": 1.0, "first_element_s": 2.9, "first_run_s": 3.0,
                                      "first_chart_s": 3.5}],
                      "floor_first_run_s": 3.0, "floor_first_run_max_s": 3.0, "floor_first_chart_s": 3.5,
                      "floor_first_chart_max_s": 3.5}
    return res


def md_section(md: str, heading: str) -> str:
    """The text of the `## heading...` section, up to the next `## `."""
    return md.split("\n" + heading, 1)[1].split("\n## ", 1)[0]


def check_tables(md: str) -> None:
    """Every markdown table has as many cells in each row as in its header."""
    rows: list[str] = []
    for line in [*md.splitlines(), ""]:
        if line.startswith("|"):
            rows.append(line)
            continue
        if rows:
            assert rows[1].startswith("|---"), rows[:2]
            assert len({r.count(" | ") for r in rows if not r.startswith("|---")}) == 1, rows
        rows = []


# ----------------------------------------------------------------------------- the report
def test_report_has_every_section_target_and_verdict():
    res = fake_results()
    tgts = targets(res)
    assert tuple(t.key for t in tgts) == TARGET_KEYS
    status = {t.key: t.status for t in tgts}
    assert status == {"sape2_attention_vs_rpb": "MISS", "sape2_training_vs_ape": "PASS",
                      "cope_training_vs_ape": "MISS", "bias_click_patch_p95": "PASS",
                      "bias_click_image_p95": "MISS", "compare_click_patch_p95": "PASS",
                      "compare_click_image_p95": "MISS", "cold_start_http": "PASS", "cold_start_first_element": "PASS",
                      "cold_start_first_chart": "MISS", "app_memory_peak": "PASS", "app_memory_rss": "PASS"}
    md = render_markdown(res, tgts)
    check_tables(md)
    positions = [md.index(h) for h in SECTIONS_MD]
    assert positions == sorted(positions)                                          # every section, in order
    assert "Generated by `python -m benchmarks.bench` (benchmarks/bench.py)" in md
    assert "QUICK smoke run" not in md

    table = md_section(md, "## Targets")
    assert table.count("**PASS**") == 7 and table.count("**MISS**") == 5 and "NOT MEASURED" not in table
    assert table.count("borderline") == 1                                          # first element, 4.9 s of 5
    assert "1.25x (**verdict differs**)" in table                                  # the best-of-N cross-check
    assert "1 GB is taken as 10⁹ bytes" in table
    misses = [line for line in table.splitlines() if line.startswith("* **MISS")]
    assert len(misses) == 5
    assert "* **MISS — SaPE² attention layer fwd+bwd / `rpb`, compact, batch 128**: 1.80x, 0.50x over the limit " \
           "(38 % over)." in misses
    whys = [line for line in table.splitlines() if "**Why:**" in line]
    assert [w.rsplit("why:", 1)[1] for w in whys] == ["sape2_attention_vs_rpb -->", "cope_training_vs_ape -->",
                                                       "bias_click_image_p95 -->",
                                                       "compare_click_image_p95 -->", "cold_start_first_chart -->"]
    assert all(WHY_TODO in w for w in whys)                                        # placeholders until written

    attention = md_section(md, "## 1. Attention layer")
    assert attention.count("**compact**") == 2 and attention.count("**vit-s**") == 2
    assert "| `sape2` | 2.20 | 1.80 | 2.20 / 1.25 |" in attention
    assert "1.25 †" in attention and NOISY_NOTE in attention                 # the noisy row is flagged
    training = md_section(md, "## 2. Training throughput")
    assert "| torch.nn ViT (reference) |" in training and "timm is not installed" in training
    assert NOISY_NOTE not in training
    clicks = md_section(md, "## 3. Click compute")
    assert "vitpe_core.views" in clicks and "(freshly built compact model, random weights)" in clicks
    assert "| compare | all 10 | new image (cold traces) | 8 | 200.0 | 400.0 |" in clicks
    app = md_section(md, "## 4. App cold start")
    assert "| first script run complete (chromium) | 7.00 s |" in app and "Patch change end to end" in app
    assert "| floor: a Streamlit app drawing one Plotly chart, first script run complete (chromium) | 3.00 s |" in app
    assert "| **the first page's charts drawn, slowest of the 1** (7.50 s) | 7.50 s |" in app
    assert "| **floor: its chart drawn, slowest of the 1** (3.50 s) | 3.50 s |" in app
    assert "| floor, slowest of the 1 (3.00 s) | 3.00 s |" in app and "`benchmarks.app.FLOOR_APP`" in app
    memory = md_section(md, "## 5. Peak memory")
    assert "| app server after the compare page (the default 10 shown and loaded) | 450 | 380 |" in memory
    assert "| app server after the compare page (then all 12 listed shown and loaded) | 500 | 400 |" in memory
    assert "| compare page, first run: 10 checkpoints loaded, the default 10 shown (after the bias page) |" in app
    assert "not measured" not in memory
    assert "| app server peak resident (VmHWM) with all 12 listed checkpoints loaded (compare page) | 500 MiB |" in md
    machine = md_section(md, "## Machine and run")
    assert "pid 7 `vitpe_core train --encoding none`: running" in machine and "| load average" in machine


def test_the_benchmark_compiles_what_the_dockerfile_compiles_and_the_floor_app_draws_a_title(tmp_path):
    """Cold starts are timed with the app's modules compiled to bytecode, as the image has them
    (its PYTHONDONTWRITEBYTECODE keeps the server from writing any): the same modules both ways.
    The floor app is a Streamlit script with the `h1` the timing waits for."""
    from benchmarks.app import APP_SOURCES, FLOOR_APP

    runs = [line.split() for line in (REPO / "Dockerfile").read_text().splitlines()
            if line.startswith("RUN python -m compileall")]
    assert len(runs) == 1 and runs[0][-len(APP_SOURCES):] == list(APP_SOURCES), runs
    assert "PYTHONDONTWRITEBYTECODE=1" in (REPO / "Dockerfile").read_text()
    compile(FLOOR_APP, "floor_app.py", "exec")
    assert "st.title(" in FLOOR_APP and "import torch" not in FLOOR_APP


def test_report_of_a_quick_run_without_the_app():
    res = fake_results(mode="quick", skip_app=True)
    tgts = targets(res)
    md = render_markdown(res, tgts)
    check_tables(md)
    assert "> **QUICK smoke run** (`--quick`)" in md
    table = md_section(md, "## Targets")
    assert table.count("**NOT MEASURED** (skipped (--skip-app))") == len(APP_KEYS)
    assert table.count("**PASS**") + table.count("**MISS**") == len(TARGET_KEYS) - len(APP_KEYS)
    assert table.count("**Why:**") == table.count("**MISS**") == 4
    assert "Not measured in this run (`--skip-app`)." in md_section(md, "## 4. App cold start")
    assert "App memory not measured in this run (`--skip-app`)." in md_section(md, "## 5. Peak memory")


def test_report_of_the_committed_results_has_every_section_in_order():
    """The repository's benchmarks.json (a full run) renders with sections 6-9 too, in the
    report's order; section 6 starts with the heading that `--only vit-b` replaces."""
    from benchmarks.report_vit_b import VIT_B_HEADING, md_vit_b
    res = json.loads((REPO / "benchmarks.json").read_text())
    md = render_markdown(res, targets(res))
    check_tables(md)
    headings = [*SECTIONS_MD[1:], VIT_B_HEADING, "## 7. ", "## 8. ", "## 9. "]
    positions = [md.index("\n" + h) for h in headings]
    assert md.startswith(SECTIONS_MD[0]) and positions == sorted(positions)
    assert md_vit_b(res)[0].startswith(VIT_B_HEADING)


def test_report_without_a_browser_says_why():
    res = fake_results()
    app = res["app"]
    for key in ("first_element_s", "first_run_s", "first_run_max_s", "first_chart_s", "first_chart_max_s",
                "compare_first_run_s", "after_compare",
                "after_compare_all", "e2e_bias", "e2e_compare"):
        app.pop(key)
    app["runs"][0] = {"health_s": 1.5, "get_root_s": 2.0}
    app.update(browser=False, browser_reason="chromium not found")
    tgts = {t.key: t for t in targets(res)}
    assert tgts["cold_start_http"].status == "PASS"
    assert all(tgts[k].status == "NOT MEASURED" and tgts[k].note == "chromium not found" for k in APP_KEYS[1:])
    md = render_markdown(res, list(tgts.values()))
    assert "Browser measurements not taken: chromium not found." in md
    assert "App memory not measured: chromium not found." in md


def test_why_lines_survive_a_rewrite_while_the_target_is_missed(tmp_path):
    res = fake_results()
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(render_markdown(res, targets(res)) + "\n")
    assert written_whys(path) == {}                                                # placeholders are not kept
    text = path.read_text()
    for key, why in (("sape2_attention_vs_rpb", "the bias is dense (B, h, N, N)."),
                     ("cold_start_first_chart", "torch's import takes 3 s.")):
        text = text.replace(f"**Why:** {WHY_TODO} <!-- why:{key} -->", f"**Why:** {why} <!-- why:{key} -->")
    path.write_text(text)
    whys = written_whys(path)
    assert whys == {"sape2_attention_vs_rpb": "the bias is dense (B, h, N, N).",
                    "cold_start_first_chart": "torch's import takes 3 s."}

    res["app"]["first_chart_s"] = res["app"]["first_chart_max_s"] = 4.0   # within the floor's 3.5 + 1: its Why goes
    md = render_markdown(res, targets(res), whys)
    assert "  **Why:** the bias is dense (B, h, N, N). <!-- why:sape2_attention_vs_rpb -->" in md
    assert "torch's import" not in md and "why:cold_start_first_chart" not in md
    assert f"**Why:** {WHY_TODO} <!-- why:bias_click_image_p95 -->" in md
    path.write_text(md + "\n")
    assert written_whys(path) == {"sape2_attention_vs_rpb": "the bias is dense (B, h, N, N)."}
    assert written_whys(tmp_path / "missing.md") == {}


def test_target_verdicts_and_miss_amounts():
    slow = Target("k", "layer / rpb", 1.5, "max", "x", measured=1.8, check=1.4)
    assert slow.status == "MISS" and "0.30x over the limit (20 % over)" in slow.miss_by
    assert "verdict differs" in slow.check_text
    fast = Target("k", "throughput / ape", 0.7, "min", "x", measured=0.63, check=0.64)
    assert fast.status == "MISS" and "(10 % under)" in fast.miss_by and "same verdict" in fast.check_text
    assert Target("k", "p95", 50, "max", "ms", measured=12.0).status == "PASS"
    assert Target("k", "p95", 50, "max", "ms", measured=50.0).status == "PASS"     # the limit itself passes
    assert Target("k", "cold start", 5, "max", "s").status == "NOT MEASURED"
    assert Target("k", "p95", 50, "max", "ms", measured=49.0).borderline
    assert not Target("k", "p95", 50, "max", "ms", measured=40.0).borderline


def test_paired_and_best_of_n_ratios():
    samples = {"a": [2.0, 4.0, 2.2], "b": [1.0, 1.0, 1.1]}      # round 2 disturbed a (load)
    assert timing.paired_ratio(samples, "a", "b") == pytest.approx(2.0)
    assert timing.best_ratio(samples, "a", "b") == pytest.approx(2.0)
    r = timing.ratios(samples, "a", "b", "x", invert=True)
    assert r["x"] == pytest.approx(0.5) and not r["x_noisy"]
    assert timing.ratios({"a": [3.0, 3.0], "b": [1.0, 2.0]}, "a", "b", "x")["x_noisy"]   # median 2.25 vs best 3
    calls = {"a": 0, "b": 0}
    out = timing.interleaved({k: (lambda k=k: calls.__setitem__(k, calls[k] + 1)) for k in calls}, rounds=3, warmup=1)
    assert {k: len(v) for k, v in out.items()} == {"a": 3, "b": 3} and calls == {"a": 4, "b": 4}
    calls = {"a": 0, "b": 0}                                          # a sample: the mean of 3 calls
    out = timing.interleaved({k: (lambda k=k: calls.__setitem__(k, calls[k] + 1)) for k in calls}, rounds=2, warmup=1,
                             calls_per_sample=3)
    assert {k: len(v) for k, v in out.items()} == {"a": 2, "b": 2} and calls == {"a": 7, "b": 7}


def test_click_patches_change_every_click():
    patches = click_patches((8, 8), 50)
    assert len(patches) == 50 and all(p != q for p, q in zip(patches, patches[1:]))
    assert all(0 <= r < 8 and 0 <= c < 8 for r, c in patches)


# ----------------------------------------------------------------------------- what is timed
def test_click_compute_calls_the_pages_views(app_checkpoint_dir, monkeypatch):
    """The click compute runs `vitpe_core.views` as the pages do: bias_view where the
    encoding has a bias, attention_view, prefix_share, top_class; panel_view and pick_stat per
    checkpoint, with the view clamped to each model (and moved from the reference grid)."""
    from vitpe_core import views
    from vitpe_core.checkpoint import list_checkpoints, load_checkpoint, resolve_checkpoint
    from vitpe_core.gallery import gallery_ids

    called: dict[str, list] = {}
    for name in ("bias_view", "attention_view", "prefix_share", "top_class", "panel_view", "pick_stat", "clamp_view"):
        real = getattr(views, name)
        monkeypatch.setattr(views, name, lambda *a, _real=real, _name=name, **k: (
            called.setdefault(_name, []).append(a), _real(*a, **k))[1])
    names = list_checkpoints(app_checkpoint_dir)
    ckpts = {n: load_checkpoint(resolve_checkpoint(n, app_checkpoint_dir)) for n in names}
    traces, stats = compare_cold(ckpts, gallery_ids()[0], (3, 4))
    assert set(traces) == set(stats) == set(ckpts)
    assert len(called["panel_view"]) == len(ckpts) and len(called["pick_stat"]) == 2 * len(ckpts)

    called.clear()
    compare_page_compute(ckpts, traces, stats, (9, 9), layer=5, head=7)   # beyond every model: clamped
    assert [a[2:] for a in called["panel_view"]] == [((7, 7), 1, 1)] * len(ckpts)
    called.clear()
    compare_page_compute(ckpts, traces, stats, (1, 2), ref_grid=(4, 4))    # chosen on a coarser grid
    assert [a[2] for a in called["panel_view"]] == [(3, 5)] * len(ckpts)        # the same point of the image

    called.clear()
    for ckpt in ckpts.values():
        bias_page_compute(ckpt, traces[ckpt.name], (2, 5), layer=1, head=None)
    assert [a[2] for a in called["bias_view"]] == ["rpb", "sape2+ape"]             # the encodings with a bias
    assert [a[5] for a in called["bias_view"]] == ["row", "sum"]                   # the page's default part
    assert len(called["attention_view"]) == len(called["prefix_share"]) == len(called["top_class"]) == len(ckpts)


def test_checkpoint_set_fills_the_shipped_set_with_random_compact_models(app_checkpoint_dir, tmp_path, monkeypatch):
    import shutil

    from vitpe_core.checkpoint import list_checkpoints, load_checkpoint, resolve_checkpoint
    from vitpe_core.report import ORDER

    assert SHIPPED == tuple(ORDER)                                            # one source
    for name in ("ape", "rpb"):
        shutil.copy2(app_checkpoint_dir / f"{name}.safetensors", tmp_path)
    monkeypatch.setattr("benchmarks.checkpoints.SHIPPED", ("ape", "rpb", "sape2+ape"))
    with checkpoint_set(tmp_path) as cs:
        assert cs.root != tmp_path and sorted(cs.names) == ["ape", "rpb", "sape2+ape"] and cs.fresh == ["sape2+ape"]
        assert cs.single == "ape"                                                   # sape2+ape is not trained
        fresh = load_checkpoint(resolve_checkpoint("sape2+ape", cs.root))
        assert fresh.config.dim == 128 and fresh.metrics["random_weights"] and sorted(fresh.history) == list(range(16))
        assert load_checkpoint(resolve_checkpoint("ape", cs.root)).config.dim == 32   # copied as it is
    assert not cs.root.exists() and list_checkpoints(tmp_path) == ["ape", "rpb"]
    monkeypatch.setattr("benchmarks.checkpoints.SHIPPED", ("ape", "rpb"))
    with checkpoint_set(tmp_path) as cs:
        assert cs.root == tmp_path and cs.fresh == []


# ----------------------------------------------------------------------------- the library stays clean
def test_the_library_imports_neither_the_benchmarks_nor_the_app_stack():
    code = ("import sys, pkgutil, vitpe_core\n"
            "for m in pkgutil.iter_modules(vitpe_core.__path__): __import__('vitpe_core.' + m.name)\n"
            "print(sorted({n.split('.')[0] for n in sys.modules} & {'benchmarks', 'streamlit', 'playwright'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_command_prints_its_usage():
    out = subprocess.run([sys.executable, "-m", "benchmarks.bench", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "usage: python -m benchmarks.bench" in out.stdout and "--only {vit-b,app}" in out.stdout


# ----------------------------------------------------------------------------- one tiny real run
TINY_PLAN = Plan(attn_rounds=1, attn_min_sample_s=0.0, train_rounds=1, warmup=0, clicks=2, app_runs=1, e2e_clicks=1,
                 memory_steps=1, memory_encodings=())


def numbers(x):
    """Every number in a JSON value (booleans are not numbers)."""
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, list):
        for v in x:
            yield from numbers(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield x


@pytest.mark.slow
def test_a_tiny_run_writes_the_report_and_sane_numbers(app_checkpoint_dir, tmp_path, monkeypatch):
    """`bench.run` end to end on a tiny subset: the compact width at batch 128, four encodings,
    the test checkpoints, no app. Checks the files, not the speed."""
    monkeypatch.setattr("benchmarks.attention.WIDTHS", {"compact": WIDTHS["compact"]})
    monkeypatch.setattr("benchmarks.attention.BATCHES", (128,))
    monkeypatch.setattr("benchmarks.training.EXTRA_TRAIN", ())
    monkeypatch.setattr("benchmarks.checkpoints.SHIPPED", ("ape", "sape2+ape", "rpb"))
    monkeypatch.setattr(bench, "available_encodings", lambda: ["none", "ape", "rpb", "sape2"])
    res = bench.run(TINY_PLAN, out=tmp_path, skip_app=True, argv=["--quick", "--skip-app"],
                    checkpoints=app_checkpoint_dir, mode="quick")
    md = (tmp_path / "BENCHMARKS.md").read_text()
    check_tables(md)
    assert all(h in md for h in SECTIONS_MD) and "`python -m benchmarks.bench --quick --skip-app`" in md
    data = json.loads((tmp_path / "benchmarks.json").read_text())
    assert data["mode"] == "quick" and data["app"] == {"skipped": True} and len(data["attention"]) == 4
    assert {r["variant"] for r in data["training"]} >= {"none", "ape", "rpb", "sape2"}
    assert data["clicks"]["fresh"] == [] and data["clicks"]["single"] == "sape2+ape"
    assert all(data["clicks"][k]["n"] == TINY_PLAN.clicks for k in ("bias_patch", "bias_image", "compare_patch",
                                                                     "compare_image"))
    by_key = {t["key"]: t for t in res["targets"]}
    measured = [k for k in TARGET_KEYS[:7] if k != "cope_training_vs_ape"]     # EXTRA_TRAIN is empty here
    assert all(by_key[k]["status"] in ("PASS", "MISS") and by_key[k]["measured"] > 0 for k in measured)
    assert by_key["cope_training_vs_ape"]["status"] == "NOT MEASURED"
    assert all(by_key[k]["status"] == "NOT MEASURED" for k in APP_KEYS)
    assert all(math.isfinite(v) for v in numbers(data))


def test_functional_profile_and_analysis_sections_and_the_analysis_target():
    """Sections 7-9 (issue 14) render from their results; the analysis budget becomes a target."""
    res = fake_results()
    res["functional"] = [{"variant": name, "median_ms": 10.0 * x, "min_ms": 9.0 * x,
                          **_ratio_cols("vs_base", x), "samples_ms": [10.0 * x]}
                         for name, x in (("SDPA (no bias)", 0.9), (FUNCTIONAL_BASE, 1.0),
                                         ("`sape2_attention`", 1.2), ("`cope_attention`", 1.4))]
    phase = {"wall_ms": 12.0, "ops": {f"aten::op{i}": {"self_ms": float(i), "calls": 2.0} for i in range(20)}}
    res["profile"] = {"steps": 2, "threads": 2, "before_commit": PROFILE_BEFORE,
                      "after": {"forward": phase, "backward": phase}, "before": {"forward": phase, "backward": phase}}
    res["analysis"] = {"checkpoint": "sape2+ape", "wall_s": 12.5, "cpu_s": 20.0, "images": 17}
    tgts = targets(res)
    assert tgts[-1].key == "analysis_budget" and tgts[-1].status == "PASS"
    md = render_markdown(res, tgts)
    check_tables(md)
    for heading in ("## 7. SaPE² and CoPE as functions", "## 8. Profile of the SaPE² attention layer",
                    "## 9. Analysis budget"):
        assert heading in md
    profile = md_section(md, "## 8. Profile")
    assert profile.count("| `aten::op19` | 19.00 |") == 4                          # top op of each of 4 tables
    assert "`aten::op7`" not in profile                                           # only the top 12
    assert "| `sape2_attention` | 1.20 |" in md_section(md, "## 7.")
    del res["profile"]["before"]
    res["profile"]["before_reason"] = "no `git archive` here"
    assert "**Before**: no `git archive` here." in render_markdown(res, targets(res))
    res["analysis"] = {"checkpoint": "sape2+ape", "reason": "not found"}
    assert targets(res)[-1].status == "NOT MEASURED"


@pytest.mark.skipif(os.environ.get("VITPE_NO_CPP", "") not in ("", "0") or shutil.which("c++") is None,
                    reason="C++ kernel disabled or no compiler")
def test_kernel_ab_prints_one_line_per_variant():
    from benchmarks.kernel_ab import kernel_ab
    lines = kernel_ab("layer", 1, batch=2)
    assert [ln.split()[3:5] for ln in lines] == [["rpb", "median"], ["sape2", "cpp"], ["sape2", "eager"]]
    assert os.environ.get("VITPE_NO_CPP") is None


def test_trace_caches_are_bounded_by_bytes():
    """Both trace caches (bias page, stress test) are pools of the process's one memory budget
    (`vitpe_core.membudget`), bounded by its bytes and by the entries the report's section 6
    quotes (`report_vit_b.APP_TRACE_CACHE_*`, which the benchmark keeps so as not to import the
    app): a 224-px model's traces are tens of MiB each, so entries alone do not bound memory."""
    from benchmarks.report_vit_b import APP_TRACE_CACHE_BYTES, APP_TRACE_CACHE_ENTRIES
    from pages.common import cache, stress_panel
    from vitpe_core import membudget
    assert cache._trace.pool.max_items == cache.TRACE_CACHE_ENTRIES == APP_TRACE_CACHE_ENTRIES
    for fn in (cache._trace, stress_panel._transformed):
        assert fn.pool.budget is membudget.shared()
    assert APP_TRACE_CACHE_BYTES == membudget.DEFAULT_CACHE_MB * 2**20


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile's CPU backend needs a C++ compiler (g++)")
def test_compiled_ab_prints_eager_and_compiled_throughput():
    """What runs and what it prints, not its figures: `aot_eager` captures the same graph (the
    custom ops) without inductor's code generation; compiled training under inductor itself is
    tests/test_train.py's."""
    from benchmarks.compiled_ab import compiled_ab
    lines = compiled_ab(("sape2",), rounds=1, batch=2, warmup=1, preset="tiny", backend="aot_eager")
    assert lines[0].startswith("fused kernel:") and len(lines) == 2
    assert lines[1].split()[0] == "sape2" and "compiled/eager: paired median" in lines[1]


def test_a_bench_rerun_keeps_the_sections_other_commands_write():
    from benchmarks.report import kept_sections
    old = "# Benchmarks\n\n## 1. Attention\nold\n\n## 10. HTML report\nsizes\n\n## 11. Compiled training\nratios\n"
    new = "# Benchmarks\n\n## 1. Attention\nnew\n\n## 2. Training\nrows\n"
    got = kept_sections(old, new)
    assert got == "# Benchmarks\n\n## 1. Attention\nnew\n\n## 2. Training\nrows\n\n## 10. HTML report\nsizes\n\n" \
                  "## 11. Compiled training\nratios\n"
    assert kept_sections("", new) == new


def test_the_compiled_section_has_a_row_per_encoding_with_its_paired_ratio():
    import argparse

    from benchmarks.compiled_ab import SECTION, markdown
    tail = "img/s  compiled/eager: paired median"
    lines = ["fused kernel: built",
             f"sape2      eager     262 img/s  compiled     301 {tail} 1.149 (IQR 1.120-1.170)",
             f"ape        eager     306 img/s  compiled     330 {tail} 1.078 (IQR 1.050-1.100)"]
    md = markdown(lines, argparse.Namespace(rounds=20, batch=128))
    assert md[0].startswith(SECTION) and "--rounds 20 --write BENCHMARKS.md" in md[2]
    assert [r for r in md if r.startswith("| `")] == ["| `sape2` | 262 | 301 | 1.149 (IQR 1.120-1.170) |",
                                                      "| `ape` | 306 | 330 | 1.078 (IQR 1.050-1.100) |"]


@pytest.mark.slow
def test_gpu_benchmark_says_it_needs_a_gpu_and_its_smoke_run_covers_every_section(capsys, tmp_path):
    """`python -m benchmarks.gpu` exits 2 with a clear message where no CUDA GPU is present;
    `--smoke` runs every section on the CPU at toy sizes (so the script cannot rot on machines
    without a GPU) and checks its targets, but never writes a figure to a markdown file."""
    import torch

    from benchmarks import gpu

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the no-GPU message does not apply")
    assert gpu.main([]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err
    md = tmp_path / "B.md"
    md.write_text("# B\n")
    assert gpu.main(["--smoke", "--write", str(md), "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "SaPE² layer fwd+bwd ≤ 1.3× rpb (toy, bf16)" in out and "bf16 step of sape2+ape" in out
    assert md.read_text() == "# B\n"
    res = json.loads((tmp_path / "r.json").read_text())
    assert {r["encoding"] for r in res["training"]} == set(gpu.ENCODINGS)
    assert all(r["finite"] for r in res["bf16"])
    assert [r["encoding"] for r in res["trainer"]] == ["ape", "sape2", "cope+ape"]     # train() itself ran


def test_coldstart_profile_adds_up_the_main_threads_samples_by_script():
    """`benchmarks.coldstart_profile` names the browser's work by script file (Plotly's chunk, the
    highlighter, ...): samples' time deltas summed per file, hashes dropped, idle time left out."""
    from benchmarks.coldstart_profile import _busy_by_script

    def node(i, fn, url):
        return {"id": i, "callFrame": {"functionName": fn, "url": url}}

    profile = {"nodes": [node(1, "(idle)", ""), node(2, "newPlot", "http://x/static/js/PlotlyChart.D9Z0_fxz.js"),
                         node(3, "(program)", ""), node(4, "e", "http://x/static/js/StreamlitSyntaxHighlighter.BUg.js"),
                         node(5, "f", "")],
               "samples": [1, 2, 2, 3, 4, 5, 1], "timeDeltas": [500, 1000, 2000, 300, 400, 100, 9000]}
    assert _busy_by_script(profile) == {"PlotlyChart": 3.0, "(program)": 0.3, "StreamlitSyntaxHighlighter": 0.4,
                                        "(native)": 0.1}
