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
