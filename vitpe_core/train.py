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

from . import data as D
from .checkpoint import atomic_write_bytes, clean_state_dict, history_params, save_checkpoint
from .config import ViTConfig, preset_config
from .evaluate import accuracy, full_report, predict, summarize_table
from .model import ViT
from .randaugment import rand_augment

log = logging.getLogger(__name__)
SCHEDULES = ("onecycle", "cosine")
AUGMENTS = ("cropflip", "mixup", "randaug", "deit", "none")  # each includes crop+flip except none


@dataclass(frozen=True)
class TrainConfig:
    encoding: str = "ape"
    dataset: str = "cifar10"
    preset: str = "compact"
    encoding_options: dict[str, Any] = field(default_factory=dict)
    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    min_lr_ratio: float = 1e-3      # final lr = lr * min_lr_ratio
    weight_decay: float = 0.05
    schedule: str = "onecycle"      # onecycle: warm-up over `warmup` of all steps; cosine: over `warmup` epochs
    warmup: float = 0.15
    label_smoothing: float = 0.1
    augment: str = "cropflip"       # + mixup/cutmix (mixup), + RandAugment (randaug), + both (deit: the paper's)
    grad_clip: float = 1.0
    seed: int = 0
    train_subset: int | None = None  # tiny runs (tests, smoke)
    test_subset: int | None = None
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


