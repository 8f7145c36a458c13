"""The models in checkpoints/ are what the README's results table reports: every one carries
the metrics issue #3 lists, all share one recipe, and (slow, needs ../shared for CIFAR-10)
`evaluate` reproduces each recorded top-1 within 0.2 points from the fp16 weights."""
from __future__ import annotations

import json
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


@pytest.fixture(scope="module")
def cifar10_dir(shared_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cifar") / "cifar-10-batches-py"
    subprocess.run([sys.executable, str(shared_dir / "tools" / "cifar_export.py"),
                    str(shared_dir / "data" / "cifar10_webp.npz"), "--pickle-dir", str(out)],
                   check=True, capture_output=True)
    return out.parent


# The shipped rows, then the study's reruns: second seeds (checkpoints/seeds) and 50-epoch runs (checkpoints/long).
STUDY = sorted((REPO / "checkpoints" / "seeds").glob("*.safetensors")) + sorted(
    (REPO / "checkpoints" / "long").glob("*.safetensors"))
EVALUATED = [REPO / "checkpoints" / f"{n}.safetensors" for n in SHIPPED] + STUDY


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.parametrize("path", EVALUATED, ids=[str(p.relative_to(REPO / "checkpoints")) for p in EVALUATED])
def test_evaluate_reproduces_the_recorded_top1(path, cifar10_dir):
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
