"""Training CLI on a tiny dataset in the standard layout: a short run, exact resume, evaluation."""
from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

from test_data import write_tiny_cifar10
from vitpe_core import checkpoint as C
from vitpe_core.__main__ import main
from vitpe_core.train import TrainConfig, load_state, lr_at, train


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cifar")
    write_tiny_cifar10(root, per_batch=4, n_test=6)  # 20 train images, 6 test
    return root


def cfg(**kw) -> TrainConfig:
    base = dict(encoding="sape2+ape", preset="tiny", epochs=1, batch_size=8, eval_batch_size=4, seed=3)
    return TrainConfig(**{**base, **kw})


def test_two_step_run_writes_a_loadable_checkpoint_with_metrics(data_dir, tmp_path):
    metrics = train(cfg(), data_dir=data_dir, out=tmp_path / "run", checkpoint=tmp_path / "ck" / "m.safetensors",
                    progress=False)
    assert metrics["steps"] == 2 and metrics["epochs"] == 1
    assert set(metrics["resolution"]) == {"24", "32", "40", "48"}
    assert {"half_x", "whole_x", "whole_xy"} <= set(metrics["translation"])
    assert "bias_shift_error" in metrics["translation"]["whole_x"]
    assert "structure" in metrics and "git_commit" in metrics
    ck = C.load_checkpoint(tmp_path / "ck" / "m.safetensors")
    assert sorted(ck.history) == [0, 1] and ck.metrics["test"] == metrics["test"]
    assert json.loads((tmp_path / "ck" / "m.json").read_text())["metrics"]["steps"] == 2
    state = load_state(tmp_path / "run" / "state.pt")   # weights_only=True
    assert state["step"] == 2
    curves = metrics["curves"]                 # the SaPE² bias against the logits, per epoch and layer
    assert {"enc_bias_ratio_L0", "enc_bias_ratio_L1", "enc_ex_norm_L0", "enc_ey_norm_L1"} <= set(curves)
    assert all(len(v) == len(curves["epoch"]) for v in curves.values())
    table = ck.model.pos_enc.parts[0].sape_x[0].detach()
    assert curves["enc_ex_norm_L0"][0] == pytest.approx(float(table.norm()), rel=1e-2)


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    return C.load_checkpoint(out / "final.safetensors", dtype=torch.float32).model.state_dict()


@pytest.mark.parametrize("augment, precision", [("cropflip", "auto"), ("mixup", "auto"), ("deit", "auto"),
                                               ("cropflip", "fp16")])   # fp16: its loss scale is resumed too
def test_interrupted_run_resumes_to_the_same_result(data_dir, tmp_path, augment, precision):
    c = cfg(epochs=2, augment=augment, encoding="rope_mixed+ape")
    kw = dict(data_dir=data_dir, progress=False, full_eval=False, precision=precision)
    whole = train(c, out=tmp_path / "a", **kw)
    # interrupt mid-epoch, then at an epoch boundary, then finish
    assert train(c, out=tmp_path / "b", stop_after_steps=1, **kw) == {"stopped_at_step": 1}
    assert train(c, out=tmp_path / "b", resume=True, stop_after_steps=2, **kw) == {"stopped_at_step": 2}
    # fp16's loss scale and its growth count are part of the state (a resume goes on with them)
    assert ("scaler" in load_state(tmp_path / "b" / "state.pt")) == (precision == "fp16")
    resumed = train(c, out=tmp_path / "b", resume=True, **kw)
    wa, wb = _final_weights(tmp_path / "a"), _final_weights(tmp_path / "b")
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert whole["curves"]["train_loss"] == resumed["curves"]["train_loss"]
    assert whole["test"] == resumed["test"]
    assert [st["step"] for st in resumed["starts"]] == [0, 1, 2]           # each (re)start is recorded
    assert {st["compiled"] for st in resumed["starts"]} == {False} and whole["starts"][0]["step"] == 0
    assert all(st["commit"] == resumed["git_commit"] and "cpu" in st["device"] for st in resumed["starts"])


