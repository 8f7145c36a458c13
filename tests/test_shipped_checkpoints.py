"""The models in checkpoints/ are what the README's results table reports: every one carries
the metrics issue #3 lists, all share one recipe, and (slow, needs ../shared for CIFAR-10) each
predicts exactly the recorded class for every image of a fixed 256-image subset of the test set, in
one process (checkpoints/subset_accuracy.json, written by scripts/record_subset_accuracy.py). Before a
release (`--release` or VITPE_RELEASE=1): `python -m vitpe_core evaluate` reproduces each recorded
top-1 on the whole 10,000-image test set within 0.2 points from the fp16 weights."""
from __future__ import annotations

import functools
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from vitpe_core.checkpoint import list_checkpoints, load_checkpoint
from vitpe_core.metrics import sanitize_metrics

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(list_checkpoints(REPO / "checkpoints"))
RECIPE_KEYS_THAT_MAY_DIFFER = {"encoding", "encoding_options"}
pytestmark = pytest.mark.skipif(not SHIPPED, reason="no checkpoints shipped in checkpoints/")


def _metrics(name: str) -> dict:
    return json.loads((REPO / "checkpoints" / f"{name}.json").read_text())["metrics"]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_checkpoint_carries_the_listed_metrics(name):
    m = _metrics(name)
    for key in ("recipe", "epochs", "wall_time_s", "images_per_s", "test", "resolution", "translation",
                "git_commit", "curves"):
        assert key in m, f"{name}: metrics lack {key!r}"
    assert m["recipe"]["encoding"] == name
    assert set(m["test"]) >= {"top1", "top5"}
    assert set(m["resolution"]) == {"24", "32", "40", "48"}
    assert {"whole_x", "half_x"} <= set(m["translation"])
    assert len(m["curves"]["test_top1"]) == m["epochs"] == m["recipe"]["epochs"]
    assert len(m["git_commit"]) == 40
    has_table = load_checkpoint(REPO / "checkpoints" / f"{name}.safetensors").model.pos_enc.table((8, 8)) is not None
    assert ("structure" in m) == has_table, f"{name}: a 2D-structure score exactly when it has a table"
    assert sanitize_metrics(m) == (m, []), f"{name}: the app's metrics check would hide part of it"


def test_all_checkpoints_share_one_recipe():
    recipes = {n: {k: v for k, v in _metrics(n)["recipe"].items() if k not in RECIPE_KEYS_THAT_MAY_DIFFER}
               for n in SHIPPED}
    first = next(iter(recipes.values()))
    for n, r in recipes.items():
        assert r == first, f"{n} was trained with another recipe: {set(r.items()) ^ set(first.items())}"


# The shipped rows, then the study's reruns: second seeds (checkpoints/seeds) and 50-epoch runs (checkpoints/long).
STUDY = sorted((REPO / "checkpoints" / "seeds").glob("*.safetensors")) + sorted(
    (REPO / "checkpoints" / "long").glob("*.safetensors"))
EVALUATED = [REPO / "checkpoints" / f"{n}.safetensors" for n in SHIPPED] + STUDY
EVALUATED_IDS = [p.relative_to(REPO / "checkpoints").with_suffix("").as_posix() for p in EVALUATED]
SUBSET_RECORD = REPO / "checkpoints" / "subset_accuracy.json"
RECORD_SCRIPT = "python scripts/record_subset_accuracy.py"


