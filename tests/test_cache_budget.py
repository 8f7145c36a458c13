"""The app's caches and stores (pages/common/cache.py and the pages' helpers) count their entries
in bytes against the process's one memory budget (`vitpe_core.membudget.shared()`): each one,
called with real arguments, makes room by evicting another pool's least recently used entry;
traces of big models are kept in float16. Checkpoints: tests/conftest.py's `app_checkpoint_dir`."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from vitpe_core import analysis, membudget
from vitpe_core.gallery import gallery_ids

FILLER = "filler"


@pytest.fixture
def budget(app_checkpoint_dir, tmp_path, monkeypatch):
    """The process's budget, emptied and set to 64 MiB for the test, restored afterwards."""
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(app_checkpoint_dir))
    monkeypatch.setenv("VITPE_UPLOAD_DIR", str(tmp_path / "uploads"))
    b = membudget.shared()
    saved = b.max_bytes
    b.clear()
    b.resize(64 * 2**20)
    yield b
    b.clear()
    b.resize(saved)


def _ref(name: str):
    from pages.common import cache
    return cache.model_ref(name)


def _cases():
    """(pool name, the cached function, a thunk that calls it with real arguments); CASES names them."""
    from pages.common import cache, film, picker, stress_panel, upload_store, uploads
    from vitpe_core import stress, views
    key = gallery_ids()[0]
    img = Image.effect_noise((64, 48), 50).convert("RGB")
    png = io.BytesIO()
    img.save(png, "PNG")

    def stored():
        image_id = upload_store.store_upload(img)
        return upload_store._stored_image(image_id, str(upload_store.image_store().folder))

    def transformed():
        tf = stress.Transform((32, 32), (0, 4), "zero")
        return stress_panel._transformed(_ref("ape"), key, tuple(tf.size), tuple(tf.shift), tf.fill, None)

    grids = views.film_grids({0: np.eye(64, dtype=np.float32), 1: np.eye(64, dtype=np.float32)}, (8, 8))
    display = np.zeros((64, 64, 3), np.uint8)
    return [
        ("checkpoints", cache._load_file, lambda: cache.get_checkpoint("ape")),
        ("configs", cache._config_file, lambda: cache.checkpoint_config("rpb")),
        ("headers", cache._header_file, lambda: cache.checkpoint_header("rpb")),
        ("uploaded images", upload_store._stored_image, stored),
        ("traces", cache._trace, lambda: cache.trace("ape", key)),
        ("positional views", cache._positional, lambda: cache.positional("rpb", key, (1, 2))),
        ("attention stats", cache._stats, lambda: cache.attention_stats("ape", key)),
        ("similarity", cache._similarity, lambda: cache.similarity("ape")),
        ("structure history", cache._structure_history, lambda: cache.structure_history("ape")),
        ("position analysis", cache._position, lambda: cache.position_analysis("rpb")),
        ("rollouts", stress_panel._rollout, lambda: stress_panel.rollout("ape", key, "mean", cache.trace("ape", key))),
        ("stress traces", stress_panel._transformed, transformed),
        ("GIFs", film._gif, lambda: film._gif(grids)),
        ("picker figures", picker._picker_spec,
         lambda: picker._picker_spec(png.getvalue(), 64, 48, {0: 4.0}, {0: 4.0})),
        ("picker images", picker._png_of, lambda: picker._png(img)),
        ("grid pictures", picker._grid_picture, lambda: picker._grid_picture(display, (8, 8))),
        ("decoded uploads", uploads._decode, lambda: uploads._decode(png.getvalue())),
    ]


CASES = ["checkpoints", "configs", "headers", "uploaded images", "traces", "positional views", "attention stats",
         "similarity", "structure history", "position analysis", "rollouts", "stress traces", "GIFs", "picker figures",
         "picker images", "grid pictures", "decoded uploads"]


