"""vitpe_core.store: the bounded store of uploaded models."""
from __future__ import annotations

import pytest
import torch

from vitpe_core.store import LRUStore, model_bytes


def test_least_recently_used_goes_first_by_count_and_by_bytes():
    s = LRUStore(max_items=2, max_bytes=100)
    assert s.put("a", "A", 10) == [] and s.put("b", "B", 10) == []
    assert s.get("a") == "A"                      # a is now the most recent
    assert s.put("c", "C", 10) == ["b"] and "b" not in s and len(s) == 2
    assert s.put("d", "D", 85) == ["a"]           # a goes for the count; then 10 + 85 fits
    assert s.bytes == 95 and s.get("d") == "D"
    assert s.put("e", "E", 50) == ["c", "d"]      # c for the count, d for the bytes
    assert s.put("e", "E2", 20) == [] and s.bytes == 20   # a refresh replaces, never double-counts
    with pytest.raises(ValueError, match="at most"):
        s.put("huge", "H", 101)
    assert s.get("e") == "E2" and s.get("missing") is None


def test_model_bytes_counts_parameters_and_buffers():
    m = torch.nn.BatchNorm1d(4)                   # weight, bias (float32) + running stats + a long counter
    assert model_bytes(m) == 4 * 4 * 4 + 8


def test_image_store_is_content_addressed_bounded_and_survives_a_restart(tmp_path):
    from PIL import Image
    from vitpe_core.store import ImageStore, png_bytes
    store = ImageStore(tmp_path / "up", max_bytes=10_000)
    imgs = [Image.new("RGB", (40, 40), (i * 40, 0, 0)) for i in range(3)]
    ids = [store.put(png_bytes(im)) for im in imgs]
    assert len(set(ids)) == 3 and all(len(i) == 64 for i in ids)
    assert store.put(png_bytes(imgs[0])) == ids[0]                     # same content, same id
    again = ImageStore(tmp_path / "up", max_bytes=10_000)              # a new process, same folder
    assert Image.open(__import__("io").BytesIO(again.get(ids[1]))).getpixel((0, 0)) == (40, 0, 0)
    big = Image.effect_noise((80, 80), 64).convert("RGB")              # noise does not compress: ~19 kB
    small = ImageStore(tmp_path / "small", max_bytes=30_000)
    a = small.put(png_bytes(big))
    b = small.put(png_bytes(Image.effect_noise((81, 81), 64).convert("RGB")))
    assert small.get(a) is None and small.get(b) is not None          # the older one went
    assert small.size()[0] == 1


def test_image_store_only_accepts_hashes(tmp_path):
    from vitpe_core.store import ImageStore
    store = ImageStore(tmp_path / "up")
    for bad in ("../../etc/passwd", "abc", "A" * 64, "0" * 63 + "/", "", None):
        assert store.get(bad) is None
    assert not (tmp_path / "up").exists()                               # nothing touched the disk


