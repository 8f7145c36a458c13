"""`python -m vitpe_core`: the train flags are generated from TrainConfig and parse back to it."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vitpe_core.__main__ import _train_config, build_parser
from vitpe_core.train import AUGMENTS, SCHEDULES, TrainConfig

# The flags scripts, the README and the tests spell out: generating them must not rename one.
CONFIG_FLAGS = ("--encoding", "--dataset", "--preset", "--option", "--epochs", "--batch-size", "--lr", "--min-lr-ratio",
                "--weight-decay", "--schedule", "--warmup", "--label-smoothing", "--augment", "--grad-clip", "--seed",
                "--train-subset", "--test-subset", "--eval-batch-size")
RUN_FLAGS = ("--data-dir", "--download", "--out", "--checkpoint", "--resume", "--device", "--threads", "--save-every",
             "--compile", "--precision", "--no-progress")


def _train_parser():
    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    return sub.choices["train"]


def _flag(name: str) -> str:
    return "--option" if name == "encoding_options" else "--" + name.replace("_", "-")


def _argv(cfg: TrainConfig) -> list[str]:
    argv = ["train"]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "encoding_options":
            for key, v in value.items():
                argv += ["--option", f"{key}={v}"]
        elif value is not None:
            argv += [_flag(f.name), str(value)]
    return argv


def test_every_config_field_has_its_flag():
    actions = {a.dest: a for a in _train_parser()._actions}
    flags = {s for a in _train_parser()._actions for s in a.option_strings} - {"-h", "--help"}
    assert flags == set(CONFIG_FLAGS + RUN_FLAGS)
    for f in dataclasses.fields(TrainConfig):
        assert _flag(f.name) in actions[f.name].option_strings, f.name
    assert actions["schedule"].choices == SCHEDULES and actions["augment"].choices == AUGMENTS
    assert actions["dataset"].choices == ("cifar10", "cifar100") and "compact" in actions["preset"].choices
    assert actions["batch_size"].type is int and actions["train_subset"].type is int and actions["lr"].type is float


def test_defaults_parse_to_the_default_config_and_help_shows_them(capsys):
    assert _train_config(build_parser().parse_args(["train"])) == TrainConfig()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for text in ("default 128", "default 0.001", "default onecycle", "default cropflip", "default None",
                 "--option KEY=VALUE"):
        assert text in help_text, text


OTHER = TrainConfig(encoding="sape2+ape", dataset="cifar100", preset="tiny",
                    encoding_options={"readout": "key", "npos_max": 10}, epochs=3, batch_size=64, lr=2.5e-4,
                    min_lr_ratio=0.01, weight_decay=0.1, schedule="cosine", warmup=2.0, label_smoothing=0.0,
                    augment="deit", grad_clip=0.0, seed=7, train_subset=100, test_subset=50, eval_batch_size=32)


@pytest.mark.parametrize("cfg", [TrainConfig(), OTHER])
def test_flags_round_trip_to_the_same_config(cfg):
    assert _train_config(build_parser().parse_args(_argv(cfg))) == cfg


def test_the_round_trip_changes_every_field():
    assert all(getattr(OTHER, f.name) != getattr(TrainConfig(), f.name) for f in dataclasses.fields(TrainConfig))


def test_option_values_are_json_or_text_and_need_an_equals_sign(capsys):
    args = build_parser().parse_args(["train", "--option", "a=1", "--option", "b=[1, 2]", "--option", "c=key",
                                      "--option", "a=true"])
    assert _train_config(args).encoding_options == {"a": True, "b": [1, 2], "c": "key"}   # the last a wins
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--option", "readout"])
    assert "expected KEY=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--schedule", "linear"])


def test_every_command_is_in_the_module_docstring():
    import vitpe_core.__main__ as cli
    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    assert set(sub.choices) == {"train", "evaluate", "table", "structure", "import", "analyze", "scale", "report",
                                "kernel"}
    for name in sub.choices:
        assert f"\n  {name} " in cli.__doc__, name


def test_kernel_loads_the_cached_build_and_says_where(monkeypatch, capsys):
    """`python -m vitpe_core kernel` (the Dockerfile runs it at image build time): builds the fused
    kernel into the extension cache if it is not there (a fresh cache: tests/test_browser_coldstart.py),
    then a second run finds it there and only loads it; exit 1 when it is disabled."""
    import shutil

    from vitpe_core.__main__ import main
    if shutil.which("g++") is None or os.environ.get("VITPE_NO_CPP", "") not in ("", "0"):
        pytest.skip("no C++ compiler, or the kernel is disabled (VITPE_NO_CPP)")
    runs = [subprocess.run([sys.executable, "-m", "vitpe_core", "kernel"], capture_output=True, text=True, timeout=900)
            for _ in range(2)]
    first, second = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert [r.returncode for r in runs] == [0, 0] and first["available"], runs[0].stderr[-2000:]
    assert second["was_cached"] and second["folder"] == first["folder"] and second["name"] == first["name"]
    assert any(f.suffix == ".so" for f in Path(second["folder"]).iterdir())
    monkeypatch.setenv("VITPE_NO_CPP", "1")
    assert main(["kernel"]) == 1 and json.loads(capsys.readouterr().out)["disabled"] is True


def test_import_takes_a_labels_file():
    """`import --labels FILE` (issue 31): one name per line or config.json's id2label; the help says so."""
    sub = next(a for a in build_parser()._actions if a.dest == "cmd").choices["import"]
    args = build_parser().parse_args(["import", "w.npz", "--out", "o.safetensors", "--labels", "names.txt"])
    assert args.labels == "names.txt"
    assert build_parser().parse_args(["import", "w.npz", "--out", "o.safetensors"]).labels is None
    help_text = " ".join(sub.format_help().split())
    assert "one name per line" in help_text and "id2label" in help_text
