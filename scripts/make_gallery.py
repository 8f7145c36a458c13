"""Write the app's CIFAR-10 gallery: 12 test images as tiny PNGs plus an index.

    python scripts/make_gallery.py                       # from data/cifar-10-batches-py
    python scripts/make_gallery.py --data-dir /work/data
    python scripts/make_gallery.py --npz ../shared/data/cifar10_webp.npz

Picks, deterministically, the first test image of every class, then the second one of the
two classes CIFAR models confuse most (cat, dog): 12 images, all 10 classes. Writes
`vitpe_core/assets/gallery/cifar10-test-NNNN.png` (32x32 RGB, NNNN = index in the test
split) and `index.json` ({id: class name}). The PNGs are a few KB in all, commit them.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "vitpe_core" / "assets" / "gallery"
EXTRA = ("cat", "dog")


def load_from_pickles(data_dir: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    import sys
    sys.path.insert(0, str(ROOT))
    from vitpe_core.data import load_cifar
    ds = load_cifar("cifar10", data_dir, "test", cache=False)
    x = ds.images.permute(0, 2, 3, 1).numpy()               # (n, 32, 32, 3) uint8
    return x, ds.labels.numpy(), ds.label_names


def load_from_npz(path: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    tool = Path(__file__).resolve().parents[2] / "shared" / "tools" / "cifar_webp_npz.py"
    spec = importlib.util.spec_from_file_location("cifar_webp_npz", tool)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    d = mod.load(path)
    return d["x_test"], np.asarray(d["y_test"], np.int64), tuple(str(s) for s in d["label_names"])


def pick(labels: np.ndarray, names: tuple[str, ...]) -> list[int]:
    chosen = [int(np.flatnonzero(labels == k)[0]) for k in range(len(names))]
    for name in EXTRA:
        chosen.append(int(np.flatnonzero(labels == names.index(name))[1]))
    return sorted(chosen)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=str(ROOT / "data"), help="folder holding cifar-10-batches-py")
    p.add_argument("--npz", help="read ../shared/data/cifar10_webp.npz instead")
    args = p.parse_args()
    x, y, names = load_from_npz(args.npz) if args.npz else load_from_pickles(args.data_dir)
    OUT.mkdir(parents=True, exist_ok=True)
    index = {}
    for i in pick(y, names):
        gid = f"cifar10-test-{i:04d}"
        Image.fromarray(x[i]).save(OUT / f"{gid}.png", optimize=True)
        index[gid] = names[int(y[i])]
    (OUT / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(index)} images to {OUT.relative_to(ROOT)}: {index}")


if __name__ == "__main__":
    main()
