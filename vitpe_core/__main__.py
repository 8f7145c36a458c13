"""Command line: `python -m vitpe_core COMMAND ...`; `COMMAND --help` lists its flags.

  train      train a ViT with one position encoding (resumable; several GPUs under torchrun)
  evaluate   test accuracy of a checkpoint, optionally across input sizes and translations, as one JSON line
  table      the README results table from checkpoints/*.json (or rewrite it in README.md)
  structure  2D-structure score of a checkpoint's (or timm ViT weights') position table, as one JSON line
  import     a pretrained timm / DeiT / RoPE-ViT / HF (ViT, BEiT, DINOv2/v3, CLIP, SigLIP, Swin) model -> a checkpoint
  analyze    how a checkpoint encodes position: position-only kernels, relative score, attention by depth
  scale      how loud an encoding's attention bias is next to the q·k logits, per layer, as one JSON line
  report     one self-contained interactive HTML file of a model (charts and an offline bias explorer)
  kernel     build (once per install) and load the fused SaPE²/CoPE CPU kernel; where it is cached, as one JSON line
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import types
import typing
from pathlib import Path

import torch

from .precision import PRECISIONS

if typing.TYPE_CHECKING:
    from .model import ViT
    from .train import TrainConfig


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


def _option(text: str) -> tuple[str, object]:
    """`--option KEY=VALUE`: VALUE as JSON (numbers, true, lists), else as the text itself."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m vitpe_core", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for add in (_add_train, _add_evaluate, _add_table, _add_structure, _add_import,
                _add_analyze, _add_scale, _add_report, _add_kernel):
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status (2: a user error, said in one line without a traceback)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except ValueError as err:  # user errors: say what is wrong, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 2


# ----------------------------------------------------------------------------- train
_FLAG_NAMES = {"encoding_options": "--option"}   # the others: batch_size -> --batch-size


def _flag_type(name: str, hint: object) -> type:
    """str, int, float or dict from a TrainConfig annotation; `int | None` is int."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = typing.get_origin(hint) or hint
    if kind not in (str, int, float, dict):
        raise TypeError(f"TrainConfig.{name}: no command-line flag for a field of type {hint}")
    return kind


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field, typed by its annotation, with the field's default and the
    choices and help of its metadata; the dict `encoding_options` is the repeated `--option KEY=VALUE`."""
    from .train import TrainConfig
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        flag, kind = _FLAG_NAMES.get(f.name, "--" + f.name.replace("_", "-")), _flag_type(f.name, hints[f.name])
        if kind is dict:
            parser.add_argument(flag, dest=f.name, type=_option, action="append", default=[], metavar="KEY=VALUE",
                                help="encoding option, e.g. --option readout=key --option npos_max=10")
            continue
        text = f.metadata.get("help", "").replace("%", "%%")
        parser.add_argument(flag, dest=f.name, type=kind, default=f.default,
                            choices=f.metadata.get("choices") or None,
                            help=f"{text}; default {f.default}" if text else f"default {f.default}")


