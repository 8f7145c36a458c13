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