@functools.cache
def _record_script():
    spec = importlib.util.spec_from_file_location("record_subset_accuracy", REPO / "scripts" /
                                                  "record_subset_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def subset_record() -> dict:
    return json.loads(SUBSET_RECORD.read_text())


def test_the_subset_record_is_of_these_checkpoints(subset_record):
    """checkpoints/subset_accuracy.json covers exactly the evaluated checkpoints, measured on
    their current weights, and agrees with each one's recorded top-1 on the whole test set
    within four standard errors of a proportion on the subset (12.5 points for 256 images; the
    SaPE² rows' first 256 images are their hardest: 8-10 points under the whole set, where their
    first 1,000 were within 5)."""
    script = _record_script()
    assert sorted(script.key_of(p) for p in script.evaluated_checkpoints()) == sorted(EVALUATED_IDS)
    rec = subset_record["checkpoints"]
    assert sorted(rec) == sorted(EVALUATED_IDS), f"the record lists other checkpoints: rerun `{RECORD_SCRIPT}`"
    assert subset_record["subset"] == "first" and subset_record["split"] == "test"
    within = 4 * 100 * math.sqrt(0.25 / subset_record["count"])
    for key, path in zip(EVALUATED_IDS, EVALUATED):
        r = rec[key]
        assert r["weights_sha256"] == script.weights_sha256(path), \
            f"{key}: its weights changed since the record was written: rerun `{RECORD_SCRIPT}`"
        assert r["top1"] == round(100.0 * r["correct"] / subset_record["count"], 2)
        assert len(r["predicted"]) == subset_record["count"] and r["predicted"].isdigit()
        full = json.loads(path.with_suffix(".json").read_text())["metrics"]["test"]["top1"]
        assert abs(r["top1"] - full) <= within, (key, r["top1"], full)


@pytest.fixture(scope="module")
def cifar10_subset(cifar10_dir, subset_record):
    """The recorded subset (the first `count` test images), checked to be the recorded pixels."""
    from vitpe_core.data import load_cifar
    from vitpe_core.evaluate import first_images
    sub = first_images(load_cifar("cifar10", cifar10_dir, "test", verify="strict"), subset_record["count"])
    digests = _record_script().subset_sha256(sub)
    assert digests == {k: subset_record[k] for k in digests}, "not the recorded subset's images or labels"
    return sub


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.parametrize("path", EVALUATED, ids=EVALUATED_IDS)
def test_each_checkpoint_classifies_the_recorded_subset_exactly(path, cifar10_subset, subset_record):
    """The recorded class for every image of the subset (so the same top-1 count): float32 on the
    CPU, `vitpe_core evaluate`'s batch size."""
    from vitpe_core.evaluate import top1_predictions
    key = path.relative_to(REPO / "checkpoints").with_suffix("").as_posix()
    rec = subset_record["checkpoints"][key]
    predicted, gap = top1_predictions(load_checkpoint(path).model, cifar10_subset, "cifar10",
                                      batch_size=subset_record["batch_size"], device="cpu")
    got = _record_script().digits(predicted)
    changed = [i for i, (a, b) in enumerate(zip(got, rec["predicted"])) if a != b]
    correct = int((predicted == cifar10_subset.labels).sum())
    assert not changed and correct == rec["correct"], (
        f"{key}: {len(changed)} of {len(cifar10_subset)} predictions differ from the record (images {changed[:10]}); "
        f"{correct} right, {rec['correct']} recorded (closest call when recorded: a logit gap of "
        f"{rec['min_logit_gap']:.1e}; now {gap:.1e}): the forward pass computes something else than when "
        f"`{RECORD_SCRIPT}` wrote the record (rerun it if that change is intended)")


@pytest.mark.release
@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.parametrize("path", EVALUATED, ids=EVALUATED_IDS)
def test_evaluate_reproduces_the_recorded_top1(path, cifar10_dir):
    """The whole test set through the command line, as a user would check a checkpoint."""
    out = subprocess.run([sys.executable, "-m", "vitpe_core", "evaluate", str(path),
                          "--data-dir", str(cifar10_dir)], cwd=REPO, check=True, capture_output=True, text=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    recorded = json.loads(path.with_suffix(".json").read_text())["metrics"]["test"]
    assert abs(measured["top1"] - recorded["top1"]) <= 0.2, (path.name, measured, recorded)


def test_readme_table_is_what_the_checkpoints_say():
    from vitpe_core.report import MARKERS, results_table
    text = (REPO / "README.md").read_text()
    block = text[text.index(MARKERS[0]) + len(MARKERS[0]):text.index(MARKERS[1])]
    assert block.strip() == results_table(REPO / "checkpoints").strip(), \
        "README.md's results table is stale: run `python -m vitpe_core table --readme README.md`"


SEED_RERUNS = sorted((REPO / "checkpoints" / "seeds").glob("*.json"))
LONG_RUNS = sorted((REPO / "checkpoints" / "long").glob("*.json"))


@pytest.mark.parametrize("path", LONG_RUNS, ids=[p.stem for p in LONG_RUNS])
def test_long_runs_change_only_the_epochs(path):
    """checkpoints/long/NAME: the shipped row's recipe with 50 epochs instead of 15 (issue #14)."""
    m = json.loads(path.read_text())["metrics"]
    row = _metrics(m["recipe"]["encoding"])
    but = lambda recipe: {k: v for k, v in recipe.items() if k != "epochs"}
    assert but(m["recipe"]) == but(row["recipe"]) and m["recipe"]["epochs"] == 50 == len(m["curves"]["test_top1"])
    assert (path.with_suffix(".safetensors")).is_file() and len(m["git_commit"]) == 40


@pytest.mark.parametrize("path", SEED_RERUNS, ids=[p.stem for p in SEED_RERUNS])
def test_seed_reruns_change_only_the_seed(path):
    m = json.loads(path.read_text())["metrics"]
    row = _metrics(m["recipe"]["encoding"])
    assert m["recipe"]["seed"] != row["recipe"]["seed"]
    but_seed = lambda recipe: {k: v for k, v in recipe.items() if k != "seed"}
    assert but_seed(m["recipe"]) == but_seed(row["recipe"])
    assert (path.with_suffix(".safetensors")).is_file() and len(m["git_commit"]) == 40


LISTED = SHIPPED + [f"long/{n}" for n in list_checkpoints(REPO / "checkpoints" / "long")]   # what the app lists


@pytest.mark.parametrize("name", LISTED)
def test_the_shipped_position_analysis_is_current(name):
    """checkpoints/NAME.analysis.npz (the compare page's position section, for every checkpoint the
    app lists) matches the checkpoint; after retraining, `python -m vitpe_core analyze
    checkpoints/NAME.safetensors` rewrites it."""
    from vitpe_core.positional import read_cache
    arrays = read_cache(REPO / "checkpoints" / f"{name}.safetensors")
    assert arrays is not None and {"kind", "offset_kernel", "relative_score", "mean_distance"} <= set(arrays)


@pytest.mark.parametrize("name", LISTED)
def test_the_shipped_first_image_trace_is_current_and_the_models_own(name):
    """checkpoints/NAME.trace.npz (the app's first page of the checkpoint, drawn without the model
    or torch: vitpe_core/stored_trace.py) is stamped for this checkpoint and its first gallery
    image, and holds what the model computes for that image now (the page's trace, bit for bit
    where this machine's float arithmetic is the one that wrote it); `python -m vitpe_core analyze
    checkpoints/NAME.safetensors` rewrites it."""
    import numpy as np

    from vitpe_core.stored_trace import read_trace, trace_first_image
    path = REPO / "checkpoints" / f"{name}.safetensors"
    image, fresh = trace_first_image(load_checkpoint(path))
    stored = read_trace(path, image)
    assert stored is not None, f"{name}: no current stored trace; run python -m vitpe_core analyze {path}"
    assert (stored.grid, stored.num_prefix, stored.prefix, stored.hooks, stored.bias_sources) == (
        fresh.grid, fresh.num_prefix, fresh.prefix, fresh.hooks, fresh.bias_sources)
    assert set(stored.parts) == set(fresh.parts) and (stored.bias is None) == (fresh.bias is None)
    for a, b in [(stored.logits, fresh.logits), (stored.attn, fresh.attn), (stored.bias, fresh.bias),
                 *((stored.parts[k], fresh.parts[k]) for k in fresh.parts)]:
        if a is not None:
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)   # another CPU's rounding, not another model
