"""CIFAR-10 / CIFAR-100 held in memory as uint8 tensors: loading, batches, normalisation.

Datasets: Krizhevsky, "Learning Multiple Layers of Features from Tiny Images", tech. report,
Univ. of Toronto, 2009 (https://www.cs.toronto.edu/~kriz/cifar.html). The files read are the
standard python-pickle layouts `cifar-10-batches-py/` and `cifar-100-python/` (the official
tarballs, or `../shared/tools/cifar_export.py` for this project's offline copies).

Checked against: torchvision's `CIFAR10` / `CIFAR100` (same md5 sums per file, same
`(n, 3, 32, 32)` decoding of the flat R|G|B planes). The batched augmentation (random crop and
flip, Mixup / CutMix) is `vitpe_core.augment`.

Shape letters follow docs/encodings.md: `B` batch, `H x W` image rows x columns. A whole dataset
is `(n, 3, 32, 32)` with `n` images (`N` is reserved for patch tokens).

Deliberate deviations:
  * The pickles are loaded with a restricted unpickler that only reconstructs numpy arrays;
    anything else (a pickle that would call `os.system`, say) raises `ValueError`.
  * `verify="auto"` (the default) logs a warning when a file's md5 differs from the official
    one instead of refusing: this project's CIFAR-100 copy is a re-ordered export (same
    images, shuffled), which is legitimate. `verify="strict"` raises.
"""
from __future__ import annotations

import codecs
import hashlib
import io
import logging
import math
import pickle
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Iterator, Literal, Union

import numpy as np

if TYPE_CHECKING:   # torch is imported where it is used: the app draws its first page before torch is loaded
    import torch

try:  # numpy >= 2
    from numpy._core.multiarray import _reconstruct as _np_reconstruct
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct as _np_reconstruct

logger = logging.getLogger(__name__)

Split = Literal["train", "test"]
Verify = Union[Literal["auto", "strict"], bool]

_DOWNLOAD_TIMEOUT_S = 30.0
_CHUNK = 1 << 20


@dataclass(frozen=True)
class CifarSpec:
    """Where a CIFAR variant lives and how its python-pickle files are laid out."""

    folder: str  # folder inside data_dir that the official tarball extracts to
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str
    labels_key: str  # key of the label list inside a data file
    label_names_key: str  # key of the class-name list inside the meta file
    num_classes: int
    url: str
    tgz_md5: str
    md5: dict[str, str]  # per-file md5 sums, as torchvision checks them
    mean: tuple[float, float, float]  # per-channel train-split mean of x / 255
    std: tuple[float, float, float]
    offline_npz: str  # this project's offline copy in ../shared/data


DATASETS: dict[str, CifarSpec] = {
    "cifar10": CifarSpec(
        folder="cifar-10-batches-py",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_files=("test_batch",),
        meta_file="batches.meta",
        labels_key="labels",
        label_names_key="label_names",
        num_classes=10,
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        tgz_md5="c58f30108f718f92721af3b95e74349a",
        md5={
            "data_batch_1": "c99cafc152244af753f735de768cd75f",
            "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
            "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
            "data_batch_4": "634d18415352ddfa80567beed471001a",
            "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
            "test_batch": "40351d587109b95175f43aff81a1287e",
            "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
        },
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        offline_npz="cifar10_webp.npz",
    ),
    "cifar100": CifarSpec(
        folder="cifar-100-python",
        train_files=("train",),
        test_files=("test",),
        meta_file="meta",
        labels_key="fine_labels",
        label_names_key="fine_label_names",
        num_classes=100,
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        tgz_md5="eb9058c3a382ffc7106e4002c42a8d85",
        md5={
            "train": "16019d7e3df5f24257cddd939b257f8d",
            "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
            "meta": "7973b15100ade9c7d40fb424638fde48",
        },
        mean=(0.5071, 0.4865, 0.4409),
        std=(0.2673, 0.2564, 0.2762),
        offline_npz="cifar100_webp.npz",
    ),
}

