"""Tests for vitpe_core.data: CIFAR pickle loading (safety, checksums, layout), augmentation,
batching. Tiny datasets are written here in the official format; nothing is downloaded."""
from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import tarfile
import urllib.error
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from vitpe_core import data
from vitpe_core.augment import mixup_cutmix, random_crop_flip
from vitpe_core.data import (
    ImageDataset,
    batches,
    load_cifar,
    normalize,
    num_batches,
    subset,
)


@pytest.fixture(autouse=True)
def _fresh_cache():
    data.clear_cache()
    yield
    data.clear_cache()


# --------------------------------------------------------------------------- tiny layouts


def _dump(path: Path, obj: dict) -> None:
    # protocol 2 like the official (Python 2 cPickle) files; bytes keys like the originals
    # as seen from Python 3 with encoding="bytes".
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _flat(x_hwc: np.ndarray) -> np.ndarray:
    """(n, 32, 32, 3) -> (n, 3072) flat R|G|B planes, each row-major."""
    return np.ascontiguousarray(x_hwc.transpose(0, 3, 1, 2).reshape(len(x_hwc), 3072))


def _images(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)  # (n, H, W, 3)


def write_tiny_cifar10(root: Path, per_batch: int = 4, n_test: int = 6) -> dict:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    out = {"train_x": [], "train_y": []}
    for b in range(1, 6):
        x = _images(rng, per_batch)
        y = [int(v) for v in rng.integers(0, 10, per_batch)]
        _dump(folder / f"data_batch_{b}", {
            b"batch_label": f"training batch {b} of 5".encode(),
            b"labels": y,
            b"data": _flat(x),
            b"filenames": [f"img_{b}_{i}.png".encode() for i in range(per_batch)],
        })
        out["train_x"].append(x)
        out["train_y"] += y
    out["train_x"] = np.concatenate(out["train_x"])
    out["test_x"] = _images(rng, n_test)
    out["test_y"] = [i % 10 for i in range(n_test)]
    _dump(folder / "test_batch", {
        b"batch_label": b"testing batch 1 of 1",
        b"labels": out["test_y"],
        b"data": _flat(out["test_x"]),
        b"filenames": [f"test_{i}.png".encode() for i in range(n_test)],
    })
    out["names"] = [f"class{i}" for i in range(10)]
    _dump(folder / "batches.meta", {
        b"num_cases_per_batch": per_batch,
        b"label_names": [s.encode() for s in out["names"]],
        b"num_vis": 3072,
    })
    return out


def write_tiny_cifar100(root: Path, n_train: int = 7, n_test: int = 5) -> dict:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        x = _images(rng, n)
        fine = [int(v) for v in rng.integers(0, 100, n)]
        _dump(folder / split, {
            b"filenames": [f"{split}_{i}.png".encode() for i in range(n)],
            b"batch_label": f"{split}ing batch 1 of 1".encode(),
            b"fine_labels": fine,
            b"coarse_labels": [v // 5 for v in fine],
            b"data": _flat(x),
        })
        out[f"{split}_x"], out[f"{split}_y"] = x, fine
    out["names"] = [f"fine{i}" for i in range(100)]
    _dump(folder / "meta", {
        b"fine_label_names": [s.encode() for s in out["names"]],
        b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)],
    })
    return out


# --------------------------------------------------------------------------- loading


def test_cifar10_layout_loads_with_correct_pixels(tmp_path):
    ref = write_tiny_cifar10(tmp_path)
    train = load_cifar("cifar10", tmp_path, "train", verify=False)
    test = load_cifar("cifar10", str(tmp_path), "test", verify=False)
    assert len(train) == 20 and len(test) == 6
    assert train.images.shape == (20, 3, 32, 32) and train.images.dtype == torch.uint8
    assert train.labels.shape == (20,) and train.labels.dtype == torch.int64
    assert train.labels.tolist() == ref["train_y"] and test.labels.tolist() == ref["test_y"]
    assert train.label_names == tuple(ref["names"]) and train.num_classes == 10
    # pixel (i, c, r, col) is flat entry c*1024 + r*32 + col of row i (R|G|B planes, row-major)
    flat = _flat(ref["test_x"])
    for i, c, r, col in [(0, 0, 0, 0), (0, 1, 0, 0), (0, 2, 31, 0), (3, 0, 5, 17), (5, 2, 31, 31)]:
        assert int(test.images[i, c, r, col]) == int(flat[i, c * 1024 + r * 32 + col])
        assert int(test.images[i, c, r, col]) == int(ref["test_x"][i, r, col, c])
    assert torch.equal(train.images, torch.from_numpy(ref["train_x"]).permute(0, 3, 1, 2))