def test_a_state_from_before_starts_were_recorded_still_resumes(data_dir, tmp_path):
    c = cfg(epochs=2)
    train(c, data_dir=data_dir, out=tmp_path, progress=False, stop_after_steps=1, full_eval=False)
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    del state["starts"]
    torch.save(state, tmp_path / "state.pt")
    metrics = train(c, data_dir=data_dir, out=tmp_path, progress=False, resume=True, full_eval=False)
    assert "not recorded" in metrics["starts"][0]["note"] and metrics["starts"][1]["step"] == 1


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="torch.compile's CPU backend needs a C++ compiler (g++)")
def test_compiled_training_follows_the_eager_run(data_dir, tmp_path, monkeypatch):
    """`--compile`: same steps, same checkpoint layout (no `_orig_mod.` keys), weights equal to
    the eager run's up to kernel rounding. One step (a batch of 16 of the 20 images): compiling
    the forward and backward graphs is the cost, and one step runs both. Where the fused C++
    kernel is built, the compiled step runs it (as custom ops, `encodings/compiled_ops.py`)."""
    from types import SimpleNamespace

    from vitpe_core.encodings import _kernels, compiled_ops
    c = cfg(encoding="sape2+ape", batch_size=16)
    eager = train(c, data_dir=data_dir, out=tmp_path / "eager", progress=False, full_eval=False)
    calls = []
    if _kernels.available():
        real = _kernels.kernels()
        counting = SimpleNamespace(sape2_attend_fwd=real.sape2_attend_fwd,
                                   sape2_attend_bwd=lambda *a: calls.append("bwd") or real.sape2_attend_bwd(*a))
        monkeypatch.setattr(compiled_ops, "_kernels", SimpleNamespace(kernels=lambda: counting))
    compiled = train(c, data_dir=data_dir, out=tmp_path / "compiled", progress=False, full_eval=False,
                     compile_model=True)
    from vitpe_core.config import PRESETS
    assert len(calls) == (PRESETS[c.preset]["depth"] if _kernels.available() else 0)   # a fused backward per layer
    assert compiled["steps"] == eager["steps"] == 1
    assert compiled["starts"][0]["compiled"] and not eager["starts"][0]["compiled"]
    we, wc = _final_weights(tmp_path / "eager"), _final_weights(tmp_path / "compiled")
    assert we.keys() == wc.keys()
    for k in we:
        torch.testing.assert_close(wc[k], we[k], atol=1e-4, rtol=1e-3, msg=k)
    assert abs(compiled["test"]["top1"] - eager["test"]["top1"]) <= 100 / 6 + 1e-6  # at most one of 6 flips


def test_resume_with_another_config_is_refused(data_dir, tmp_path):
    train(cfg(), data_dir=data_dir, out=tmp_path / "r", progress=False, stop_after_steps=1, full_eval=False)
    with pytest.raises(ValueError, match="another configuration"):
        train(cfg(lr=0.5), data_dir=data_dir, out=tmp_path / "r", resume=True, progress=False)


def test_lr_schedule_warms_up_then_decays():
    c = TrainConfig(lr=1e-3, warmup=0.2, epochs=10)
    lrs = [lr_at(s, 100, 10, c) for s in range(100)]
    assert lrs[0] < lrs[10] < lrs[19] and max(lrs) == pytest.approx(1e-3, rel=1e-6)
    assert lrs[-1] < 2e-5 and all(a >= b for a, b in zip(lrs[20:], lrs[21:]))