CIFAR_MEAN: dict[str, tuple[float, float, float]] = {k: s.mean for k, s in DATASETS.items()}
CIFAR_STD: dict[str, tuple[float, float, float]] = {k: s.std for k, s in DATASETS.items()}


@dataclass(frozen=True)
class ImageDataset:
    """A whole split in memory. Index it with `batches` or `subset`; do not modify in place
    (datasets returned by `load_cifar` are shared through its cache)."""

    images: torch.Tensor  # (n, 3, 32, 32) uint8
    labels: torch.Tensor  # (n,) int64
    label_names: tuple[str, ...]

    def __post_init__(self) -> None:
        import torch

        assert self.images.dtype == torch.uint8 and self.images.ndim == 4, self.images.shape
        assert self.labels.dtype == torch.int64 and self.labels.shape == self.images.shape[:1]

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def num_classes(self) -> int:
        return len(self.label_names)


# --------------------------------------------------------------------------- safe unpickling

_SAFE_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _np_reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}


class _CifarUnpickler(pickle.Unpickler):
    """Unpickler that can rebuild numpy arrays, dicts, lists, strings and numbers, nothing else."""

    def __init__(self, file: io.BufferedIOBase, path: Path) -> None:
        super().__init__(file, encoding="latin1")
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _SAFE_GLOBALS[(module, name)]
        except KeyError:
            raise ValueError(
                f"refusing to unpickle {module}.{name} from {self._path}: CIFAR files contain "
                "only numpy arrays, lists and strings. The file is corrupt or not a CIFAR file; "
                "delete it and download or export it again."
            ) from None


def _load_pickle(path: Path) -> dict:
    """Load one CIFAR pickle safely; keys come back as str whether stored as bytes or str."""
    try:
        with open(path, "rb") as f:
            obj = _CifarUnpickler(f, path).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, IndexError, TypeError) as err:
        raise ValueError(
            f"cannot read {path} as a CIFAR pickle ({err}); delete it and download or export it again."
        ) from err
    if not isinstance(obj, dict):
        raise ValueError(f"{path} holds a {type(obj).__name__}, not the dict of a CIFAR file.")
    return {_as_str(k): v for k, v in obj.items()}


def _as_str(v: Any) -> Any:
    return v.decode("latin1") if isinstance(v, bytes) else v


def _field(d: dict, key: str, path: Path) -> Any:
    if key not in d:
        raise ValueError(f"{path} has no '{key}' entry (keys: {sorted(map(str, d))}); is it a CIFAR file?")
    return d[key]


# --------------------------------------------------------------------------- checksums, download


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _verify_file(path: Path, expected: str, verify: Verify) -> None:
    if verify is False:
        return
    actual = _md5(path)
    if actual == expected:
        return
    msg = f"md5 of {path} is {actual}, the official file has {expected}"
    if verify == "strict":
        raise ValueError(
            f"{msg}. Re-download the file, or pass verify='auto' to accept a re-ordered export."
        )
    logger.warning("%s; loading it anyway (a re-ordered export is legitimate).", msg)


def _get_instructions(name: str, data_dir: Path) -> str:
    spec = DATASETS[name]
    dest = data_dir / spec.folder
    return (
        f"To get {name}:\n"
        f"  * download {spec.url} and extract it into {data_dir} (it unpacks to {dest}); or\n"
        f"  * this project's developers, offline: "
        f"python ../shared/tools/cifar_export.py ../shared/data/{spec.offline_npz} "
        f"--pickle-dir {dest}"
    )


def _download(name: str, data_dir: Path) -> None:
    """Fetch the official tarball, check its md5 and extract it safely into data_dir."""
    spec = DATASETS[name]
    data_dir.mkdir(parents=True, exist_ok=True)
    tgz = data_dir / PurePosixPath(spec.url).name
    part = tgz.with_name(tgz.name + ".part")
    logger.info("downloading %s to %s", spec.url, tgz)
    try:
        _fetch(spec.url, part)
    except OSError as err:  # URLError, socket timeouts, connection resets, disk errors
        part.unlink(missing_ok=True)
        raise ValueError(
            f"could not download {name} from {spec.url} ({err}).\n{_get_instructions(name, data_dir)}"
        ) from err
    actual = _md5(part)
    if actual != spec.tgz_md5:
        part.unlink(missing_ok=True)
        raise ValueError(
            f"the downloaded {tgz.name} has md5 {actual}, expected {spec.tgz_md5} (a truncated or "
            f"altered download); it was deleted. Try again.\n{_get_instructions(name, data_dir)}"
        )
    part.replace(tgz)
    _extract(tgz, data_dir)
    tgz.unlink()