def test_upload_dir_defaults_to_the_user_cache_not_the_repository(monkeypatch, tmp_path):
    from vitpe_core.store import default_upload_dir
    monkeypatch.delenv("VITPE_UPLOAD_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_upload_dir() == tmp_path / "vitpe" / "uploads"
    monkeypatch.setenv("VITPE_UPLOAD_DIR", str(tmp_path / "x"))
    assert default_upload_dir() == tmp_path / "x"


def test_stores_log_what_they_keep_and_evict(tmp_path, caplog):
    import logging

    from vitpe_core.store import ImageStore, LRUStore
    caplog.set_level(logging.INFO, logger="vitpe_core.store")
    images = ImageStore(tmp_path / "up", max_bytes=150)
    first = images.put(b"x" * 100)
    images.put(b"y" * 100)                                  # over the cap: the first goes
    assert images.get(first) is None
    text = caplog.text
    assert f"stored {first[:12]}" in text and f"evicted {first[:12]}" in text
    models = LRUStore(1, 10)
    models.put("a" * 64, object(), 5)
    models.put("b" * 64, object(), 5)
    assert "evicted aaaaaaaaaaaa" in caplog.text


# ----------------------------------------------------------------------------- imported models on disk
def _ckpt(seed: int = 0, name: str = "vit-upload"):
    from vitpe_core import ViTConfig, build_model
    from vitpe_core.checkpoint import Checkpoint
    torch.manual_seed(seed)
    model = build_model(ViTConfig(img_size=(16, 16), patch_size=4, dim=16, depth=1, heads=2, mlp_dim=32,
                                  num_classes=3, encoding="ape")).eval()
    metrics = {"source": "vit.npz", "family": "timm", "imported": True, "class_names": ["a", "b", "c"],
               "notes": "", "source_dtype": "float32"}
    return Checkpoint(model, model.cfg, metrics, {}, name)


def _sha(text: str) -> str:
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()


def test_model_store_keeps_an_import_exactly_under_its_hash_across_instances(tmp_path):
    from vitpe_core.store import ModelStore
    ck, sha = _ckpt(), _sha("a")
    assert ModelStore(tmp_path).put(sha, ck, torch.float32) and sha in ModelStore(tmp_path)
    back = ModelStore(tmp_path).get(sha)                    # another process, or after a restart
    x = torch.randn(2, 3, 16, 16)
    assert back.name == "vit-upload" and back.metrics["class_names"] == ["a", "b", "c"]
    assert torch.equal(back.model(x), ck.model(x))
    assert ModelStore(tmp_path).get(_sha("unknown")) is None


def test_model_store_accepts_only_hashes_and_drops_a_damaged_file(tmp_path):
    from vitpe_core.store import ModelStore
    store, sha = ModelStore(tmp_path), _sha("b")
    with pytest.raises(ValueError, match="64 hexadecimal"):
        store.put("../../etc/passwd", _ckpt(), torch.float32)
    assert store.get("../x") is None and "../x" not in store
    store.put(sha, _ckpt(), torch.float32)
    path = tmp_path / f"{sha}.safetensors"
    path.write_bytes(path.read_bytes()[:100])                  # torn by hand (the store never writes so)
    assert store.get(sha) is None and not path.exists() and not path.with_suffix(".json").exists()


def test_model_store_is_bounded_least_recently_used_first(tmp_path):
    import os
    from vitpe_core.store import ModelStore
    one = ModelStore(tmp_path / "probe")
    one.put(_sha("probe"), _ckpt(), torch.float32)
    size = one.size()[1]
    store = ModelStore(tmp_path / "s", max_bytes=int(2.5 * size))
    a, b, c = _sha("a"), _sha("b"), _sha("c")
    store.put(a, _ckpt(1), torch.float32)
    store.put(b, _ckpt(2), torch.float32)
    old = (tmp_path / "s" / f"{a}.safetensors").stat().st_mtime_ns - 10**9
    os.utime(tmp_path / "s" / f"{b}.safetensors", ns=(old, old))   # b read least recently
    store.put(c, _ckpt(3), torch.float32)
    assert a in store and c in store and b not in store and store.size()[0] == 2
    assert not ModelStore(tmp_path / "t", max_bytes=size // 2).put(a, _ckpt(), torch.float32)   # over the cap


def test_two_processes_storing_one_model_at_once_leave_one_whole_file(tmp_path):
    import threading
    from vitpe_core.store import ModelStore
    sha, ck = _sha("same"), _ckpt()
    threads = [threading.Thread(target=ModelStore(tmp_path).put, args=(sha, ck, torch.float32)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{sha}.json", f"{sha}.safetensors"]   # no temporaries
    assert ModelStore(tmp_path).get(sha) is not None


def test_model_dir_defaults_under_the_upload_folder(monkeypatch, tmp_path):
    from vitpe_core.store import default_model_dir
    monkeypatch.setenv("VITPE_UPLOAD_DIR", str(tmp_path / "up"))
    monkeypatch.delenv("VITPE_MODEL_DIR", raising=False)
    assert default_model_dir() == tmp_path / "up" / "models"
    monkeypatch.setenv("VITPE_MODEL_DIR", str(tmp_path / "models"))
    assert default_model_dir() == tmp_path / "models"


def test_a_half_precision_import_comes_back_held_in_its_precision(tmp_path):
    """As imported (`hold=True`): a float16 file's layer weights are held in float16 and computed
    in float32, so the model from disk gives the same outputs with half the memory."""
    from vitpe_core.held_precision import held_dtype
    from vitpe_core.store import ModelStore
    ck = _ckpt()
    with torch.no_grad():
        for p in ck.model.parameters():
            p.copy_(p.half().float())                              # the values a float16 file holds
    ck.metrics["source_dtype"] = "float16"
    sha = _sha("half")
    ModelStore(tmp_path).put(sha, ck, torch.float16)
    back = ModelStore(tmp_path).get(sha)
    x = torch.randn(2, 3, 16, 16)
    assert held_dtype(back.model) == torch.float16 and torch.equal(back.model(x), ck.model(x))
