"""Record every checkpoint's top-1 on a fixed subset of the CIFAR-10 test split, for the fast
reproduction test (tests/test_shipped_checkpoints.py compares the counts exactly).

    python scripts/record_subset_accuracy.py                    # CIFAR-10 exported from ../shared
    python scripts/record_subset_accuracy.py --data-dir data    # a folder holding cifar-10-batches-py

The subset is the first `--count` images (default 256) of the test split in its stored order
(the official test_batch order; ../shared's export is byte-identical to it); the file records
their sha256 so that the test can tell other data from other weights. For every checkpoint the
test evaluates (checkpoints/*.safetensors, checkpoints/seeds/, checkpoints/long/) it writes the
number of subset images classified right, that as a percentage, the class it predicts for each
image (the test compares every one, not only the count), the smallest gap between the two
largest logits over the subset (how far the closest call is from flipping under rounding), and
the sha256 of the weights it measured. Rerun it after retraining or adding a checkpoint.
Evaluation runs on the CPU in float32 with the evaluation batch size of `vitpe_core evaluate`.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from vitpe_core.checkpoint import list_checkpoints, load_checkpoint, read_checkpoint_file  # noqa: E402
from vitpe_core.data import ImageDataset, load_cifar  # noqa: E402
from vitpe_core.evaluate import first_images, top1_predictions  # noqa: E402

CHECKPOINTS = REPO / "checkpoints"
OUT = CHECKPOINTS / "subset_accuracy.json"
SHARED = REPO.parent / "shared"
COUNT = 256       # a quarter of the 1,000 it was: the suite's time; each prediction is checked
BATCH_SIZE = 500          # predict's default, as `vitpe_core evaluate` uses
COMMAND = "python scripts/record_subset_accuracy.py"


def evaluated_checkpoints(root: Path = CHECKPOINTS) -> list[Path]:
    """The shipped rows, then the study's reruns: second seeds (seeds/) and 50-epoch runs (long/)."""
    return ([root / f"{n}.safetensors" for n in list_checkpoints(root)]
            + sorted((root / "seeds").glob("*.safetensors")) + sorted((root / "long").glob("*.safetensors")))


def key_of(path: Path, root: Path = CHECKPOINTS) -> str:
    """`ape`, `seeds/ape-seed1`, `long/ape`: the path under checkpoints/ without its suffix."""
    return path.relative_to(root).with_suffix("").as_posix()


def weights_sha256(path: Path) -> str:
    """sha256 of the stored tensors (names, dtypes, shapes, bytes in name order): unchanged when
    only a checkpoint's metrics are rewritten."""
    _, tensors = read_checkpoint_file(path)
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def subset_sha256(ds: ImageDataset) -> dict[str, str]:
    return {"images_sha256": hashlib.sha256(ds.images.contiguous().numpy().tobytes()).hexdigest(),
            "labels_sha256": hashlib.sha256(ds.labels.contiguous().numpy().tobytes()).hexdigest()}


def measure(path: Path, sub: ImageDataset) -> dict:
    ckpt = load_checkpoint(path)                 # float32 on the CPU
    predicted, gap = top1_predictions(ckpt.model, sub, "cifar10", batch_size=BATCH_SIZE, device="cpu")
    correct = int((predicted == sub.labels).sum())
    return {"correct": correct, "top1": round(100.0 * correct / len(sub), 2), "min_logit_gap": float(f"{gap:.3g}"),
            "weights_sha256": weights_sha256(path), "predicted": digits(predicted)}


def digits(classes: torch.Tensor) -> str:
    """Predicted classes as one digit per image (CIFAR-10 has ten): a line of the record, not 256."""
    return "".join(map(str, classes.tolist()))


def export_shared(into: Path) -> Path:
    """../shared's CIFAR-10 in the standard layout (its own export tool), under `into`."""
    npz = SHARED / "data" / "cifar10_webp.npz"
    if not npz.is_file():
        raise SystemExit(f"{npz} not found: pass --data-dir with a folder holding cifar-10-batches-py")
    subprocess.run([sys.executable, str(SHARED / "tools" / "cifar_export.py"), str(npz),
                    "--pickle-dir", str(into / "cifar-10-batches-py")], check=True, capture_output=True)
    return into


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, help="folder holding cifar-10-batches-py (default: export ../shared's)")
    ap.add_argument("--count", type=int, default=COUNT, help=f"the first COUNT test images (default {COUNT})")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    torch.set_grad_enabled(False)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir or export_shared(Path(tmp))
        sub = first_images(load_cifar("cifar10", data_dir, "test", verify="strict"), args.count)
    paths = evaluated_checkpoints()
    for p in paths:
        dataset = (load_checkpoint(p).metrics.get("recipe") or {}).get("dataset", "cifar10")
        if dataset != "cifar10":
            raise SystemExit(f"{p}: trained on {dataset}; this record covers CIFAR-10 checkpoints only")
    record = {
        "about": "Top-1 of every checkpoint on the first `count` images of the CIFAR-10 test split (stored "
                 "order), written by scripts/record_subset_accuracy.py; tests/test_shipped_checkpoints.py "
                 "checks each `correct` exactly.",
        "command": COMMAND + (f" --count {args.count}" if args.count != COUNT else ""),
        "dataset": "cifar10", "split": "test", "subset": "first", "count": args.count, **subset_sha256(sub),
        "device": "cpu", "dtype": "float32", "batch_size": BATCH_SIZE, "torch": torch.__version__,
        "checkpoints": {},
    }
    for p in paths:
        record["checkpoints"][key_of(p)] = m = measure(p, sub)
        print(f"{key_of(p):24s} {m['correct']:5d}/{args.count}  {m['top1']:6.2f}  gap {m['min_logit_gap']:.2e}",
              flush=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
