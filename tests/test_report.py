"""The budget-study table (report.budget_table) from checkpoint JSONs, on made-up folders."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from vitpe_core.report import BUDGET_MARKERS, block, budget_table, update_readme

REPO = Path(__file__).resolve().parents[1]


def _write(folder: Path, name: str, enc: str, top1: float, *, seed=0, epochs=15, curves=None, spearman=None):
    folder.mkdir(parents=True, exist_ok=True)
    recipe = {"encoding": enc, "preset": "compact", "epochs": epochs, "seed": seed, "lr": 1e-3}
    metrics = {"test": {"top1": top1}, "recipe": recipe, "curves": curves or {}}
    if spearman is not None:
        metrics["structure"] = {"spearman": spearman}
    (folder / f"{name}.json").write_text(json.dumps({"config": {}, "metrics": metrics}))


def test_budget_table_reads_both_budgets_and_both_seeds(tmp_path):
    for enc, t in (("none", 60.0), ("ape", 70.0), ("sape2", 61.0), ("sape2+ape", 69.0)):
        _write(tmp_path, enc, enc, t, spearman=0.5 if enc in ("ape", "sape2+ape") else None)
    _write(tmp_path / "seeds", "none-seed1", "none", 62.0, seed=1)
    _write(tmp_path / "seeds", "sape2-seed1", "sape2", 63.0, seed=1,
           curves={"enc_bias_ratio_L0": [0.1, 0.2], "enc_bias_ratio_L1": [0.3, 0.4]})
    _write(tmp_path / "long", "sape2", "sape2", 75.0, epochs=50, curves={"enc_bias_ratio_L0": [0.9]})
    _write(tmp_path / "long", "none", "none", 71.5, epochs=50)
    _write(tmp_path / "long", "ape", "ape", 80.0, epochs=50, spearman=0.7)
    table = budget_table(tmp_path)
    assert "| `sape2` | 61.00 | 63.00 | 75.00 | — → — | 0.300 → 0.900 |" in table
    assert "| `ape` | 70.00 | — | 80.00 | 0.50 → 0.70 | — → — |" in table
    # sape2 - none: +1.00 at 15 (seed 0), means 62.0 - 61.0 = +1.00, +3.50 at 50
    assert "SaPE² − no encoding: +1.00 points at 15 epochs (seed 0), +1.00 between" in table
    assert "+3.50 at 50 epochs" in table
    assert "SaPE² − a learned table (APE): -9.00 points" in table and "-5.00 at 50 epochs" in table
    assert "`none` 2.00" in table and "`sape2` 2.00" in table
    assert "Not finished yet (2): `seed1:ape`, `long:sape2+ape`" in table


def test_budget_table_follows_the_gap_along_the_long_runs(tmp_path):
    for enc in ("none", "ape", "sape2"):
        _write(tmp_path, enc, enc, 60.0)
    up = [40.0 + e for e in range(10)]                                  # none: 40 .. 49
    _write(tmp_path / "long", "none", "none", 49.0, epochs=10, curves={"test_top1": up})
    _write(tmp_path / "long", "sape2", "sape2", 50.0, epochs=10,
           curves={"test_top1": [v + (0.5 * e - 1.0) for e, v in enumerate(up)]})   # -1.0 .. +3.5
    table = budget_table(tmp_path)
    assert ("SaPE² − `none`: -0.50 at epoch 2, +0.50 at epoch 4, +1.50 at epoch 6, +2.50 at epoch 8, "
            "+3.50 at epoch 10; ahead after 7 of 10 epochs.") in table
    assert "SaPE² − `ape`:" not in table                                 # no long ape run: no line
    _write(tmp_path / "long", "sape2+ape", "sape2+ape", 52.0, epochs=10, curves={"test_top1": [v + 2 for v in up]})
    _write(tmp_path, "sape2+ape", "sape2+ape", 60.0)
    table = budget_table(tmp_path)
    assert "SaPE²+APE − `sape2`: +2.50 at epoch 2, +1.50 at epoch 4, +0.50 at epoch 6" in table
    assert "SaPE²+APE − `ape`:" not in table


def test_budget_table_leaves_out_runs_with_another_recipe(tmp_path):
    _write(tmp_path, "none", "none", 60.0)
    _write(tmp_path / "long", "none", "none", 90.0, epochs=50)
    (tmp_path / "long" / "none.json").write_text(
        (tmp_path / "long" / "none.json").read_text().replace('"lr": 0.001', '"lr": 0.01'))
    assert "90.00" not in budget_table(tmp_path)


def test_update_readme_fills_the_budget_block(tmp_path):
    _write(tmp_path, "sape2", "sape2", 61.0)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{BUDGET_MARKERS[0]}\nold\n{BUDGET_MARKERS[1]}\nrest\n")
    update_readme(readme, tmp_path)
    text = readme.read_text()
    assert "old" not in text and "| `sape2` | 61.00 |" in text and text.endswith("rest\n")


def test_readme_budget_table_is_what_the_checkpoints_say():
    """The shipped results; the progress of unfinished runs (read from runs/, which a training run
    in the background advances every epoch) is left out of the comparison."""
    import re
    text = (REPO / "README.md").read_text()
    unprogressed = lambda t: re.sub(r" \((\d+ of \d+ epochs done|unreadable state: \w+)\)", "", t.strip())
    assert unprogressed(block(text, BUDGET_MARKERS)) == unprogressed(budget_table(REPO / "checkpoints")), \
        "README.md's budget table is stale: run `python -m vitpe_core table --readme README.md`"


def test_scale_cli_measures_what_training_records(tmp_path):
    """`python -m vitpe_core scale` is the last epoch's `enc_bias_ratio_L*` of a fresh run, and
    refuses an encoding without a bias."""
    from test_data import write_tiny_cifar10
    from vitpe_core.__main__ import main
    from vitpe_core.checkpoint import load_checkpoint
    from vitpe_core.train import TrainConfig, train
    write_tiny_cifar10(tmp_path / "data", per_batch=4, n_test=6)
    ck = tmp_path / "ck" / "m.safetensors"
    train(TrainConfig(encoding="sape2", preset="tiny", epochs=1, batch_size=8, eval_batch_size=4, seed=3),
          data_dir=tmp_path / "data", out=tmp_path / "run", checkpoint=ck, progress=False)
    recorded = [c[-1] for k, c in load_checkpoint(ck).metrics["curves"].items() if k.startswith("enc_bias_ratio_L")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["scale", str(ck), "--data-dir", str(tmp_path / "data")]) == 0
    line = json.loads(out.getvalue())
    assert line["bias_ratio_per_layer"] == pytest.approx(recorded, rel=1e-3) and len(recorded) == 2
    assert line["checkpoint"] == str(ck)      # the path as given: long/sape2 and sape2 stay apart
    ape = tmp_path / "ck" / "a.safetensors"
    train(TrainConfig(encoding="ape", preset="tiny", epochs=1, batch_size=8, eval_batch_size=4, seed=3),
          data_dir=tmp_path / "data", out=tmp_path / "run_a", checkpoint=ape, progress=False)
    assert main(["scale", str(ape), "--data-dir", str(tmp_path / "data")]) == 2


def test_readme_functional_example_runs():
    """The README's "functional cores" snippet runs as printed (and its attention is the bias's)."""
    import torch
    text = (REPO / "README.md").read_text()
    code = text[text.index("The functional cores work without a model"):].split("```python\n", 1)[1].split("```")[0]
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    q, k, v, e_x, e_y = (scope[n] for n in ("q", "k", "v", "e_x", "e_y"))
    bias = scope["bias"]
    ref = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + bias, dim=-1) @ v
    from vitpe_core.encodings.functional import sape2_attention
    assert torch.allclose(sape2_attention(q, k, v, e_x, e_y, (6, 5)), ref, atol=1e-5)


def test_budget_table_shows_the_progress_of_unfinished_runs(tmp_path):
    """A study run not shipped yet, with a resumable state in runs/, is listed with its epochs done;
    an unreadable state is named, not fatal."""
    import torch
    _write(tmp_path / "checkpoints", "sape2", "sape2", 61.0)
    state = tmp_path / "runs" / "long" / "sape2" / "state.pt"
    state.parent.mkdir(parents=True)
    torch.save({"train_config": {"epochs": 50}, "curves": {"epoch": [1, 2, 3], "test_top1": [30.0, 40.0, 45.0]}},
               state)
    broken = tmp_path / "runs" / "seeds" / "none-seed1" / "state.pt"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not a torch file")
    table = budget_table(tmp_path / "checkpoints")
    assert "`long:sape2` (3 of 50 epochs done)" in table
    assert "`seed1:none` (unreadable state: " in table and "`long:none`," in table


def test_study_run_folders_are_the_scripts():
    """report.STUDY_RUNS names the folders scripts/train_study.sh trains into."""
    from vitpe_core.report import STUDY_RUNS
    script = (REPO / "scripts" / "train_study.sh").read_text()
    for kind, folder in STUDY_RUNS.items():
        assert f"{kind})" in script and f"out=runs/{folder.format('$enc')};" in script, (kind, folder)
