"""Training: AdamW, warm-up + one-cycle or cosine schedule, label smoothing, batched
augmentation on uint8 tensors, evaluation each epoch, exact resume, atomic checkpoints.

The whole run state (model, optimiser, step, RNG states, curves, per-epoch encoding
snapshots) lives in `<out>/state.pt`, written atomically every `save_every` steps and at
every epoch end, and loadable with `torch.load(weights_only=True)`. `--resume` continues
from it; the data order of an epoch is a function of (seed, epoch) and the augmentation
generator's state is saved, so a resumed run reproduces an uninterrupted one exactly
(tests/test_train.py). The final model goes to `<out>/final.safetensors` and, with
`--checkpoint`, to a named checkpoint with the full evaluation report in its metrics.
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import augment as A
from . import data as D
from .checkpoint import atomic_write_bytes, clean_state_dict, history_params, save_checkpoint
from .config import PRESETS, ViTConfig, preset_config
from .analysis import encoding_scale
from .evaluate import accuracy, full_report, predict, summarize_table
from .model import ViT
from .precision import Precision, resolve
from .randaugment import rand_augment

log = logging.getLogger(__name__)
SCHEDULES = ("onecycle", "cosine")
REFRESH_EVERY = 25   # steps between reads of the loss and accuracy from the device (each read waits for it)
AUGMENTS = ("cropflip", "mixup", "randaug", "deit", "none")  # each includes crop+flip except none


def _flag(default: Any, *, choices: tuple = (), help: str = "") -> Any:
    """A TrainConfig field with the choices and help of its `python -m vitpe_core train` flag."""
    return field(default=default, metadata={"choices": choices, "help": help})


@dataclass(frozen=True)
class TrainConfig:
    """The recipe of a run: saved in state.pt (resume refuses another) and in the metrics as `recipe`.
    Each field is a flag of `python -m vitpe_core train` (`batch_size` -> `--batch-size`,
    `encoding_options` -> repeated `--option KEY=VALUE`), typed by its annotation."""
    encoding: str = _flag("ape", help="registry name, '+' composes (e.g. sape2+ape)")
    dataset: str = _flag("cifar10", choices=tuple(sorted(D.DATASETS)))
    preset: str = _flag("compact", choices=tuple(sorted(PRESETS)))
    encoding_options: dict[str, Any] = field(default_factory=dict)
    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    min_lr_ratio: float = _flag(1e-3, help="final lr = lr * min_lr_ratio")
    weight_decay: float = 0.05
    schedule: str = _flag("onecycle", choices=SCHEDULES,
                          help="onecycle: warm-up over `warmup` of all steps; cosine: over `warmup` epochs")
    warmup: float = 0.15
    label_smoothing: float = 0.1
    augment: str = _flag("cropflip", choices=AUGMENTS,
                         help="cropflip: random crop (pad 4) + flip; mixup: + mixup/cutmix; randaug: + RandAugment "
                              "(timm rand-m9-mstd0.5-inc1); deit: + both (the SaPE² paper's recipe); none")
    grad_clip: float = 1.0
    seed: int = 0
    train_subset: int | None = _flag(None, help="train on this many images (tiny runs: tests, smoke)")
    test_subset: int | None = _flag(None, help="evaluate on this many test images")
    eval_batch_size: int = 500

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; valid: {SCHEDULES}")
        if self.dataset not in D.DATASETS:
            raise ValueError(f"unknown dataset {self.dataset!r}; valid: {sorted(D.DATASETS)}")
        if self.augment not in AUGMENTS:
            raise ValueError(f"unknown augment {self.augment!r}; valid: {AUGMENTS}")
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("epochs, batch_size and lr must be positive")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def model_config(self, num_classes: int) -> ViTConfig:
        return preset_config(self.preset, encoding=self.encoding, num_classes=num_classes,
                             encoding_options=dict(self.encoding_options))


def lr_at(step: int, total: int, steps_per_epoch: int, cfg: TrainConfig) -> float:
    """Learning rate at optimiser step `step` (0-based) of `total`."""
    warm = cfg.warmup * total if cfg.schedule == "onecycle" else cfg.warmup * steps_per_epoch
    warm = max(1, int(round(warm)))
    lo = cfg.lr * cfg.min_lr_ratio
    if step < warm:
        start = cfg.lr / 25 if cfg.schedule == "onecycle" else lo
        return start + (cfg.lr - start) * step / warm
    t = (step - warm) / max(1, total - warm)
    return lo + 0.5 * (cfg.lr - lo) * (1 + math.cos(math.pi * min(1.0, t)))


def git_commit(root: Path | None = None) -> str:
    """HEAD's sha of the repository at `root` (default: this checkout), '+dirty' if code changed."""
    root = Path(__file__).resolve().parents[1] if root is None else Path(root)
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        # Dirty means changed code: run states and checkpoints are outputs, not what was trained with.
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)runs", ":(exclude)checkpoints"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (sha or "unknown") + ("+dirty" if dirty else "")