@pytest.mark.parametrize("label", CASES)
def test_each_cache_evicts_by_bytes_against_the_one_budget(budget, label):
    """Fill the budget with one entry of another pool, leaving less room than the cache's result
    takes: computing the result evicts that entry (the least recently used), the result is
    counted in its pool with its estimated bytes, and the total stays within the budget."""
    (name, fn, call), = [c for c in _cases() if c[0] == label]
    assert fn.pool.budget is budget and fn.pool.name == name
    call()                                              # what it weighs (and its inputs: checkpoint, trace)
    size = fn.pool.bytes
    assert size > 0
    budget.clear()
    call()                                              # inputs cached again, the result too
    fn.pool.clear()
    filler = budget.pool(FILLER)
    evictions = filler.evictions
    filler.put("x", object(), budget.max_bytes - budget.total - size // 2)   # room for half the result
    for pool in (budget.pool(n) for n in budget.sizes() if n != FILLER):
        for k in pool.keys():
            pool.get(k)                                 # the filler is now the least recently used
    result = call()
    assert "x" not in filler and filler.evictions == evictions + 1
    assert fn.pool.bytes == size and len(fn.pool) >= 1 and budget.total <= budget.max_bytes
    assert call() is result                             # now answered from the pool, the same object


def test_imported_models_and_checkpoints_share_the_budget_with_traces(budget):
    """A model put in the imported-model store evicts the least recently used traces and
    checkpoints; a trace computed later evicts the least recently used model."""
    from pages.common import cache, imported
    from vitpe_core.store import model_bytes
    key = gallery_ids()[0]
    for name in ("ape", "rpb", "sape2+ape"):
        cache.trace(name, key)
    ckpt = cache.get_checkpoint("ape")
    size = model_bytes(ckpt.model)
    store = imported.model_store()
    assert store.budget is budget
    budget.resize(budget.total + size // 2)             # no room for the model without evictions
    traces = cache._trace.pool
    before = len(traces)
    assert store.put("a" * 64, ckpt, size) == []        # none of the store's own: others made room
    assert "a" * 64 in store and len(traces) < before and budget.total <= budget.max_bytes
    for pool in (traces, cache._load_file.pool):
        for k in pool.keys():
            pool.get(k)                                 # the model is now the least recently used
    budget.resize(budget.total + 1)
    cache.trace("none", key)                            # its checkpoint and trace need room
    assert "a" * 64 not in store and budget.total <= budget.max_bytes
    assert cache._trace.is_cached(cache.model_ref("none"), key, None)


def test_two_traces_fit_a_third_evicts_the_oldest(budget):
    from pages.common import cache
    keys = gallery_ids()[:3]
    cache.get_checkpoint("ape")
    cache.trace("ape", keys[0])
    one = cache._trace.pool.bytes
    budget.resize(budget.total + one + one // 2)        # room for one more trace, not two
    cache.trace("ape", keys[1])
    cache.trace("ape", keys[0])                         # keys[0] used again: keys[1] is the older
    cache.trace("ape", keys[2])
    held = cache._trace.pool.keys()
    assert [k[2] for k in held] == [keys[0], keys[2]] and budget.total <= budget.max_bytes


def test_a_big_models_trace_is_kept_in_float16_and_read_as_float32(budget):
    """A 224-px-sized trace (12 layers × 12 heads × 197²) is stored in float16, half its float32
    bytes; the page's per-patch maps come out float32 and equal the full trace's to float16
    precision; `attention_stats` and rollout read it."""
    from pages.common import cache, imported
    from vitpe_core.checkpoint import Checkpoint
    from vitpe_core.config import preset_config
    from vitpe_core.model import build_model
    from vitpe_core import positional
    cfg = preset_config("compact", encoding="rpb", img_size=(224, 224), patch_size=16, depth=12, heads=12, dim=96)
    model = build_model(cfg).eval()
    ckpt = Checkpoint(model, cfg, {}, {}, "big-upload")
    from vitpe_core.store import model_bytes
    imported.model_store().put("b" * 64, ckpt, model_bytes(model))
    ref = cache.ModelRef("imported", "b" * 64)
    key = gallery_ids()[0]
    tr = cache._trace(ref, key, None)
    from vitpe_core.inputs import checkpoint_input
    from vitpe_core.gallery import gallery_image
    full = analysis.trace_image(model, checkpoint_input(gallery_image(key), ckpt))
    assert tr.attn.dtype == np.float16 and tr.bias.dtype == np.float16 and tr.logits.dtype == np.float32
    assert analysis.trace_bytes(tr) * 2 == analysis.trace_bytes(full) > analysis.COMPACT_ABOVE
    assert cache._trace.pool.bytes < analysis.trace_bytes(full) * 0.6
    got, want = analysis.patch_maps(tr, (3, 5)), analysis.patch_maps(full, (3, 5))
    for k in want:
        assert got[k].dtype == np.float32
        np.testing.assert_allclose(got[k], want[k], rtol=2e-3, atol=1e-4)
    s, s0 = analysis.attention_stats(tr), analysis.attention_stats(full)
    np.testing.assert_allclose(s["mean_distance"], s0["mean_distance"], rtol=2e-3)
    np.testing.assert_allclose(positional.rollout(tr.attn), positional.rollout(full.attn), atol=2e-3)
    small = cache.trace("ape", key)                     # a compact model's trace stays float32
    assert small.attn.dtype == np.float32 and not small.attn.flags.writeable


def test_the_status_panel_lists_every_pool_with_its_bytes(budget):
    from pages.common import cache, status
    cache.trace("ape", gallery_ids()[0])
    text = status.budget_text(*cache.budget_sizes())
    assert "Memory budget (`VITPE_CACHE_MB`)" in text and "of 64 MiB" in text
    assert "- traces:" in text and "- checkpoints:" in text and "evicted" in text