def train(cfg: TrainConfig, *, data_dir: str | Path, out: str | Path, resume: bool = False,
          checkpoint: str | Path | None = None, device: str = "cpu", save_every: int = 100,
          stop_after_steps: int | None = None, progress: bool = True, download: bool = False,
          full_eval: bool = True, compile_model: bool = False) -> dict:
    """Train (or resume) a run in `out`; returns its metrics. `stop_after_steps` saves and
    returns early, as an interruption would (tests).

    Under `torchrun` every process draws the same global batch and augments it identically,
    then trains on its own contiguous shard; DistributedDataParallel averages the gradients,
    so N processes follow the single-process run (tests/test_train.py checks this on CPU
    with gloo). Only rank 0 writes files."""
    rank, world, device = _distributed(device)
    if cfg.batch_size % world:
        raise ValueError(f"batch_size {cfg.batch_size} must be divisible by the {world} processes")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "state.pt"
    num_classes = D.DATASETS[cfg.dataset].num_classes
    torch.manual_seed(cfg.seed)
    model = ViT(cfg.model_config(num_classes)).to(device)  # first: a bad encoding fails before data loads
    train_ds = D.load_cifar(cfg.dataset, data_dir, "train", download=download)
    test_ds = D.load_cifar(cfg.dataset, data_dir, "test", download=download)
    if cfg.train_subset:
        train_ds = D.subset(train_ds, cfg.train_subset, seed=cfg.seed)
    if cfg.test_subset:
        test_ds = D.subset(test_ds, cfg.test_subset, seed=cfg.seed)
    opt = _optimizer(model, cfg)
    steps_per_epoch = D.num_batches(len(train_ds), cfg.batch_size, drop_last=True)
    total = steps_per_epoch * cfg.epochs
    aug_gen = torch.Generator().manual_seed(cfg.seed + 1)
    step, train_time = 0, 0.0
    curves: dict[str, list] = {k: [] for k in ("epoch", "train_loss", "train_acc", "test_top1", "test_top5",
                                               "test_loss", "lr", "images_per_s")}
    history = {0: history_params(model)}
    commits = [git_commit()]  # the code each (re)start of this run trained with
    running = {"loss": 0.0, "correct": 0, "seen": 0}
    if resume and state_path.exists():
        st = load_state(state_path)
        if st["train_config"] != cfg.to_dict():
            raise ValueError(f"{state_path} was written with another configuration; use a new --out or drop "
                             f"--resume.\nsaved: {st['train_config']}\nnow:   {cfg.to_dict()}")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        aug_gen.set_state(st["aug_rng"])
        torch.set_rng_state(st["torch_rng"])
        step, train_time, curves, running = st["step"], st["train_time"], st["curves"], st["running"]
        history = {int(k): v for k, v in st["history"].items()}
        commits = list(dict.fromkeys(st["commits"] + commits))
        log.info("resumed %s at step %d/%d", out, step, total)
    elif resume:
        log.info("no state in %s: starting from scratch", out)
    net: torch.nn.Module = model
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.startswith("cuda") else None)
    if compile_model:
        net = torch.compile(net)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda"))

    def save() -> None:
        if rank == 0:
            _save_state(state_path, {
                "train_config": cfg.to_dict(), "model": clean_state_dict(model.state_dict()),
                "optimizer": opt.state_dict(), "aug_rng": aug_gen.get_state(), "torch_rng": torch.get_rng_state(),
                "step": step, "train_time": train_time, "curves": curves, "running": running, "commits": commits,
                "history": {str(k): v for k, v in history.items()}})
        if world > 1:
            torch.distributed.barrier()

    while step < total:
        epoch, in_epoch = divmod(step, steps_per_epoch)
        it = D.batches(train_ds, cfg.batch_size, shuffle=True, generator=_epoch_generator(cfg, epoch),
                       drop_last=True, start_batch=in_epoch)
        bar = tqdm(it, total=steps_per_epoch, initial=in_epoch, desc=f"{cfg.encoding} epoch {epoch + 1}/{cfg.epochs}",
                   disable=not progress or rank != 0, unit="batch", dynamic_ncols=True)
        net.train()
        t_epoch = time.perf_counter()
        for x, y in bar:
            t0 = time.perf_counter()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # uint8 to the device
            if cfg.augment != "none":
                x = D.random_crop_flip(x, padding=4, generator=aug_gen)                 # (B, 3, 32, 32) uint8
            if cfg.augment in ("randaug", "deit"):
                x = rand_augment(x, generator=aug_gen)                                   # rand-m9-mstd0.5-inc1
            x = D.normalize(x, cfg.dataset)
            target = y
            if cfg.augment in ("mixup", "deit"):
                x, target = D.mixup_cutmix(x, y, num_classes, label_smoothing=cfg.label_smoothing, generator=aug_gen)
            if world > 1:  # this process's shard of the global batch
                x, y, target = (t.chunk(world)[rank] for t in (x, y, target))
            for g in opt.param_groups:
                g["lr"] = lr_at(step, total, steps_per_epoch, cfg)
            with autocast:
                logits = net(x)
                loss = F.cross_entropy(logits.float(), target, label_smoothing=0.0 if cfg.augment in ("mixup", "deit")
                                       else cfg.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            train_time += time.perf_counter() - t0
            running["loss"] += loss.item() * len(y)
            running["correct"] += int((logits.argmax(1) == y).sum())
            running["seen"] += len(y)
            bar.set_postfix(loss=f"{running['loss'] / running['seen']:.3f}",
                            acc=f"{100 * running['correct'] / running['seen']:.1f}",
                            img_s=f"{len(y) * world / (time.perf_counter() - t0):.0f}")
            if step % steps_per_epoch == 0:
                break
            if stop_after_steps is not None and step >= stop_after_steps:
                save()
                return {"stopped_at_step": step}
            if save_every and step % save_every == 0:
                save()
        bar.close()
        # ---- end of epoch: evaluate, record curves and the encoding's parameters
        if world > 1:
            sums = torch.tensor([running["loss"], running["correct"], running["seen"]], dtype=torch.float64)
            torch.distributed.all_reduce(sums)
            running = {"loss": sums[0].item(), "correct": int(sums[1]), "seen": int(sums[2])}
        acc = accuracy(predict(model, test_ds, cfg.dataset, batch_size=cfg.eval_batch_size, device=device),
                       test_ds.labels)
        seen = max(1, running["seen"])
        for key, value in (("epoch", epoch + 1), ("train_loss", round(running["loss"] / seen, 4)),
                           ("train_acc", round(100 * running["correct"] / seen, 2)), ("test_top1", acc["top1"]),
                           ("test_top5", acc["top5"]), ("test_loss", acc["loss"]), ("lr", opt.param_groups[0]["lr"]),
                           ("images_per_s", round(seen / max(1e-9, time.perf_counter() - t_epoch), 1))):
            curves[key].append(value)
        history[epoch + 1] = history_params(model)
        running = {"loss": 0.0, "correct": 0, "seen": 0}
        log.info("epoch %d: %s", epoch + 1, acc)
        if progress and rank == 0:
            tqdm.write(f"epoch {epoch + 1}/{cfg.epochs}: test top-1 {acc['top1']:.2f} top-5 {acc['top5']:.2f}")
        save()
        if stop_after_steps is not None and step >= stop_after_steps:
            return {"stopped_at_step": step}

    model.eval()
    metrics = {
        "recipe": cfg.to_dict(), "epochs": cfg.epochs, "steps": total,
        "wall_time_s": round(train_time, 1), "images_per_s": round(total * cfg.batch_size / max(train_time, 1e-9), 1),
        "curves": curves, "git_commit": commits[0], "git_commits": commits, "torch": torch.__version__,
        "device": _describe(device, world), "parameters": sum(p.numel() for p in model.parameters()),
    }
    if full_eval:
        metrics.update(full_report(model, test_ds, cfg.dataset, batch_size=cfg.eval_batch_size, device=device))
    else:
        metrics["test"] = accuracy(predict(model, test_ds, cfg.dataset, device=device), test_ds.labels)
        structure = summarize_table(model)
        if structure:
            metrics["structure"] = structure
    if rank == 0:
        save_checkpoint(out / "final.safetensors", model, metrics=metrics, history=history)
        if checkpoint:
            save_checkpoint(checkpoint, model, metrics=metrics, history=history)
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    return metrics


def _describe(device: str, world: int) -> str:
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"
    return f"{world} x {name}" if world > 1 else name