def test_cifar100_layout_loads_fine_labels(tmp_path):
    ref = write_tiny_cifar100(tmp_path)
    for split, n in (("train", 7), ("test", 5)):
        ds = load_cifar("cifar100", tmp_path, split, verify=False)
        assert ds.images.shape == (n, 3, 32, 32) and ds.images.dtype == torch.uint8
        assert ds.labels.tolist() == ref[f"{split}_y"]
        assert ds.label_names == tuple(ref["names"])
        assert torch.equal(ds.images, torch.from_numpy(ref[f"{split}_x"]).permute(0, 3, 1, 2))


def test_str_keys_load_too(tmp_path):
    """Files re-pickled from Python 3 dicts with str keys (as torchvision sees them) load too."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    x = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3072)
    _dump(folder / "test_batch", {"data": x, "labels": [3, 4]})
    _dump(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    ds = load_cifar("cifar10", tmp_path, "test", verify=False)
    assert ds.labels.tolist() == [3, 4] and ds.label_names[3] == "c3"
    assert int(ds.images[1, 2, 1, 5]) == int(x[1, 2 * 1024 + 32 + 5])


class _Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("victim", ["batches.meta", "test_batch"])
def test_malicious_pickle_is_refused_and_not_run(tmp_path, victim):
    write_tiny_cifar10(tmp_path)
    marker = tmp_path / "pwned"
    _dump(tmp_path / "cifar-10-batches-py" / victim, {b"data": _Evil(marker)})
    with pytest.raises(ValueError, match="refusing to unpickle"):
        load_cifar("cifar10", tmp_path, "test", verify="auto")
    assert not marker.exists()


def test_missing_folder_says_how_to_get_the_files(tmp_path):
    with pytest.raises(ValueError) as err:
        load_cifar("cifar10", tmp_path, "test")
    msg = str(err.value)
    assert "--download" in msg and "download=True" in msg
    assert data.DATASETS["cifar10"].url in msg
    assert str(tmp_path / "cifar-10-batches-py") in msg
    assert "python ../shared/tools/cifar_export.py ../shared/data/cifar10_webp.npz" in msg
    assert f"--pickle-dir {tmp_path / 'cifar-10-batches-py'}" in msg


def test_no_network_gives_the_same_instructions(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(data.urllib.request, "urlopen", offline)
    with pytest.raises(ValueError) as err:
        load_cifar("cifar100", tmp_path, "train", download=True)
    msg = str(err.value)
    assert "cifar-100-python.tar.gz" in msg and "no network" in msg
    assert f"cifar100_webp.npz --pickle-dir {tmp_path / 'cifar-100-python'}" in msg
    assert not list(tmp_path.glob("*.part"))


def _tarball(src_root: Path, members: dict[str, Path] | None = None, evil: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        if evil is not None:
            info = tarfile.TarInfo(evil)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"bad"))
        else:
            tar.add(src_root / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    return buf.getvalue()


class _FakeResponse(io.BytesIO):
    def __init__(self, payload: bytes):
        super().__init__(payload)
        self.headers = {"Content-Length": str(len(payload))}


def _serve(monkeypatch, payload: bytes) -> None:
    spec = replace(data.DATASETS["cifar10"], tgz_md5=hashlib.md5(payload).hexdigest())
    monkeypatch.setitem(data.DATASETS, "cifar10", spec)
    monkeypatch.setattr(data.urllib.request, "urlopen", lambda url, timeout: _FakeResponse(payload))


def test_download_checks_md5_extracts_and_loads(tmp_path, monkeypatch):
    ref = write_tiny_cifar10(tmp_path / "src")
    _serve(monkeypatch, _tarball(tmp_path / "src"))
    ds = load_cifar("cifar10", tmp_path / "dl", "test", download=True, verify=False)
    assert ds.labels.tolist() == ref["test_y"]
    assert not list((tmp_path / "dl").glob("*.tar.gz*"))  # tarball removed after extraction


def test_download_refuses_path_traversal(tmp_path, monkeypatch):
    _serve(monkeypatch, _tarball(tmp_path, evil="../escaped"))
    with pytest.raises(ValueError, match="refusing to extract"):
        load_cifar("cifar10", tmp_path / "dl", "test", download=True)
    assert not (tmp_path / "escaped").exists()


def test_download_with_wrong_md5_is_rejected(tmp_path, monkeypatch):
    write_tiny_cifar10(tmp_path / "src")
    _serve(monkeypatch, _tarball(tmp_path / "src"))
    spec = replace(data.DATASETS["cifar10"], tgz_md5="0" * 32)
    monkeypatch.setitem(data.DATASETS, "cifar10", spec)
    with pytest.raises(ValueError, match="md5"):
        load_cifar("cifar10", tmp_path / "dl", "test", download=True)
    assert not (tmp_path / "dl" / "cifar-10-batches-py").exists()


def test_md5_mismatch_warns_under_auto_and_raises_under_strict(tmp_path, caplog):
    write_tiny_cifar10(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vitpe_core.data"):
        ds = load_cifar("cifar10", tmp_path, "test", verify="auto")
    assert len(ds) == 6
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "test_batch" in warned and "batches.meta" in warned
    with pytest.raises(ValueError, match="md5 of .*test_batch|md5 of .*batches.meta"):
        load_cifar("cifar10", tmp_path, "test", verify="strict")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(name="cifar1000", split="test"), "cifar10, cifar100"),
        (dict(name="cifar10", split="val"), "'train' or 'test'"),
        (dict(name="cifar10", split="test", verify="yes"), "verify must be"),
    ],
)
def test_bad_arguments_raise_value_error(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_cifar(data_dir=tmp_path, **kwargs)


def test_cache_returns_same_object_and_notices_rewrites(tmp_path):
    write_tiny_cifar10(tmp_path)
    a = load_cifar("cifar10", tmp_path, "test", verify=False)
    assert load_cifar("cifar10", tmp_path, "test", verify=False) is a
    assert load_cifar("cifar10", tmp_path, "test", verify=False, cache=False) is not a
    folder = tmp_path / "cifar-10-batches-py"
    _dump(folder / "test_batch", {b"data": np.zeros((1, 3072), np.uint8), b"labels": [9]})
    assert load_cifar("cifar10", tmp_path, "test", verify=False).labels.tolist() == [9]


def test_subset_is_seeded_and_ordered(tmp_path):
    write_tiny_cifar10(tmp_path)
    ds = load_cifar("cifar10", tmp_path, "train", verify=False)
    a, b = subset(ds, 5, seed=3), subset(ds, 5, seed=3)
    assert len(a) == 5 and torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    with pytest.raises(ValueError, match="subset size"):
        subset(ds, 21, seed=0)


# --------------------------------------------------------------------------- real CIFAR-10


@pytest.mark.slow      # the export of all 60,000 images: about 5 s on 2 cores
@pytest.mark.shared
def test_real_cifar10_test_split(cifar10_dir):
    """../shared's export (conftest's `cifar10_dir`, once per session) passes the official md5 checks."""
    ds = load_cifar("cifar10", cifar10_dir, "test", verify="strict")
    assert len(ds) == 10000 and ds.images.shape == (10000, 3, 32, 32)
    assert ds.labels.bincount(minlength=10).tolist() == [1000] * 10
    assert ds.label_names[0] == "airplane" and ds.label_names[9] == "truck"
    x = normalize(ds.images, "cifar10")
    assert x.dtype == torch.float32 and abs(float(x.mean())) < 0.05


# --------------------------------------------------------------------------- augmentation


def _toy(b: int = 8, h: int = 6, w: int = 7) -> torch.Tensor:
    return torch.randint(1, 256, (b, 3, h, w), generator=torch.Generator().manual_seed(0)).to(torch.uint8)


def test_normalize_matches_formula():
    x = _toy()
    out = normalize(x, "cifar100")
    mean = torch.tensor(data.CIFAR_MEAN["cifar100"]).view(1, 3, 1, 1)
    std = torch.tensor(data.CIFAR_STD["cifar100"]).view(1, 3, 1, 1)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, (x.float() / 255 - mean) / std)
    with pytest.raises(ValueError, match="valid names"):
        normalize(x, "imagenet")


def test_crop_flip_shape_and_determinism():
    x = _toy()
    a = random_crop_flip(x, generator=torch.Generator().manual_seed(5))
    b = random_crop_flip(x, generator=torch.Generator().manual_seed(5))
    c = random_crop_flip(x, generator=torch.Generator().manual_seed(6))
    assert a.shape == x.shape and a.dtype == torch.uint8
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_crop_is_a_window_of_the_padded_image():
    x, p = _toy(b=16), 2
    out = random_crop_flip(x, padding=p, generator=torch.Generator().manual_seed(1))
    # replay the draws in the documented order: row offsets, column offsets, flips
    g = torch.Generator().manual_seed(1)
    oy = torch.randint(0, 2 * p + 1, (16,), generator=g)
    ox = torch.randint(0, 2 * p + 1, (16,), generator=g)
    flip = torch.rand(16, generator=g) < 0.5
    assert 0 < int(flip.sum()) < 16
    H, W = x.shape[-2:]
    for i in range(16):
        padded = torch.zeros(3, H + 2 * p, W + 2 * p, dtype=torch.uint8)
        padded[:, p:p + H, p:p + W] = x[i]
        want = padded[:, oy[i]:oy[i] + H, ox[i]:ox[i] + W]
        if flip[i]:
            want = want.flip(-1)
        assert torch.equal(out[i], want), i


def test_crop_without_padding_only_flips():
    x = _toy()
    out = random_crop_flip(x, padding=0, generator=torch.Generator().manual_seed(2))
    for i in range(len(x)):
        assert torch.equal(out[i], x[i]) or torch.equal(out[i], x[i].flip(-1))


@pytest.mark.parametrize("switch_prob", [0.0, 1.0])  # 0: always mixup, 1: always cutmix
@pytest.mark.parametrize("seed", range(3))
def test_mixup_cutmix_soft_targets(seed, switch_prob):
    x = torch.randn(6, 3, 8, 8)
    y = torch.tensor([0, 1, 2, 3, 4, 5])
    out, t = mixup_cutmix(x, y, 10, switch_prob=switch_prob, generator=torch.Generator().manual_seed(seed))
    assert out.shape == x.shape and t.shape == (6, 10) and t.dtype == torch.float32
    torch.testing.assert_close(t.sum(1), torch.ones(6))
    assert torch.all(t >= 0)
    # sample i is paired with sample B-1-i: the mass sits on those two classes (+ smoothing)
    off, on = 0.1 / 10, 0.9
    lam = float(t[0, 0] - off) / on
    assert 0.0 <= lam <= 1.0 + 1e-6
    torch.testing.assert_close(t[0, 5], torch.tensor(off + on * (1 - lam)))
    assert torch.all(t[0, 1:5] == off)
    if switch_prob == 0.0:  # mixup: a blend with the flipped batch
        torch.testing.assert_close(out, x * lam + x.flip(0) * (1 - lam))
    else:  # cutmix: a box pasted from the partner; lam corrected to the box area
        from_pair = (out == x.flip(0)) & (out != x)
        assert torch.all((out == x) | from_pair)
        assert abs(float(from_pair[0, 0].float().mean()) - (1 - lam)) < 1e-5
        assert torch.equal(from_pair[0], from_pair[5])  # same box for the whole batch
    out2, t2 = mixup_cutmix(x, y, 10, switch_prob=switch_prob, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(out, out2) and torch.equal(t, t2)


def test_mixup_off_is_label_smoothing_only():
    x, y = torch.randn(4, 3, 4, 4), torch.tensor([0, 1, 2, 3])
    out, t = mixup_cutmix(x, y, 4, mixup_alpha=0, cutmix_alpha=0, label_smoothing=0.0,
                          generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, x) and torch.equal(t, torch.eye(4))
    with pytest.raises(ValueError, match="float"):
        mixup_cutmix(x.to(torch.uint8), y, 4, generator=torch.Generator())


def _ds(n: int) -> ImageDataset:
    return ImageDataset(
        images=torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 3, 2, 2).contiguous(),
        labels=torch.arange(n, dtype=torch.int64),
        label_names=("a",),
    )


@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_cover_every_index_once(drop_last):
    ds, bs = _ds(23), 5
    got = list(batches(ds, bs, shuffle=True, generator=torch.Generator().manual_seed(0), drop_last=drop_last))
    assert len(got) == num_batches(23, bs, drop_last=drop_last)
    seen = torch.cat([y for _, y in got])
    assert all(len(y) == bs for _, y in got[:4])
    if drop_last:
        assert len(seen) == 20 and len(set(seen.tolist())) == 20
    else:
        assert sorted(seen.tolist()) == list(range(23))
    for xb, yb in got:  # images travel with their labels
        assert torch.equal(xb[:, 0, 0, 0].long(), yb)


def test_batches_start_batch_resumes_same_permutation():
    ds = _ds(23)
    full = [y for _, y in batches(ds, 4, shuffle=True, generator=torch.Generator().manual_seed(7))]
    rest = [y for _, y in batches(ds, 4, shuffle=True, generator=torch.Generator().manual_seed(7), start_batch=3)]
    assert len(rest) == len(full) - 3
    assert all(torch.equal(a, b) for a, b in zip(full[3:], rest))
    ordered = torch.cat([y for _, y in batches(ds, 4, shuffle=False)])
    assert ordered.tolist() == list(range(23))
    with pytest.raises(ValueError, match="start_batch"):
        batches(ds, 4, shuffle=False, start_batch=7)
    with pytest.raises(ValueError, match="Generator"):
        batches(ds, 4, shuffle=True)
