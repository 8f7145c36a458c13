"""The GPU benchmark: `python -m benchmarks.gpu [--write BENCHMARKS.md]` on a machine with a CUDA GPU.

1. one attention layer (`model.Attention`, qkv and projection included), forward + backward, at
   three shapes (compact D128/4 heads/8x8/batch 128, ViT-S D384/6/14x14/128, ViT-B
   D768/12/14x14/64): plain SDPA (`torch.nn.functional.scaled_dot_product_attention`, no
   encoding object) and our `none`, `rpb`, `cope+ape`, `sape2`; float32 and bf16 autocast;
   median of 5 CUDA-event timings of 10 calls each, the encodings interleaved per round;
2. the peak memory one layer's forward + backward adds (`torch.cuda.max_memory_allocated`
   above what was allocated before it);
3. training img/s (train.py's step: autocast as `--precision`, AdamW, grad clip; batch 128,
   inputs already on the GPU) for every encoding at the compact and paper presets, bf16 and
   float32, eager; `torch.compile` for `ape` and `sape2` at the compact preset;
4. every encoding's bf16 training step against float32 (finite, loss and gradients close);
5. the fused (Triton) SaPE² / CoPE attention against their eager code on the GPU;
6. `train()` itself (data on the GPU, its augmentation and loop) against the model-only step.

The targets of issue 43 are checked beside the figures (PASS / MISS). Where no CUDA GPU is
present it exits with status 2 and says so; `--smoke` runs every section on the CPU at toy sizes
(tests/test_bench.py), to keep the script working on machines without a GPU — its figures mean
nothing and it never writes them.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.report import replace_section
from vitpe_core.config import preset_config
from vitpe_core.encodings import EncodingContext, build_encoding
from vitpe_core.encodings.functional import cope_attention, sape2_attention
from vitpe_core.model import Attention, build_model
from vitpe_core.precision import resolve
from vitpe_core.train import TrainConfig, _optimizer, git_commit

HEADING = "## 12. GPU"   # numbered: a rerun of benchmarks.bench keeps it (report.kept_sections)
SHAPES = {"compact": (128, 4, (8, 8), 128), "vit-s": (384, 6, (14, 14), 128), "vit-b": (768, 12, (14, 14), 64)}
SMOKE_SHAPES = {"toy": (32, 2, (3, 4), 2)}
LAYER_ROWS = ("SDPA", "none", "rpb", "cope+ape", "sape2")
ENCODINGS = ("none", "ape", "ape2d", "sincos2d", "rpb", "rope_axial", "rope_mixed", "cope+ape", "sape2", "sape2+ape")
PRECISIONS = ("fp32", "bf16")                  # vitpe_core.precision names; bf16 is what train.py uses on CUDA


class Timer:
    """Milliseconds per call: CUDA events on a GPU (the queue's own clock), perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], object], calls: int) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            return 1e3 * (time.perf_counter() - t0) / calls
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls


def interleaved_ms(fns: dict[str, Callable[[], object]], timer: Timer, rounds: int, calls: int) -> dict[str, float]:
    """Median ms per call of each function, timed round-robin (drift hits every one alike)."""
    for fn in fns.values():                                                   # warm-up, autotune, compile
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            samples[k].append(timer(fn, calls))
    return {k: float(np.median(v)) for k, v in samples.items()}


def layer_step(row: str, dim: int, heads: int, grid: tuple[int, int], batch: int, device: torch.device,
               prec: str) -> Callable[[], None]:
    """Forward + backward of one attention layer: `model.Attention` with `row`'s encoding, or for
    "SDPA" the same projections around a bare SDPA call."""
    torch.manual_seed(0)
    attn = Attention(dim, heads).to(device)
    T = 1 + grid[0] * grid[1]
    x = torch.randn(batch, T, dim, device=device, requires_grad=True)        # (B, T, D)
    grad_out = torch.randn(batch, T, dim, device=device)
    if row == "SDPA":
        def forward():
            qkv = attn.qkv(x).view(batch, T, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)  # (3, B, h, T, d)
            out = F.scaled_dot_product_attention(*qkv.unbind(0))              # (B, h, T, d)
            return attn.proj(out.transpose(1, 2).reshape(batch, T, dim))
        params = [*attn.parameters(), x]
    else:
        pos = build_encoding(row, EncodingContext(dim, heads, 1, grid, 1)).to(device)
        forward = lambda: attn(x, pos, grid, layer=0)
        params = [*attn.parameters(), *pos.parameters(), x]

    def step() -> None:
        for p in params:
            p.grad = None
        with resolve(prec, device).autocast():
            out = forward()
        out.backward(grad_out)
    return step


def peak_extra_mib(step: Callable[[], None], device: torch.device) -> float | None:
    """MiB that one call of `step` adds at its peak over what was allocated before it."""
    if device.type != "cuda":
        return None
    step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def bench_layers(shapes: dict, device: torch.device, timer: Timer, rounds: int, calls: int) -> list[dict]:
    rows = []
    for shape, (dim, heads, grid, batch) in shapes.items():
        for prec in PRECISIONS:
            steps = {r: layer_step(r, dim, heads, grid, batch, device, prec) for r in LAYER_ROWS}
            ms = interleaved_ms(steps, timer, rounds, calls)
            for r in LAYER_ROWS:
                rows.append({"shape": shape, "precision": prec, "row": r, "ms": ms[r], "vs_rpb": ms[r] / ms["rpb"],
                             "peak_extra_mib": peak_extra_mib(steps[r], device)})
            print(f"layer {shape} {prec}: " + ", ".join(f"{r} {ms[r]:.2f} ms" for r in LAYER_ROWS), flush=True)
    return rows


def train_step(encoding: str, preset: str, batch: int, device: torch.device, prec: str, compiled: bool = False,
               **overrides) -> Callable[[], None]:
    """train.py's step (autocast as `--precision`, cross entropy with smoothing, clip, AdamW)."""
    torch.manual_seed(0)
    model = build_model(preset_config(preset, encoding=encoding, num_classes=10, **overrides)).to(device).train()
    opt = _optimizer(model, TrainConfig())
    net = torch.compile(model) if compiled else model
    size = model.cfg.img_size
    x = torch.randn(batch, 3, *size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step() -> None:
        with resolve(prec, device).autocast():
            loss = F.cross_entropy(net(x).float(), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return step


def bench_training(presets: dict, device: torch.device, timer: Timer, rounds: int, calls: int) -> list[dict]:
    rows = []
    for preset, (batch, overrides) in presets.items():
        for prec in PRECISIONS:
            steps = {e: train_step(e, preset, batch, device, prec, **overrides) for e in ENCODINGS}
            if preset == "compact" and device.type == "cuda":
                steps.update({f"{e} (compiled)": train_step(e, preset, batch, device, prec, True, **overrides)
                              for e in ("ape", "sape2")})
            ms = interleaved_ms(steps, timer, rounds, calls)
            for e, t in ms.items():
                rows.append({"preset": preset, "precision": prec, "encoding": e, "img_s": 1e3 * batch / t,
                             "vs_ape": ms["ape"] / t})
            print(f"training {preset} {prec}: " + ", ".join(f"{e} {1e3 * batch / t:.0f}" for e, t in ms.items()),
                  flush=True)
            del steps
    return rows


def synthetic_cifar10(root: Path, n_train: int, n_test: int = 500) -> Path:
    """Random images in CIFAR-10's own layout (the pickles `load_cifar` reads), for timing the
    trainer where the data set is not at hand (the GPU machine has no network)."""
    import pickle

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per = -(-n_train // 5)
    for name, n in [*((f"data_batch_{b}", per) for b in range(1, 6)), ("test_batch", n_test)]:
        obj = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": rng.integers(0, 10, n).tolist(),
               b"batch_label": name.encode(), b"filenames": [f"{name}_{i}.png".encode() for i in range(n)]}
        (folder / name).write_bytes(pickle.dumps(obj, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({b"label_names": [f"c{i}".encode() for i in range(10)]}))
    return root


def trainer_throughput(device: torch.device, model_rows: list[dict], steps: int) -> list[dict]:
    """`train()` itself (the training set on the GPU, crop + flip on the device, the loop's reads
    every 25 steps), bf16, compact preset, one epoch of `steps` batches of 128, against the
    model-only step's img/s of section 3 (what the loop around the model costs)."""
    import tempfile

    from vitpe_core.train import train

    model_only = {r["encoding"]: r["img_s"] for r in model_rows
                  if r["preset"] == "compact" and r["precision"] == "bf16"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        n_test = min(500, steps * 64)
        data = synthetic_cifar10(Path(tmp) / "data", steps * 128, n_test)
        for e in ("ape", "sape2", "cope+ape"):
            m = train(TrainConfig(encoding=e, epochs=1, batch_size=128, test_subset=n_test), data_dir=data,
                      out=Path(tmp) / e, progress=False, full_eval=False, device=str(device), precision="bf16")
            img_s = m["images_per_s"]
            rows.append({"encoding": e, "trainer_img_s": img_s, "model_only_img_s": model_only.get(e),
                         "ratio": img_s / model_only[e] if model_only.get(e) else None})
            print(f"trainer {e}: {img_s:.0f} img/s (model only {model_only.get(e) or 0:.0f})", flush=True)
    return rows


def bf16_agreement(device: torch.device, overrides: dict) -> list[dict]:
    """Each encoding's training step (compact preset, batch 64) in bf16 autocast vs float32."""
    rows = []
    for e in ENCODINGS:
        torch.manual_seed(0)
        model = build_model(preset_config("compact", encoding=e, num_classes=10, **overrides)).to(device)
        x = torch.randn(64, 3, *model.cfg.img_size, device=device)
        y = torch.randint(0, 10, (64,), device=device)
        out = {}
        for prec in PRECISIONS:
            model.zero_grad(set_to_none=True)
            with resolve(prec, device).autocast():
                loss = F.cross_entropy(model(x).float(), y)
            loss.backward()
            out[prec] = (float(loss), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        (l32, g32), (l16, g16) = out["fp32"], out["bf16"]
        rows.append({"encoding": e, "loss_fp32": l32, "loss_bf16": l16, "finite": bool(torch.isfinite(g16).all()),
                     "loss_rel": abs(l16 - l32) / abs(l32), "grad_cos": float(F.cosine_similarity(g16, g32, dim=0))})
    return rows


def fused_agreement(device: torch.device) -> list[dict]:
    """The fused SaPE² / CoPE attention against their eager code (`use_kernel=False`) on the device."""
    g = torch.Generator(device="cpu").manual_seed(0)
    B, h, grid, d, P = 4, 4, (8, 8), 32, 1
    T = P + grid[0] * grid[1]
    rows = []
    for prec, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        q, k, v = (torch.randn(B, h, T, d, generator=g).to(device, dtype).requires_grad_() for _ in range(3))
        e_x, e_y = (torch.randn(d, 10, generator=g).mul_(0.5).to(device).requires_grad_() for _ in range(2))
        calls = {"sape2": lambda kern: sape2_attention(q, k, v, e_x, e_y, grid, num_prefix=P, use_kernel=kern),
                 "cope": lambda kern: cope_attention(q, k, v, e_x, use_kernel=kern)}
        for name, call in calls.items():
            got = []
            for kern in (True, False):
                for t in (q, k, v, e_x, e_y):
                    t.grad = None
                out = call(kern)
                out.float().square().sum().backward()
                got.append([out.float()] + [t.grad.float() for t in (q, k, v, e_x) if t.grad is not None])
            err = max(float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(*got))
            rows.append({"function": name, "precision": prec, "max_rel_err": err})
    return rows


def targets(res: dict) -> list[tuple[str, bool, str]]:
    """Issue 43's targets: (what, PASS?, the figures)."""
    out = []
    layer = {(r["shape"], r["precision"], r["row"]): r for r in res["layers"]}
    for shape in {r["shape"] for r in res["layers"]}:
        for prec in PRECISIONS:
            s, rp = layer[(shape, prec, "sape2")], layer[(shape, prec, "rpb")]
            out.append((f"SaPE² layer fwd+bwd ≤ 1.3× rpb ({shape}, {prec})", s["vs_rpb"] <= 1.3,
                        f"{s['ms']:.2f} vs {rp['ms']:.2f} ms: {s['vs_rpb']:.2f}×"))
            if s["peak_extra_mib"] is not None:
                ratio = s["peak_extra_mib"] / rp["peak_extra_mib"]
                out.append((f"SaPE² extra memory ≤ 1.5× rpb ({shape}, {prec})", ratio <= 1.5,
                            f"{s['peak_extra_mib']:.0f} vs {rp['peak_extra_mib']:.0f} MiB: {ratio:.2f}×"))
    for r in res["training"]:
        if r["encoding"] in ("sape2", "cope+ape"):
            out.append((f"{r['encoding']} training ≥ 0.8× ape ({r['preset']}, {r['precision']})", r["vs_ape"] >= 0.8,
                        f"{r['img_s']:.0f} img/s: {r['vs_ape']:.2f}×"))
    for r in res["bf16"]:
        ok = r["finite"] and r["loss_rel"] < 0.02 and r["grad_cos"] > 0.99
        out.append((f"bf16 step of {r['encoding']} within tolerance of float32", ok,
                    f"loss {r['loss_bf16']:.4f} vs {r['loss_fp32']:.4f}, gradient cosine {r['grad_cos']:.4f}"))
    return out


def markdown(res: dict) -> list[str]:
    lines = [f"{HEADING} (`python -m benchmarks.gpu`: {res['device']}, {res['date']}, commit {res['commit']}, "
             f"torch {res['torch']})", "",
             "Issue 43's targets, each from the tables below (PASS when met):", ""]
    lines += [f"* **{'PASS' if ok else 'MISS'}** {what}: {fig}" for what, ok, fig in targets(res)]
    lines += ["", "One attention layer, forward + backward, ms (median of 5 × 10 CUDA-event timings; "
              "ratio to `rpb`; peak extra MiB):", "",
              "| shape | precision | " + " | ".join(LAYER_ROWS) + " |", "|---|---|" + "---|" * len(LAYER_ROWS)]
    by = {(r["shape"], r["precision"], r["row"]): r for r in res["layers"]}
    for shape in dict.fromkeys(r["shape"] for r in res["layers"]):
        for prec in PRECISIONS:
            cells = [by[(shape, prec, r)] for r in LAYER_ROWS]
            lines.append(f"| {shape} | {prec} | " + " | ".join(
                f"{c['ms']:.2f} ({c['vs_rpb']:.2f}×, {c['peak_extra_mib'] or 0:.0f} MiB)" for c in cells) + " |")
    lines += ["", "Training img/s (train.py's step, batch 128, data on the GPU; ratio to `ape`):", "",
              "| preset | precision | encoding | img/s | vs ape |", "|---|---|---|---|---|"]
    lines += [f"| {r['preset']} | {r['precision']} | {r['encoding']} | {r['img_s']:.0f} | {r['vs_ape']:.2f} |"
              for r in res["training"]]
    if res.get("trainer"):
        lines += ["", "`train()` itself (bf16, compact, one epoch of 200 batches of a synthetic CIFAR-10 on the GPU) "
                  "against the model-only step above:", "", "| encoding | trainer img/s | model-only img/s | ratio |",
                  "|---|---|---|---|"]
        lines += [f"| {r['encoding']} | {r['trainer_img_s']:.0f} | {r['model_only_img_s'] or 0:.0f} | "
                  f"{r['ratio'] or 0:.2f} |" for r in res["trainer"]]
    lines += ["", "Fused (Triton) attention against the eager code on this GPU (max relative error over the "
              "output and every gradient): " + ", ".join(
                  f"{r['function']} {r['precision']} {r['max_rel_err']:.1e}" for r in res["fused"]), ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", help="replace the GPU section of this markdown file (e.g. BENCHMARKS.md)")
    ap.add_argument("--json", help="also write the raw results here")
    ap.add_argument("--smoke", action="store_true", help="every section on the CPU at toy sizes (a test; no figures)")
    args = ap.parse_args(argv)
    if args.smoke:
        device, shapes, rounds, calls = torch.device("cpu"), SMOKE_SHAPES, 1, 1
        presets = {"compact": (2, dict(img_size=(12, 16), patch_size=4, dim=32, depth=1, heads=2, mlp_dim=32))}
    elif not torch.cuda.is_available():
        print("no CUDA GPU here: `python -m benchmarks.gpu` measures the fused GPU attention and training on one. "
              "Run it on a machine with an NVIDIA GPU (the CPU figures are `python -m benchmarks.bench`'s).",
              file=sys.stderr)
        return 2
    else:
        device, shapes, rounds, calls = torch.device("cuda"), SHAPES, 5, 10
        presets = {"compact": (128, {}), "paper": (128, {})}
    timer = Timer(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke run, no figures)"
    print(f"device: {name}", flush=True)
    res = {"device": name, "date": datetime.date.today().isoformat(), "commit": git_commit(),
           "torch": torch.__version__}
    res["fused"] = fused_agreement(device) if device.type == "cuda" else []
    res["layers"] = bench_layers(shapes, device, timer, rounds, calls)
    res["training"] = bench_training(presets, device, timer, rounds, calls)
    res["bf16"] = bf16_agreement(device, presets["compact"][1])
    res["trainer"] = trainer_throughput(device, res["training"], 200 if device.type == "cuda" else 1)
    text = "\n".join(markdown(res))
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    if args.write and not args.smoke:
        path = Path(args.write)
        path.write_text(replace_section(path.read_text(), HEADING, text.splitlines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