def _train_config(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig that the flags of `_add_config_flags` parsed into."""
    from .train import TrainConfig
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{**values, "encoding_options": dict(values["encoding_options"])})  # last KEY wins


def _add_train(sub) -> None:
    t = sub.add_parser("train", help="train a ViT with one position encoding")
    t.set_defaults(run=_train)
    _add_config_flags(t)
    t.add_argument("--data-dir", default="data", help="folder holding cifar-10-batches-py / cifar-100-python")
    t.add_argument("--download", action="store_true", help="fetch the dataset from the official site if missing")
    t.add_argument("--out", help="run folder (default runs/<encoding>)")
    t.add_argument("--checkpoint", help="also write the final model here, e.g. checkpoints/ape.safetensors")
    t.add_argument("--resume", action="store_true", help="continue from <out>/state.pt")
    t.add_argument("--device", default=_default_device())
    t.add_argument("--threads", type=int, help="torch.set_num_threads")
    t.add_argument("--save-every", type=int, default=100, help="steps between resume points")
    t.add_argument("--compile", action="store_true", help="torch.compile the model for training")
    t.add_argument("--precision", default="auto", choices=PRECISIONS,
                   help="autocast dtype: auto = bf16 on CUDA, float32 on CPU; fp16 with a loss scale "
                        "(CoPE/SaPE² compute their positions in float32 in every case: docs/encodings.md)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")


def _train(args: argparse.Namespace) -> int:
    from .train import train
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = _train_config(args)
    out = args.out or f"runs/{args.encoding}"
    metrics = train(cfg, data_dir=args.data_dir, out=out, resume=args.resume, checkpoint=args.checkpoint,
                    device=args.device, save_every=args.save_every, download=args.download,
                    compile_model=args.compile, precision=args.precision, progress=not args.no_progress)
    if int(os.environ.get("RANK", "0")) == 0:  # one line, also under torchrun
        print(json.dumps({"top1": metrics["test"]["top1"], "top5": metrics["test"]["top5"]}))
    return 0


# ----------------------------------------------------------------------------- evaluate
def _add_evaluate(sub) -> None:
    e = sub.add_parser("evaluate", help="test accuracy of a checkpoint, as one JSON line")
    e.set_defaults(run=_evaluate)
    e.add_argument("checkpoint")
    e.add_argument("--data-dir", default="data")
    e.add_argument("--download", action="store_true")
    e.add_argument("--sizes", type=_sizes, help="comma-separated input sizes in pixels, e.g. 24,32,40,48 "
                                                "(multiples of the patch size, up to twice the training size)")
    e.add_argument("--translation", action="store_true", help="also run the translation test")
    e.add_argument("--record", action="store_true", help="write the results into the checkpoint's metrics")
    e.add_argument("--device", default=_default_device())


def _evaluate(args: argparse.Namespace) -> int:
    from .checkpoint import load_checkpoint, update_metrics
    from .data import load_cifar
    from .evaluate import evaluate, evaluate_resolutions, translation_test
    from .metrics import sanitize_metrics
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


# ----------------------------------------------------------------------------- table
def _add_table(sub) -> None:
    r = sub.add_parser("table", help="the README results table from checkpoints/*.json")
    r.set_defaults(run=_table)
    r.add_argument("--dir", default="checkpoints")
    r.add_argument("--readme", help="rewrite the table between the results markers of this file (e.g. README.md)")


def _table(args: argparse.Namespace) -> int:
    from .report import results_table, update_readme
    if not Path(args.dir).is_dir():
        raise ValueError(f"no checkpoint folder at {args.dir} (pass --dir, e.g. --dir checkpoints)")
    if args.readme:
        update_readme(args.readme, args.dir)
    else:
        print(results_table(args.dir))
    return 0


# ----------------------------------------------------------------------------- structure
def _add_structure(sub) -> None:
    s = sub.add_parser("structure", help="2D-structure score of a checkpoint's position table, as one JSON line")
    s.set_defaults(run=_structure)
    s.add_argument("checkpoint", help="a vitpe checkpoint, or timm ViT weights (.npz, .safetensors, .pth)")
    s.add_argument("--grid", type=_grid, help="patch grid of timm weights whose table is not square, e.g. 12x16")


def _structure(args: argparse.Namespace) -> int:
    """Spearman of table similarity with -distance, plus same-row/column means (`summarize_table`)."""
    from .checkpoint import SUFFIX, NotVitpeCheckpointError, load_checkpoint
    from .evaluate import summarize_table
    path = Path(args.checkpoint)
    if not path.is_file():
        raise ValueError(f"no file at {path}")
    model = None
    if path.suffix == SUFFIX:   # a vitpe checkpoint, or other weights in a safetensors file
        try:
            model = load_checkpoint(path).model
        except NotVitpeCheckpointError:
            pass                # other weights; a damaged vitpe checkpoint's own error says what is wrong
    if model is None:
        model = _imported_for_structure(path, args.grid)
    structure = summarize_table(model)
    if structure is None:
        raise ValueError(f"{args.checkpoint}: encoding {model.cfg.encoding!r} has no position table to score")
    print(json.dumps({"encoding": model.cfg.encoding, "grid": list(model.cfg.grid), **structure}))
    return 0


def _imported_for_structure(path: Path, grid: tuple[int, int] | None) -> ViT:
    """The model of ViT weights that are not a vitpe checkpoint, with `structure`'s own errors."""
    from .checkpoint import CheckpointError
    from .importers import GridUnknownError, import_file
    neither = f"{path.name} is neither a vitpe checkpoint nor ViT weights vitpe can import"
    try:
        return import_file(path, grid=grid).model
    except GridUnknownError as err:
        raise ValueError(f"{neither}: {err.table}; pass --grid HxW (the grid of patches it covers)") from None
    except CheckpointError as err:
        raise ValueError(f"{neither}: {err}") from None


# ----------------------------------------------------------------------------- import
def _add_import(sub) -> None:
    from .importers import FAMILIES, NORMS
    i = sub.add_parser("import", help="turn a pretrained ViT into a vitpe checkpoint (docs/importing.md)",
                       description="Import timm / DeiT / Hugging Face ViT / BEiT / data2vec-vision / DINOv2 / DINOv3 / "
                                   "CLIP / SigLIP / Swin / Swin-V2 / EVA-02 / RoPE-ViT weights, in Hugging Face's or "
                                   "timm's layout (model.safetensors with the config.json Hugging Face or timm saves "
                                   "beside it, or a hub id). The file is read without running code (.safetensors, "
                                   ".npz, or a weights-only torch file).")
    i.set_defaults(run=_import)
    i.add_argument("source", help="weights file, or a Hugging Face hub id (needs huggingface_hub and a network)")
    i.add_argument("--out", required=True, help="the checkpoint to write, e.g. checkpoints/vit_tiny.safetensors")
    i.add_argument("--family", default="auto", choices=("auto", *FAMILIES), help="default: detected from the keys")
    i.add_argument("--img-size", help="H or HxW in pixels: required only for a non-square table, or to run the "
                                      "model at another size (the table is resampled as timm does)")
    i.add_argument("--heads", type=int, help="attention heads (default: config.json beside the file, else width/64)")
    i.add_argument("--pool", choices=("token", "avg"), help="read-out, where the keys cannot tell (default token)")
    i.add_argument("--act", choices=("gelu", "gelu_tanh", "quick_gelu", "silu"),
                   help="MLP activation of a timm ViT whose keys do not record it (CLIP-style norm_pre, SigLIP-style "
                        "attn_pool, gated MLPs); default: timm's config.json beside the file")
    i.add_argument("--window", type=int, help="window of a timm Swin-V2 (not in its keys); default: timm's config.json "
                                              "beside the file")
    i.add_argument("--norm", choices=sorted(NORMS), help="input normalisation (default: the family's usual one)")
    i.add_argument("--crop-pct", type=float, help="centre-crop fraction of the eval transform (timm's crop_pct)")
    i.add_argument("--licence", default="", help="free text recorded in the checkpoint, e.g. 'Apache-2.0 (timm)'")
    i.add_argument("--labels", metavar="FILE", help="the class names, in the order of the head's outputs: one name per "
                                                   "line, or JSON as config.json's id2label ({\"0\": \"tench\", ...}); "
                                                   "default: config.json's id2label, ImageNet-1k's for 1000 classes, "
                                                   "else 'class k'")
    i.add_argument("--dtype", default="source", choices=("source", "float32", "float16", "bfloat16"),
                   help="precision of the stored weights (default: the file's own, so the checkpoint is the model "
                        "the file holds; float16 halves the size and rounds the weights)")
    i.add_argument("--half", action="store_true", help="store float16 weights: the same as --dtype float16 (the "
                                                       "checkpoint records it as stored_dtype)")


def _import(args: argparse.Namespace) -> int:
    from .importers import import_checkpoint
    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise ValueError(f"--out must end in .safetensors, got {out.name}")
    if args.half:
        if args.dtype not in ("source", "float16"):
            raise ValueError(f"--half stores float16; it contradicts --dtype {args.dtype}")
        args.dtype = "float16"
    imp = import_checkpoint(args.source, out, licence=args.licence, dtype=args.dtype, family=args.family,
                            img_size=args.img_size, heads=args.heads, pool=args.pool, norm=args.norm,
                            crop_pct=args.crop_pct, labels=args.labels, act=args.act, window=args.window)
    cfg = imp.model.cfg
    print(json.dumps({"out": str(out), "family": imp.family, "encoding": cfg.encoding, "grid": list(cfg.grid),
                      "img_size": list(cfg.img_size), "prefix_tokens": imp.model.prefix_names(),
                      "classes": cfg.num_classes, "first_class_names": (imp.class_names or [])[:3],
                      "parameters": sum(p.numel() for p in imp.model.parameters()),
                      "stored_dtype": args.dtype if args.dtype != "source" else
                      str(imp.source_dtype).removeprefix("torch.").replace("float64", "float32"),
                      "notes": imp.notes}))
    return 0


# ----------------------------------------------------------------------------- analyze
def _add_analyze(sub) -> None:
    a = sub.add_parser("analyze", help="position-only kernels, relative score, attention distance, as one JSON line")
    a.set_defaults(run=_analyze)
    a.add_argument("checkpoint", nargs="+", help="vitpe checkpoints (e.g. checkpoints/*.safetensors)")
    a.add_argument("--record", action="store_true", help="also store the summary in the checkpoint's metrics "
                                                         "(`position`), for the README table")


def _analyze(args: argparse.Namespace) -> int:
    """`positional.analyze` on the gallery image set; arrays cached beside the checkpoint, and the
    trace of its first gallery image (`stored_trace`: the app's first page of it, without torch)."""
    from .checkpoint import load_checkpoint, update_metrics
    from .positional import analyze, cache_path, write_cache
    from .stored_trace import trace_first_image, write_trace
    from .swin.explore import is_swin_model
    for path in map(Path, args.checkpoint):
        if not path.is_file():
            raise ValueError(f"no file at {path}")
        ckpt = load_checkpoint(path)
        summary, arrays = analyze(ckpt, progress=True)
        if args.record:                      # first: rewriting the file changes the cache's stamp
            update_metrics(path, {"position": summary})
        write_cache(path, arrays)
        stored = None if is_swin_model(ckpt) else write_trace(path, *trace_first_image(ckpt))
        print(json.dumps({"checkpoint": path.stem, "cache": str(cache_path(path)),
                          "trace": str(stored) if stored else None,
                          **{k: summary[k] for k in ("kind", "images", "relative_score")}}))
    return 0

# ----------------------------------------------------------------------------- scale
def _add_scale(sub) -> None:
    s = sub.add_parser("scale", help="std of the encoding's attention bias / std of the q·k logits, per layer")
    s.set_defaults(run=_scale)
    s.add_argument("checkpoint", nargs="+", help="vitpe checkpoints with a bias (rpb, cope, sape2, ...)")
    s.add_argument("--data-dir", default="data", help="folder holding the CIFAR test set (see README)")


def _scale(args: argparse.Namespace) -> int:
    """`analysis.encoding_scale` on the first test images of the checkpoint's data set: the same
    measurement training records each epoch as the `enc_bias_ratio_L*` curves."""
    from . import data as D
    from .analysis import encoding_scale
    from .checkpoint import load_checkpoint
    from .train import SCALE_IMAGES
    for path in map(Path, args.checkpoint):
        if not path.is_file():
            raise ValueError(f"no file at {path}")
        ckpt = load_checkpoint(path)
        dataset = (ckpt.metrics.get("recipe") or {}).get("dataset", "cifar10")
        ds = D.load_cifar(dataset, args.data_dir, "test")
        x = D.normalize(ds.images[:SCALE_IMAGES], dataset)
        scale = encoding_scale(ckpt.model.float(), x)
        ratios = [v for k, v in scale.items() if k.startswith("enc_bias_ratio_L")]
        if not ratios:
            raise ValueError(f"{path.name}: `{ckpt.config.encoding}` adds no attention bias to measure")
        print(json.dumps({"checkpoint": str(path), "images": len(x), "bias_ratio_per_layer": ratios,
                          "bias_ratio_mean": round(sum(ratios) / len(ratios), 4)}))
    return 0


# ----------------------------------------------------------------------------- report
def _layers(text: str) -> list[int]:
    try:
        layers = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        layers = []
    if not layers or min(layers) < 0:
        raise argparse.ArgumentTypeError(f"expected layer numbers separated by commas, e.g. 0,5,11; got {text!r}")
    return layers


def _add_report(sub) -> None:
    r = sub.add_parser("report", help="a self-contained interactive HTML report of a model (no server needed)",
                       description="One HTML file holding a model card, Figure 7, position-only kernels, attention "
                                   "distance and an offline bias explorer (vitpe_core/html_report); it opens from "
                                   "disk in a browser with no network.")
    r.set_defaults(run=_report)
    r.add_argument("checkpoint", help="a shipped checkpoint's name (ape, long/ape), a vitpe checkpoint file, or "
                                      "weights the importers read (timm, DeiT, DINOv2, Hugging Face, RoPE-ViT)")
    r.add_argument("--out", required=True, help="the HTML file to write, e.g. report.html")
    r.add_argument("--images", nargs="+", metavar="IMAGE", help="image files or gallery ids for the bias explorer "
                                                                "(default: three CIFAR-10 test images and a photo)")
    r.add_argument("--layers", type=_layers, help="layers whose every head the explorer keeps, e.g. 0,5,11 (default: "
                                                  "as many as fit --max-mb; the others keep the mean over heads)")
    r.add_argument("--max-mb", type=float, default=24.0, help="size the explorer's per-head layers are chosen to "
                                                              "fit, in MB (default 24)")
    r.add_argument("--sizes", nargs="?", const="default", help="add the resolution sweep (vitpe_core/resolution.py): "
                   "alone, 0.5x-2x the model's size and one rectangle; or sizes such as 16,24,32x48 (pixels)")


def _report(args: argparse.Namespace) -> int:
    """`html_report.write_report` on a model `explore.load` opens, with a progress bar."""
    import shlex

    from tqdm.auto import tqdm

    from . import explore
    from .html_report import DEFAULT_MAX_BYTES, progress_steps, write_report
    from .html_report.build import DEFAULT_IMAGES
    m = explore.load(args.checkpoint)
    images = None if args.images is None else [explore.as_image(i) for i in args.images]
    steps = progress_steps(len(images) if images else DEFAULT_IMAGES, args.layers is not None) + 1
    words = ["report", args.checkpoint, "--out", args.out] + (["--images", *args.images] if args.images else []) + \
        (["--layers", ",".join(map(str, args.layers))] if args.layers else []) + \
        (["--max-mb", f"{args.max_mb:g}"] if args.max_mb * 1e6 != DEFAULT_MAX_BYTES else [])
    rows = _sweep(m, args.sizes) if args.sizes else None
    words += ["--sizes", args.sizes] if args.sizes else []
    command = "python -m vitpe_core " + shlex.join(words)
    with tqdm(total=steps, desc=f"report of {m.name}", unit="step") as bar:
        def progress(step: str) -> None:
            bar.set_postfix_str(step[:40])
            bar.update(1)
        out = write_report(m.ckpt, args.out, images=images, path=m.path, layers=args.layers, command=command,
                           content_hash=m.content_hash, max_bytes=int(args.max_mb * 1e6), resolution=rows,
                           progress=progress)
    print(json.dumps({"out": str(out), "bytes": out.stat().st_size, "checkpoint": m.name,
                      "content_hash": m.content_hash}))
    return 0


def _sweep(m, text: str) -> list:
    """`resolution.sweep` of `m` on the gallery images at `text`'s sizes ("default", or `16,24,32x48`)."""
    from . import positional, resolution
    from .importers import parse_size
    cfg = m.config
    sizes = (resolution.default_sizes(cfg.img_size, cfg.patch_size) if text == "default"
             else [parse_size(s) for s in text.split(",") if s.strip()])
    return resolution.sweep(m.ckpt.model, positional.image_set(m.ckpt), sizes)


def _add_kernel(sub) -> None:
    k = sub.add_parser("kernel", help="build and load the fused SaPE²/CoPE CPU kernel (once per install)",
                       description="Builds the fused C++ kernel (vitpe_core/encodings/csrc/) into the "
                                   "torch extension cache if it is not there, loads it, and prints where it is: run "
                                   "at install or image build time so that no visitor or first training step waits "
                                   "for the compiler. Exit status 1 when it cannot be built (no C++ compiler): "
                                   "SaPE²/CoPE then run their eager PyTorch path.")
    k.set_defaults(run=_kernel)


def _kernel(args: argparse.Namespace) -> int:
    import time

    from .encodings import _kernels
    name = _kernels.extension_name()
    folder = _kernels.build_directory(name)
    cached = any(f.endswith(".so") for f in os.listdir(folder))
    t0 = time.perf_counter()
    ok = _kernels.available()
    print(json.dumps({"available": ok, "name": name, "folder": folder, "was_cached": cached,
                      "seconds": round(time.perf_counter() - t0, 2),
                      "disabled": os.environ.get("VITPE_NO_CPP", "") not in ("", "0")}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