def _save_state(path: Path, state: dict) -> None:
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(path, buf.getvalue())


def load_state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _epoch_generator(cfg: TrainConfig, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(cfg.seed * 100_003 + epoch)


def _distributed(device: str) -> tuple[int, int, str]:
    """(rank, world size, device) under `torchrun`; (0, 1, device) otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, device
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    return dist.get_rank(), world, device


def _optimizer(model: ViT, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on norms, biases, tokens and position-encoding parameters."""
    decayed = lambda n, p: p.ndim >= 2 and "pos_enc" not in n and "token" not in n
    groups = [{"params": [p for n, p in model.named_parameters() if decayed(n, p)], "weight_decay": cfg.weight_decay},
              {"params": [p for n, p in model.named_parameters() if not decayed(n, p)], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr)


_CURVES = ("epoch", "train_loss", "train_acc", "test_top1", "test_top5", "test_loss", "lr", "images_per_s")


def _zero_running() -> dict:
    return {"loss": 0.0, "correct": 0, "seen": 0}


@dataclass
class _Run:
    """A run in progress: what `_setup` builds, and the progress that `_save` writes to state.pt."""
    cfg: TrainConfig
    out: Path
    device: str
    rank: int                                   # this process under torchrun; 0 alone
    world: int                                  # processes under torchrun; 1 alone
    model: ViT
    opt: torch.optim.Optimizer
    train_ds: D.ImageDataset
    test_ds: D.ImageDataset
    steps_per_epoch: int
    aug_gen: torch.Generator                    # augmentation draws, saved: a resumed run draws the same
    history: dict[int, dict]                    # epoch -> the encoding's parameters (0: at initialisation)
    commits: list[str]                          # the code each (re)start of this run trained with
    starts: list[dict] = field(default_factory=list)  # each (re)start: step, commit, device, compiled (`_start`)
    step: int = 0                               # optimiser steps done
    train_time: float = 0.0                     # seconds in the training loop (evaluation and saves not counted)
    curves: dict[str, list] = field(default_factory=lambda: {k: [] for k in _CURVES})  # one value per epoch
    running: dict = field(default_factory=_zero_running)  # this epoch's loss / correct / seen so far
    net: torch.nn.Module | None = None          # the model as trained: DDP- and/or compile-wrapped (`_wrap`)
    precision: Precision | None = None          # the forward's autocast and fp16's loss scale (`train`)
    epoch_start: float = 0.0                    # perf_counter at the epoch's start, for images_per_s

    @property
    def state_path(self) -> Path:
        return self.out / "state.pt"

    @property
    def total(self) -> int:
        return self.steps_per_epoch * self.cfg.epochs

    @property
    def num_classes(self) -> int:
        return D.DATASETS[self.cfg.dataset].num_classes


def train(cfg: TrainConfig, *, data_dir: str | Path, out: str | Path, resume: bool = False,
          checkpoint: str | Path | None = None, device: str = "cpu", save_every: int = 100,
          stop_after_steps: int | None = None, progress: bool = True, download: bool = False,
          full_eval: bool = True, compile_model: bool = False, precision: str = "auto") -> dict:
    """Train (or resume) a run in `out`; returns its metrics. `stop_after_steps` saves and
    returns early, as an interruption would (tests). `precision`: autocast dtype of the forward
    (`precision.PRECISIONS`; "auto" = bf16 on CUDA, float32 elsewhere; fp16 with a loss scale), a property
    of the run like the device, not of the recipe: each (re)start records it (`starts`).

    Under `torchrun` every process draws the same global batch and augments it identically,
    then trains on its own contiguous shard; DistributedDataParallel averages the gradients,
    so N processes follow the single-process run (tests/test_train.py checks this on CPU
    with gloo). Only rank 0 writes files."""
    run = _setup(cfg, data_dir=data_dir, out=out, device=device, download=download)
    commit = run.commits[0]                                         # this start's code (before any resume)
    run.precision = resolve(precision, run.device)
    if resume:
        _resume(run)
    _wrap(run, compile_model)
    _start(run, commit=commit, compiled=compile_model)
    while run.step < run.total:
        epoch = run.step // run.steps_per_epoch
        if not _train_epoch(run, save_every=save_every, stop_after_steps=stop_after_steps, progress=progress):
            return {"stopped_at_step": run.step}                    # interrupted mid-epoch, state saved
        _end_of_epoch(run, epoch, progress=progress)
        if stop_after_steps is not None and run.step >= stop_after_steps:
            return {"stopped_at_step": run.step}
    return _finish(run, checkpoint=checkpoint, full_eval=full_eval)


def _setup(cfg: TrainConfig, *, data_dir: str | Path, out: str | Path, device: str, download: bool) -> _Run:
    """A fresh run: the model (seeded with cfg.seed), the data, the optimiser, step 0."""
    rank, world, device = _distributed(device)
    if cfg.batch_size % world:
        raise ValueError(f"batch_size {cfg.batch_size} must be divisible by the {world} processes")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    num_classes = D.DATASETS[cfg.dataset].num_classes
    torch.manual_seed(cfg.seed)
    model = ViT(cfg.model_config(num_classes)).to(device)  # first: a bad encoding fails before data loads
    train_ds = D.load_cifar(cfg.dataset, data_dir, "train", download=download)
    test_ds = D.load_cifar(cfg.dataset, data_dir, "test", download=download)
    if cfg.train_subset:
        train_ds = D.subset(train_ds, cfg.train_subset, seed=cfg.seed)
    if cfg.test_subset:
        test_ds = D.subset(test_ds, cfg.test_subset, seed=cfg.seed)
    if torch.device(device).type == "cuda":   # the whole uint8 training set (150 MiB for CIFAR) on the GPU once:
        train_ds = D.ImageDataset(train_ds.images.to(device), train_ds.labels.to(device), train_ds.label_names)
    opt = _optimizer(model, cfg)
    steps_per_epoch = D.num_batches(len(train_ds), cfg.batch_size, drop_last=True)
    aug_gen = torch.Generator().manual_seed(cfg.seed + 1)
    history = {0: history_params(model)}
    return _Run(cfg=cfg, out=out, device=device, rank=rank, world=world, model=model, opt=opt, train_ds=train_ds,
                test_ds=test_ds, steps_per_epoch=steps_per_epoch, aug_gen=aug_gen, history=history,
                commits=[git_commit()])


def _resume(run: _Run) -> None:
    """Continue from `<out>/state.pt` if there is one, refusing a state written with another config."""
    if not run.state_path.exists():
        log.info("no state in %s: starting from scratch", run.out)
        return
    st = load_state(run.state_path)
    if st["train_config"] != run.cfg.to_dict():
        raise ValueError(f"{run.state_path} was written with another configuration; use a new --out or drop "
                         f"--resume.\nsaved: {st['train_config']}\nnow:   {run.cfg.to_dict()}")
    run.model.load_state_dict(st["model"])
    run.opt.load_state_dict(st["optimizer"])
    run.aug_gen.set_state(st["aug_rng"])
    torch.set_rng_state(st["torch_rng"])
    run.step, run.train_time, run.curves, run.running = st["step"], st["train_time"], st["curves"], st["running"]
    run.history = {int(k): v for k, v in st["history"].items()}
    if run.precision.scaler is not None and st.get("scaler"):   # fp16: the loss scale goes on where it was
        run.precision.scaler.load_state_dict(st["scaler"])
    run.commits = list(dict.fromkeys(st["commits"] + run.commits))
    run.starts = st.get("starts", [{"step": 0, "note": f"starts before step {run.step} were not recorded "
                                                        "(a state written before vitpe recorded them)"}])
    log.info("resumed %s at step %d/%d", run.out, run.step, run.total)


def _wrap(run: _Run, compile_model: bool) -> None:
    """The module trained: DDP under torchrun (after any resume: DDP broadcasts rank 0's weights), compiled
    on request; gradients clip and checkpoints save through the bare `run.model`."""
    net: torch.nn.Module = run.model
    if run.world > 1:
        net = torch.nn.parallel.DistributedDataParallel(
            run.model, device_ids=[run.device] if run.device.startswith("cuda") else None)
    if compile_model:
        net = torch.compile(net)
    run.net = net


def _start(run: _Run, *, commit: str, compiled: bool) -> None:
    """Record how this (re)start trains: from which step, with which code, on what, compiled or not.
    The metrics keep the list (`starts`), so a run resumed on other hardware or options says so."""
    run.starts.append({"step": run.step, "commit": commit, "device": _describe(run.device, run.world),
                       "compiled": compiled, "precision": run.precision.name})


def _save(run: _Run) -> None:
    """Write state.pt (rank 0); every key is read back by `_resume`."""
    if run.rank == 0:
        _save_state(run.state_path, {
            "train_config": run.cfg.to_dict(), "model": clean_state_dict(run.model.state_dict()),
            "optimizer": run.opt.state_dict(), "aug_rng": run.aug_gen.get_state(), "torch_rng": torch.get_rng_state(),
            "step": run.step, "train_time": run.train_time, "curves": run.curves, "running": run.running,
            "commits": run.commits, "starts": run.starts, "history": {str(k): v for k, v in run.history.items()},
            **({"scaler": run.precision.scaler.state_dict()} if run.precision.scaler is not None else {})})
    if run.world > 1:
        torch.distributed.barrier()


def _train_epoch(run: _Run, *, save_every: int, stop_after_steps: int | None, progress: bool) -> bool:
    """Train from `run.step` to the end of its epoch; False when `stop_after_steps` stopped it first (saved)."""
    cfg = run.cfg
    epoch, in_epoch = divmod(run.step, run.steps_per_epoch)
    it = D.batches(run.train_ds, cfg.batch_size, shuffle=True, generator=_epoch_generator(cfg, epoch),
                   drop_last=True, start_batch=in_epoch)
    bar = tqdm(it, total=run.steps_per_epoch, initial=in_epoch, desc=f"{cfg.encoding} epoch {epoch + 1}/{cfg.epochs}",
               disable=not progress or run.rank != 0, unit="batch", dynamic_ncols=True)
    run.net.train()
    run.epoch_start = mark = time.perf_counter()
    tally = _Tally(run)
    for x, y in bar:
        x, y, target = _batch(run, x, y)
        logits, loss = _step(run, x, target)
        tally.add(loss, logits, y)
        boundary = run.step % run.steps_per_epoch == 0
        stop = stop_after_steps is not None and run.step >= stop_after_steps
        save = stop or (save_every and run.step % save_every == 0)
        if boundary or save or tally.pending >= REFRESH_EVERY:   # reads wait for the device: not every step
            images = tally.pending * len(y) * run.world
            tally.read()                                         # waits for the device: the time below is real
            now = time.perf_counter()
            run.train_time += now - mark
            running = run.running
            bar.set_postfix(loss=f"{running['loss'] / running['seen']:.3f}",
                            acc=f"{100 * running['correct'] / running['seen']:.1f}",
                            img_s=f"{images / max(now - mark, 1e-9):.0f}")
            mark = now
        if boundary:
            break
        if save:
            _save(run)
            mark = time.perf_counter()                           # saving is not training time
        if stop:
            return False
    bar.close()
    return True


class _Tally:
    """This epoch's summed loss and correct count, kept on the device and read into `run.running`
    only by `read()` (each read waits for the device to finish; reading every step would keep a
    GPU idle between steps). Sums in float64 in step order: the same numbers as summing each
    step's `loss.item()` on the host, also across a resume."""

    def __init__(self, run: _Run) -> None:
        self.run, self.pending = run, 0
        device = run.device
        self.loss = torch.tensor(run.running["loss"], dtype=torch.float64, device=device)
        self.correct = torch.tensor(run.running["correct"], dtype=torch.int64, device=device)

    def add(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        self.loss += loss.detach().double() * len(y)
        self.correct += (logits.detach().argmax(1) == y).sum()
        self.run.running["seen"] += len(y)
        self.pending += 1

    def read(self) -> None:
        self.run.running.update(loss=self.loss.item(), correct=int(self.correct))
        self.pending = 0


def _batch(run: _Run, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Augment a global batch on the device, then take this process's shard: (images, labels, targets);
    targets are soft labels under mixup/cutmix, the labels otherwise. Draws from `run.aug_gen` in a fixed order."""
    cfg, device = run.cfg, run.device
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # uint8 to the device
    if cfg.augment != "none":
        x = A.random_crop_flip(x, padding=4, generator=run.aug_gen)              # (B, 3, 32, 32) uint8
    if cfg.augment in ("randaug", "deit"):
        x = rand_augment(x, generator=run.aug_gen)                                # rand-m9-mstd0.5-inc1
    x = D.normalize(x, cfg.dataset)                                               # (B, 3, 32, 32) float
    target = y
    if cfg.augment in ("mixup", "deit"):
        x, target = A.mixup_cutmix(x, y, run.num_classes, label_smoothing=cfg.label_smoothing,
                                   generator=run.aug_gen)                         # target (B, classes)
    if run.world > 1:  # this process's shard of the global batch
        x, y, target = (t.chunk(run.world)[run.rank] for t in (x, y, target))
    return x, y, target


def _step(run: _Run, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimiser step at the scheduled learning rate; returns (logits (B, classes), loss)."""
    cfg, opt = run.cfg, run.opt
    for g in opt.param_groups:
        g["lr"] = lr_at(run.step, run.total, run.steps_per_epoch, cfg)
    with run.precision.autocast():
        logits = run.net(x)
        loss = F.cross_entropy(logits.float(), target, label_smoothing=0.0 if cfg.augment in ("mixup", "deit")
                               else cfg.label_smoothing)   # mixup targets carry their own smoothing
    opt.zero_grad(set_to_none=True)
    run.precision.backward_and_step(loss, opt, run.model.parameters(), cfg.grad_clip)
    run.step += 1
    return logits, loss


SCALE_IMAGES = 64   # first test images on which each epoch measures the bias against the logits


def _record_encoding_scale(run: _Run) -> None:
    """Append `analysis.encoding_scale` on a fixed batch of test images to the curves (one value
    per epoch; a series that starts mid-run, after a resume from older code, is padded with None)."""
    n = min(SCALE_IMAGES, len(run.test_ds))
    x = D.normalize(run.test_ds.images[:n].to(run.device), run.cfg.dataset)
    epochs = len(run.curves["epoch"])
    for key, value in encoding_scale(run.model, x).items():
        series = run.curves.setdefault(key, [])
        series.extend([None] * (epochs - 1 - len(series)))
        series.append(value)


def _end_of_epoch(run: _Run, epoch: int, *, progress: bool) -> None:
    """Evaluate, record the epoch's curves and the encoding's parameters, save."""
    cfg, running = run.cfg, run.running
    if run.world > 1:
        sums = torch.tensor([running["loss"], running["correct"], running["seen"]], dtype=torch.float64)
        torch.distributed.all_reduce(sums)
        running = {"loss": sums[0].item(), "correct": int(sums[1]), "seen": int(sums[2])}
    acc = accuracy(predict(run.model, run.test_ds, cfg.dataset, batch_size=cfg.eval_batch_size, device=run.device),
                   run.test_ds.labels)
    seen = max(1, running["seen"])
    for key, value in (("epoch", epoch + 1), ("train_loss", round(running["loss"] / seen, 4)),
                       ("train_acc", round(100 * running["correct"] / seen, 2)), ("test_top1", acc["top1"]),
                       ("test_top5", acc["top5"]), ("test_loss", acc["loss"]), ("lr", run.opt.param_groups[0]["lr"]),
                       ("images_per_s", round(seen / max(1e-9, time.perf_counter() - run.epoch_start), 1))):
        run.curves[key].append(value)
    run.history[epoch + 1] = history_params(run.model)
    _record_encoding_scale(run)
    run.running = _zero_running()
    log.info("epoch %d: %s", epoch + 1, acc)
    if progress and run.rank == 0:
        tqdm.write(f"epoch {epoch + 1}/{cfg.epochs}: test top-1 {acc['top1']:.2f} top-5 {acc['top5']:.2f}")
    _save(run)


def _finish(run: _Run, *, checkpoint: str | Path | None, full_eval: bool) -> dict:
    """The run's metrics (recipe, curves, evaluation report); rank 0 writes them with the final model."""
    cfg, model, test_ds, total = run.cfg, run.model, run.test_ds, run.total
    model.eval()
    metrics = {
        "recipe": cfg.to_dict(), "epochs": cfg.epochs, "steps": total,
        "wall_time_s": round(run.train_time, 1),
        "images_per_s": round(total * cfg.batch_size / max(run.train_time, 1e-9), 1),
        "curves": run.curves, "git_commit": run.commits[0], "git_commits": run.commits, "torch": torch.__version__,
        "device": _describe(run.device, run.world), "starts": run.starts,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if full_eval:
        metrics.update(full_report(model, test_ds, cfg.dataset, batch_size=cfg.eval_batch_size, device=run.device))
    else:
        metrics["test"] = accuracy(predict(model, test_ds, cfg.dataset, device=run.device), test_ds.labels)
        structure = summarize_table(model)
        if structure:
            metrics["structure"] = structure
    if run.rank == 0:
        save_checkpoint(run.out / "final.safetensors", model, metrics=metrics, history=run.history)
        if checkpoint:
            save_checkpoint(checkpoint, model, metrics=metrics, history=run.history)
        (run.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return metrics


def _describe(device: str, world: int) -> str:
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"
    return f"{world} x {name}" if world > 1 else name