def _fetch(url: str, dest: Path) -> None:
    from tqdm.auto import tqdm

    with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as resp, open(dest, "wb") as f:
        total = int(resp.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=PurePosixPath(url).name) as bar:
            for chunk in iter(lambda: resp.read(_CHUNK), b""):
                f.write(chunk)
                bar.update(len(chunk))


def _extract(tgz: Path, data_dir: Path) -> None:
    """Extract regular files and folders only; refuse absolute paths, `..` and links."""
    with tarfile.open(tgz, "r:gz") as tar:
        members = tar.getmembers()
        for m in members:
            p = PurePosixPath(m.name)
            if p.is_absolute() or ".." in p.parts or m.name.startswith(("/", "\\")) or ":" in m.name:
                raise ValueError(f"refusing to extract {tgz}: member '{m.name}' points outside {data_dir}.")
            if not (m.isfile() or m.isdir()):
                raise ValueError(f"refusing to extract {tgz}: member '{m.name}' is a link or device.")
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(data_dir, members=members, **kwargs)


# --------------------------------------------------------------------------- loading

_CACHE: dict[tuple, ImageDataset] = {}


def clear_cache() -> None:
    """Forget every dataset `load_cifar` kept in memory."""
    _CACHE.clear()


def load_cifar(
    name: str,
    data_dir: str | Path,
    split: Split,
    *,
    download: bool = False,
    verify: Verify = "auto",
    cache: bool = True,
) -> ImageDataset:
    """Load one split of CIFAR-10/100 from `<data_dir>/<folder>` into uint8 tensors.

    `verify`: "auto" checks md5 sums and warns on a mismatch, "strict" raises, False skips.
    `download=True` fetches the official tarball when the folder is missing.
    With `cache`, the result is kept per (name, folder, split, verify, file sizes/mtimes).
    Returns images `(n, 3, 32, 32)` uint8 and labels `(n,)` int64 (fine labels for CIFAR-100).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset '{name}'; valid names: {', '.join(sorted(DATASETS))}.")
    if split not in ("train", "test"):
        raise ValueError(f"unknown split '{split}'; use 'train' or 'test'.")
    if verify not in ("auto", "strict", False):
        raise ValueError(f"verify must be 'auto', 'strict' or False, not {verify!r}.")
    spec = DATASETS[name]
    root = Path(data_dir).expanduser()
    folder = root / spec.folder
    data_files = spec.train_files if split == "train" else spec.test_files
    needed = (spec.meta_file, *data_files)
    missing = [f for f in needed if not (folder / f).is_file()]
    if missing:
        if not download:
            raise ValueError(
                f"{name} is not in {folder} (missing: {', '.join(missing)}). Pass download=True "
                f"(--download on the command line) to fetch it, or get it yourself.\n"
                f"{_get_instructions(name, root)}"
            )
        _download(name, root)

    key = (name, str(folder.resolve()), split, verify,
           tuple((f, (folder / f).stat().st_size, (folder / f).stat().st_mtime_ns) for f in needed))
    if cache and key in _CACHE:
        return _CACHE[key]
    ds = _read_split(spec, folder, needed, verify)
    logger.info("loaded %s %s: %d images from %s", name, split, len(ds), folder)
    if cache:
        _CACHE[key] = ds
    return ds


def _read_split(spec: CifarSpec, folder: Path, needed: tuple[str, ...], verify: Verify) -> ImageDataset:
    for f in needed:
        _verify_file(folder / f, spec.md5[f], verify)
    meta_path = folder / spec.meta_file
    names = _field(_load_pickle(meta_path), spec.label_names_key, meta_path)
    label_names = tuple(str(_as_str(s)) for s in names)
    if len(label_names) != spec.num_classes:
        raise ValueError(f"{meta_path} lists {len(label_names)} classes, expected {spec.num_classes}.")

    datas, labels = [], []
    for f in needed[1:]:
        path = folder / f
        d = _load_pickle(path)
        data = np.asarray(_field(d, "data", path))
        lab = np.asarray(_field(d, spec.labels_key, path), dtype=np.int64)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise ValueError(f"{path}: 'data' is {data.dtype} {data.shape}, expected uint8 (n, 3072).")
        if lab.shape != (data.shape[0],):
            raise ValueError(f"{path}: {lab.shape[0]} labels for {data.shape[0]} images.")
        datas.append(data)
        labels.append(lab)
    data = np.concatenate(datas)  # (n, 3072), a fresh writable copy
    y = np.concatenate(labels)  # (n,)
    if y.size and (y.min() < 0 or y.max() >= spec.num_classes):
        raise ValueError(f"labels in {folder} fall outside 0..{spec.num_classes - 1}.")
    import torch

    images = torch.from_numpy(data).view(-1, 3, 32, 32)  # (n, 3, H, W): flat R|G|B planes, row-major
    return ImageDataset(images=images, labels=torch.from_numpy(y), label_names=label_names)


def subset(ds: ImageDataset, n: int, *, seed: int) -> ImageDataset:
    """`n` images drawn without replacement (seeded), kept in their original order."""
    if not 0 < n <= len(ds):
        raise ValueError(f"subset size must be in 1..{len(ds)}, got {n}.")
    import torch

    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(ds), generator=g)[:n].sort().values  # (n,)
    return ImageDataset(images=ds.images[idx], labels=ds.labels[idx], label_names=ds.label_names)


# --------------------------------------------------------------------------- batches, normalisation


def num_batches(n: int, batch_size: int, *, drop_last: bool) -> int:
    """How many batches `batches` yields per epoch for `n` images."""
    return n // batch_size if drop_last else math.ceil(n / batch_size)


def batches(
    ds: ImageDataset,
    batch_size: int,
    *,
    shuffle: bool,
    generator: torch.Generator | None = None,
    drop_last: bool = False,
    start_batch: int = 0,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of `(images (B, 3, H, W) uint8, labels (B,) int64)` batches.

    The permutation is drawn from `generator` when this function is called (one `randperm`);
    `start_batch` skips that many batches of the same permutation, so re-seeding the generator
    to its state at the start of an epoch and passing `start_batch=k` resumes mid-epoch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    if shuffle and generator is None:
        raise ValueError("shuffle=True needs an explicit torch.Generator (generator=...).")
    total = num_batches(len(ds), batch_size, drop_last=drop_last)
    if not 0 <= start_batch <= total:
        raise ValueError(f"start_batch must be in 0..{total} for this epoch, got {start_batch}.")
    import torch

    n = len(ds)
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)  # (n,)
    return _iter_batches(ds, order, batch_size, start_batch, total)


def _iter_batches(
    ds: ImageDataset, order: torch.Tensor, batch_size: int, start: int, total: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    order = order.to(ds.images.device)                      # a dataset on the GPU is indexed there
    for b in range(start, total):
        idx = order[b * batch_size : (b + 1) * batch_size]  # (B,)
        yield ds.images[idx], ds.labels[idx]


def normalize(x: torch.Tensor, name: str) -> torch.Tensor:
    """uint8 `(B, 3, H, W)` -> float32 `(B, 3, H, W)`, `(x / 255 - mean) / std` per channel."""
    import torch

    if name not in CIFAR_MEAN:
        raise ValueError(f"no mean/std for '{name}'; valid names: {', '.join(sorted(CIFAR_MEAN))}.")
    if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[1] != 3:
        raise ValueError(f"normalize expects uint8 (B, 3, H, W), got {x.dtype} {tuple(x.shape)}.")
    mean = torch.tensor(CIFAR_MEAN[name], dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR_STD[name], dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    return (x.float().div_(255.0) - mean) / std