def test_evaluate_cli_reproduces_recorded_accuracy(data_dir, tmp_path, capsys):
    ck = tmp_path / "e.safetensors"
    metrics = train(cfg(encoding="rpb"), data_dir=data_dir, out=tmp_path / "run", checkpoint=ck, progress=False)
    capsys.readouterr()
    assert main(["evaluate", str(ck), "--data-dir", str(data_dir), "--sizes", "24,40", "--device", "cpu"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert abs(line["top1"] - metrics["test"]["top1"]) <= 0.2 + 1e-9
    assert set(line["resolution"]) == {"24", "40"}


def test_cli_reports_user_errors_without_traceback(tmp_path, capsys):
    assert main(["train", "--encoding", "sape3", "--data-dir", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert "valid" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "missing.safetensors")]) == 2
    assert main(["table", "--dir", str(tmp_path / "nowhere")]) == 2
    assert "no checkpoint folder" in capsys.readouterr().err


def test_evaluate_checks_sizes_before_reading_the_test_set(tmp_path, capsys):
    from vitpe_core import build_model
    ck = C.save_checkpoint(tmp_path / "m.safetensors", build_model(cfg().model_config(10)))
    empty = tmp_path / "no-data"                       # any evaluation would fail on the missing data
    with pytest.raises(SystemExit):                    # argparse: not numbers
        main(["evaluate", str(ck), "--data-dir", str(empty), "--sizes", "abc"])
    assert "expected positive pixel sizes" in capsys.readouterr().err
    for sizes in ("30", "24,4096"):
        assert main(["evaluate", str(ck), "--data-dir", str(empty), "--sizes", sizes]) == 2
        err = capsys.readouterr().err
        assert "multiple of the patch size" in err and "CIFAR" not in err, err


def test_atomic_write_leaves_old_file_when_interrupted(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    def crash(*a, **k):
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        C.atomic_write_bytes(target, b"new" * 1000)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.bin"]


@pytest.mark.slow
def test_torchrun_two_processes_follow_the_single_process_run(data_dir, tmp_path):
    """DistributedDataParallel on CPU with gloo: 2 processes x half batches == 1 process."""
    import subprocess
    import sys
    c = cfg(encoding="sape2+ape", epochs=1, batch_size=8)
    single = train(c, data_dir=data_dir, out=tmp_path / "one", progress=False, full_eval=False)
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(port),
            "-m", "vitpe_core", "train", "--encoding", c.encoding, "--preset", c.preset, "--epochs", "1",
            "--batch-size", "8", "--seed", str(c.seed), "--data-dir", str(data_dir), "--out", str(tmp_path / "two"),
            "--device", "cpu", "--eval-batch-size", "4", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    w1, w2 = _final_weights(tmp_path / "one"), _final_weights(tmp_path / "two")
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=2e-3, rtol=2e-3)   # fp16 storage
    assert single["steps"] == 2


def test_results_table_comes_from_the_checkpoints(data_dir, tmp_path):
    from vitpe_core.report import results_table, update_readme
    ck = tmp_path / "ck"
    m = train(cfg(encoding="sape2"), data_dir=data_dir, out=tmp_path / "run", checkpoint=ck / "sape2.safetensors",
              progress=False)
    table = results_table(ck)
    row = [line for line in table.splitlines() if line.startswith("| `sape2`")][0]
    assert f"{m['test']['top1']:.2f}" in row and "93.98" in table      # ours, and theirs labelled
    assert "Not trained yet (9 of 10)" in table and "`ape`" in table.split("Not trained yet")[1]
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:start -->\nold\n<!-- results:end -->\nrest\n")
    update_readme(readme, ck)
    text = readme.read_text()
    assert "old" not in text and row in text and text.startswith("intro") and text.endswith("rest\n")


def test_results_table_says_whether_rows_share_a_recipe_and_when_all_are_trained(tmp_path):
    from vitpe_core.report import ORDER, results_table
    recipe = {"preset": "compact", "dataset": "cifar10", "epochs": 15, "batch_size": 128, "seed": 0}
    for i, name in enumerate(ORDER):
        metrics = {"recipe": {**recipe, "encoding": name}, "test": {"top1": 50.0 + i, "top5": 90.0},
                   "wall_time_s": 1800}
        (tmp_path / f"{name}.json").write_text(json.dumps({"config": {}, "metrics": metrics}))
    table = results_table(tmp_path)
    assert "One recipe for every row" in table and "epochs 15" in table
    assert f"All {len(ORDER)} trained: {len(ORDER) * 0.5:.1f} hours" in table and "Not trained yet" not in table
    compute = [line for line in table.splitlines() if line.startswith("Compute:")][0]
    assert "with 15 epochs against their 400" in compute
    flops_ratio = float(compute.split("(")[2].split("×")[0])              # ViT-S / compact FLOPs per image
    assert 20 < flops_ratio < 35 and f"about 1/{flops_ratio * 400 / 15:.0f} of" in compute

    (tmp_path / "seeds").mkdir()
    rerun = {"recipe": {**recipe, "encoding": "ape", "seed": 1}, "test": {"top1": 49.25, "top5": 90.0}}
    longer = {"recipe": {**recipe, "encoding": "rpb", "seed": 1, "epochs": 30}, "test": {"top1": 70.0}}
    (tmp_path / "seeds" / "ape-seed1.json").write_text(json.dumps({"metrics": rerun}))
    (tmp_path / "seeds" / "rpb-seed1.json").write_text(json.dumps({"metrics": longer}))   # not only the seed
    table = results_table(tmp_path)
    assert "`ape` seed 0: 50.00, seed 1: 49.25 (spread 0.75 points)" in table and "`rpb` seed" not in table

    odd = json.loads((tmp_path / "rpb.json").read_text())
    odd["metrics"]["recipe"]["epochs"] = 30
    (tmp_path / "rpb.json").write_text(json.dumps(odd))
    table = results_table(tmp_path)
    assert "Rows differ in recipe (epochs)" in table and "`rpb`: epochs 30" in table
    assert "One recipe" not in table and "Compute:" not in table        # no single budget to compare


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed; git_commit() then records 'unknown'")
def test_git_commit_marks_changed_code_dirty_but_not_rewritten_runs_or_checkpoints(tmp_path):
    import subprocess

    from vitpe_core.train import git_commit

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    for rel in ("code.py", "runs/ape/state.pt", "checkpoints/ape.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("v1\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                         text=True).stdout.strip()

    assert git_commit(tmp_path) == sha
    (tmp_path / "runs/ape/state.pt").write_text("v2\n")          # training rewrote its own state
    (tmp_path / "checkpoints/ape.json").write_text("v2\n")       # and its checkpoint
    (tmp_path / "notes.txt").write_text("untracked\n")           # untracked files are not code
    assert git_commit(tmp_path) == sha
    (tmp_path / "code.py").write_text("v2\n")
    assert git_commit(tmp_path) == sha + "+dirty"
    assert git_commit(tmp_path / "no-such-dir") == "unknown"


def test_train_checkpoints_script_skips_finished_ones_and_takes_names(tmp_path):
    import subprocess
    import sys

    from vitpe_core.report import ORDER
    repo = Path(__file__).resolve().parents[1]
    for name in ORDER + ["extra"]:
        (tmp_path / f"{name}.safetensors").write_bytes(b"")       # present: nothing may be trained
    env = {**os.environ, "CHECKPOINT_DIR": str(tmp_path), "PYTHON": sys.executable}   # venv need not be active

    def run(*args):
        out = subprocess.run(["bash", str(repo / "scripts" / "train_checkpoints.sh"), *args], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    assert run("data", "15") == [f"== {name}: done" for name in ORDER]            # the shipped set, in order
    assert run("data", "15", "rpb", "extra") == ["== rpb: done", "== extra: done"]


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["sape2", "sape2+ape", "cope+ape"])
def test_mixed_precision_training_tracks_the_float32_run(data_dir, tmp_path, encoding):
    """`--precision bf16` / `fp16` (autocast; fp16 with a loss scale; bf16 is what a CUDA run does by
    default): each run trains, records its precision, and bf16's losses and weights follow the
    float32 run's within mixed-precision tolerance (bf16; CPU autocast here, CUDA's own dtype mix
    is tests/test_mixed_precision.py's)."""
    c = cfg(encoding=encoding, epochs=2)
    runs = {p: train(c, data_dir=data_dir, out=tmp_path / p, progress=False, full_eval=False, precision=p)
            for p in ("fp32", "bf16", "fp16")}
    for p, metrics in runs.items():
        assert [s["precision"] for s in metrics["starts"]] == [p]
        assert all(math.isfinite(v) for v in metrics["curves"]["train_loss"])
    # fp16's loss scale starts at 2^16 and skips the steps whose scaled gradients overflow (torch's
    # GradScaler): over these 4 steps it cannot follow step by step; bf16 needs no scale and does
    losses, ref = runs["bf16"]["curves"]["train_loss"], runs["fp32"]["curves"]["train_loss"]
    assert all(abs(a - b) < 0.02 * b for a, b in zip(losses, ref)), (losses, ref)
    # and the whole model: every weight together within 1 % of the float32 run's (per tensor, Adam's
    # first steps on zero-initialised biases are sign-like and move apart more)
    ref, w = _final_weights(tmp_path / "fp32"), _final_weights(tmp_path / "bf16")
    diff = sum(float((w[k] - ref[k]).square().sum()) for k in ref) ** 0.5
    assert diff < 0.01 * sum(float(ref[k].square().sum()) for k in ref) ** 0.5


def test_cli_refuses_an_unknown_precision(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--precision", "fp8"])
    assert "fp8" in capsys.readouterr().err
