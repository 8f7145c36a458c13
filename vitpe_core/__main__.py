"""Command line: `python -m vitpe_core {train,evaluate,table} ...` (see --help)."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

import torch


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive pixel sizes separated by commas, e.g. 24,32,40,48; "
                                         f"got {text!r}")
    return sizes


def _grid(text: str) -> tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        h = w = 0
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(f"expected rows x columns such as 12x16, got {text!r}")
    return h, w


def _parse_options(items: list[str]) -> dict:
    out = {}
    for it in items or []:
        key, sep, value = it.partition("=")
        if not sep:
            raise SystemExit(f"--option expects KEY=VALUE, got {it!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    from .train import AUGMENTS, SCHEDULES, TrainConfig
    from .config import PRESETS
    from .data import DATASETS

    p = argparse.ArgumentParser(prog="python -m vitpe_core", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train a ViT with one position encoding")
    t.add_argument("--encoding", default="ape", help="registry name, '+' composes (e.g. sape2+ape)")
    t.add_argument("--dataset", default="cifar10", choices=sorted(DATASETS))
    t.add_argument("--preset", default="compact", choices=sorted(PRESETS))
    t.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="encoding option, e.g. --option readout=key --option npos_max=10")
    defaults = TrainConfig()
    for name in ("epochs", "batch_size", "lr", "weight_decay", "warmup", "label_smoothing", "grad_clip", "seed",
                 "min_lr_ratio", "train_subset", "test_subset", "eval_batch_size"):
        default = getattr(defaults, name)
        kind = int if name in ("epochs", "batch_size", "seed", "train_subset", "test_subset", "eval_batch_size") else float
        t.add_argument("--" + name.replace("_", "-"), type=kind, default=default, help=f"default {default}")
    t.add_argument("--schedule", default=defaults.schedule, choices=SCHEDULES)
    t.add_argument("--augment", default=defaults.augment, choices=AUGMENTS,
                   help="cropflip: random crop (pad 4) + flip; mixup: + mixup/cutmix; randaug: + RandAugment "
                        "(timm rand-m9-mstd0.5-inc1); deit: + both (the SaPE² paper's recipe); none")
    t.add_argument("--data-dir", default="data", help="folder holding cifar-10-batches-py / cifar-100-python")
    t.add_argument("--download", action="store_true", help="fetch the dataset from the official site if missing")
    t.add_argument("--out", help="run folder (default runs/<encoding>)")
    t.add_argument("--checkpoint", help="also write the final model here, e.g. checkpoints/ape.safetensors")
    t.add_argument("--resume", action="store_true", help="continue from <out>/state.pt")
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--threads", type=int, help="torch.set_num_threads")
    t.add_argument("--save-every", type=int, default=100, help="steps between resume points")
    t.add_argument("--compile", action="store_true", help="torch.compile the model for training")
    t.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")

    e = sub.add_parser("evaluate", help="test accuracy of a checkpoint, as one JSON line")
    e.add_argument("checkpoint")
    e.add_argument("--data-dir", default="data")
    e.add_argument("--download", action="store_true")
    e.add_argument("--sizes", type=_sizes, help="comma-separated input sizes in pixels, e.g. 24,32,40,48 "
                                                "(multiples of the patch size, up to twice the training size)")
    e.add_argument("--translation", action="store_true", help="also run the translation test")
    e.add_argument("--record", action="store_true", help="write the results into the checkpoint's metrics")
    e.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")

    r = sub.add_parser("table", help="the README results table from checkpoints/*.json")
    r.add_argument("--dir", default="checkpoints")
    r.add_argument("--readme", help="rewrite the table between the results markers of this file (e.g. README.md)")

    s = sub.add_parser("structure", help="2D-structure score of a checkpoint's position table, as one JSON line")
    s.add_argument("checkpoint", help="a vitpe checkpoint, or timm ViT weights (.npz, .safetensors, .pth)")
    s.add_argument("--grid", type=_grid, help="patch grid of timm weights whose table is not square, e.g. 12x16")

    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.cmd == "train":
            return _train(args, TrainConfig)
        if args.cmd == "evaluate":
            return _evaluate(args)
        if args.cmd == "structure":
            return _structure(args)
        from .report import results_table, update_readme
        if not Path(args.dir).is_dir():
            raise ValueError(f"no checkpoint folder at {args.dir} (pass --dir, e.g. --dir checkpoints)")
        if args.readme:
            update_readme(args.readme, args.dir)
        else:
            print(results_table(args.dir))
        return 0
    except ValueError as err:  # user errors: say what is wrong, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 2


def _structure(args) -> int:
    """Spearman of table similarity with -distance, plus same-row/column means (`summarize_table`)."""
    from .checkpoint import CheckpointError, import_timm, load_checkpoint
    from .evaluate import summarize_table
    path = Path(args.checkpoint)
    if not path.is_file():
        raise ValueError(f"no file at {path}")
    try:
        model = load_checkpoint(path).model
    except CheckpointError as vitpe_err:
        if path.suffix == ".safetensors" and "is a safetensors file but not a vitpe" not in str(vitpe_err):
            raise  # a damaged vitpe checkpoint: its own message says what is wrong
        try:
            model = import_timm(path, grid=args.grid)
        except CheckpointError as timm_err:
            raise ValueError(f"{path.name} is neither a vitpe checkpoint nor timm ViT weights: {timm_err}") from None
    structure = summarize_table(model)
    if structure is None:
        raise ValueError(f"{args.checkpoint}: encoding {model.cfg.encoding!r} has no position table to score")
    print(json.dumps({"encoding": model.cfg.encoding, "grid": list(model.cfg.grid), **structure}))
    return 0


def _train(args, TrainConfig) -> int:
    from .train import train
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TrainConfig(encoding=args.encoding, dataset=args.dataset, preset=args.preset,
                      encoding_options=_parse_options(args.option), epochs=args.epochs,
                      batch_size=args.batch_size, lr=args.lr, weight_decay=args.weight_decay, warmup=args.warmup,
                      label_smoothing=args.label_smoothing, grad_clip=args.grad_clip, seed=args.seed,
                      min_lr_ratio=args.min_lr_ratio, schedule=args.schedule, augment=args.augment,
                      train_subset=args.train_subset, test_subset=args.test_subset,
                      eval_batch_size=args.eval_batch_size)
    out = args.out or f"runs/{args.encoding}"
    metrics = train(cfg, data_dir=args.data_dir, out=out, resume=args.resume, checkpoint=args.checkpoint,
                    device=args.device, save_every=args.save_every, download=args.download,
                    compile_model=args.compile, progress=not args.no_progress)
    if int(os.environ.get("RANK", "0")) == 0:  # one line, also under torchrun
        print(json.dumps({"top1": metrics["test"]["top1"], "top5": metrics["test"]["top5"]}))
    return 0


def _evaluate(args) -> int:
    from .checkpoint import load_checkpoint, sanitize_metrics, update_metrics
    from .data import load_cifar
    from .evaluate import evaluate, evaluate_resolutions, translation_test
    ckpt = load_checkpoint(args.checkpoint, device=args.device)
    if args.sizes:  # checked before the first pass over the test set
        patch, largest = ckpt.config.patch_size, 2 * max(ckpt.config.img_size)
        bad = [s for s in args.sizes if s % patch or s > largest]
        if bad:
            raise ValueError(f"--sizes {bad}: each size must be a multiple of the patch size {patch} and at most "
                             f"{largest} px (twice the training size)")
    recipe = sanitize_metrics(ckpt.metrics)[0].get("recipe") or {}
    dataset = recipe.get("dataset", "cifar10")
    ds = load_cifar(dataset, args.data_dir, "test", download=args.download)
    res = evaluate(ckpt.model, ds, dataset, device=args.device, progress=True)
    line = {"top1": res["top1"], "top5": res["top5"]}
    if args.sizes:
        line["resolution"] = evaluate_resolutions(ckpt.model, ds, dataset, sizes=args.sizes, device=args.device)
    if args.translation:
        line["translation"] = translation_test(ckpt.model, ds, dataset, device=args.device)
    if args.record:
        update_metrics(args.checkpoint, {k: v for k, v in line.items() if k not in ("top1", "top5")})
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
