"""The memory walk's big-model run (`python -m benchmarks.memory_walk --big`): two visitors each
import a ViT-B/16-shaped model (random weights built here, timm layout, float16 `.npz` so that it
fits the 200 MB upload cap: 173 MB; 86.6 M parameters, 330 MiB in float32 once imported) and
click through distinct uploaded images on the bias, compare and similarity pages, while the
server runs under a memory limit (`memory_walk.Limit`: a cgroup where one can be made, else an
RSS watch). Recorded after every step: VmRSS, VmHWM, the cgroup's usage; at the end the memory
budget's pools with their evictions as the sidebar's "Server status" says them, and the
evictions the server logged (`vitpe_core.membudget` / `vitpe_core.store`, INFO).

    python -m benchmarks.memory_walk --big                          # 2 ViT-B/16, 60 images, 1 GiB
    python -m benchmarks.memory_walk --big --images 6 --shape s16   # the short version (tests/test_memory_walk.py)

A page answered with an exception, no answer, or a view that does not show the visitor's model
is an error; a model the budget evicted is not (the page says so, and the visitor's next image
uses the checkpoint the page falls back to).
"""
from __future__ import annotations

import io
import re
import threading
import time

SHAPES = {   # timm's ViT-B/16 and ViT-S/16 at 224 px (the short version's smaller import)
    "b16": {"dim": 768, "depth": 12, "heads": 12, "mlp_dim": 3072},
    "s16": {"dim": 384, "depth": 12, "heads": 6, "mlp_dim": 1536},
}
PAGES = ("bias", "compare", "similarity")
EVICTED_LOG = re.compile(r"(memory budget|model store): evicted")
POOL_LINE = re.compile(r"^- (.+?): ([\d.]+) MiB in (\d+) entr(?:y|ies), (\d+) evicted\s*$", re.M)


def vit_npz(seed: int, shape: str = "b16") -> bytes:
    """A timm-layout ViT (224 px, patch 16, 1000 classes, learned table) with random weights, as
    the `.npz` of its state dict in float16 (what a visitor uploads: under the 200 MB cap)."""
    import numpy as np
    import torch

    from vitpe_core import ViTConfig, build_model

    torch.manual_seed(seed)
    model = build_model(ViTConfig(img_size=(224, 224), patch_size=16, num_classes=1000, **SHAPES[shape]))
    sd = {k: v.numpy().astype(np.float16) for k, v in model.state_dict().items()}
    del model
    sd["pos_embed"] = sd.pop("pos_enc.pos_embed")
    buf = io.BytesIO()
    np.savez(buf, **sd)
    return buf.getvalue()


class RssWatch:
    """Samples a process's VmRSS every `every_s` seconds in a thread (where no cgroup limit can
    be set, the walk's peak comes from here and from VmHWM)."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        self.pid, self.every_s, self.peak_mb = pid, every_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from benchmarks.harness import proc_memory
        while not self._stop.is_set():
            try:
                self.peak_mb = max(self.peak_mb, proc_memory(self.pid).get("VmRSS", 0.0))
            except (OSError, ProcessLookupError):
                return
            self._stop.wait(self.every_s)

    def __enter__(self) -> "RssWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(2)


def pool_sizes(text: str) -> dict[str, dict[str, float]]:
    """The "Server status" panel's memory-budget lines -> pool -> {"mib", "entries", "evicted"}."""
    return {m[1]: {"mib": float(m[2]), "entries": int(m[3]), "evicted": int(m[4])} for m in POOL_LINE.finditer(text)}


async def big_walk(base: str, pid: int, record, timeout: float, *, models: int = 2, images: int = 60,
                   shape: str = "b16") -> dict:
    """Each of `models` sessions imports its own model and visits `images / models` distinct
    uploaded images: upload on the bias page with its model chosen, click a patch, then the
    compare and similarity pages. `record(step, seconds, problems)` logs each step."""
    from benchmarks.harness import url_params
    from benchmarks.load_ws import share_link_of, upload_png
    from benchmarks.st_client import open_session

    per_model = -(-images // models)
    seen = 0
    for m in range(models):
        name = f"vit{shape}_{m}"
        t0 = time.perf_counter()
        data = vit_npz(m, shape)
        s, _ = await open_session(base, "/?page=checkpoints", timeout)
        try:
            await s.upload("checkpoints_model_upload", f"{name}.npz", data)
            del data
            await s.run(timeout=timeout)
            await s.run(timeout=timeout, trigger=s.trigger("checkpoints_model_import"))
            ok = f"Imported as `{name}-upload`" in s.page.text()
            record(f"import {name}", time.perf_counter() - t0, s.page.exceptions() + ([] if ok else
                   [f"import not confirmed: {s.page.text()[-300:]}"]))
            if not ok:
                continue
            ckpt = f"{name}-upload"
            for i in range(per_model):
                if seen >= images:
                    break
                t0 = time.perf_counter()
                await s.run(page="bias", timeout=timeout)
                problems = []
                if "bias_ckpt" in s.page.widgets():
                    s.selectbox_set("bias_ckpt", ckpt)
                await s.upload("bias_upload", f"walk-{m}-{i}.png", upload_png(50 + m, i, side=256), "image/png")
                await s.run(timeout=timeout)
                s.set_number("bias_row", 1 + i % 5)
                s.set_number("bias_col", 2 + i % 7)
                await s.run(timeout=timeout)
                problems += s.page.exceptions()
                q = url_params(share_link_of(s) or "")
                if q.get("ckpt") != ckpt:
                    problems.append(f"bias: the view shows {q.get('ckpt')}, not {ckpt}")
                if not (q.get("image") or "").startswith("upload:"):
                    problems.append(f"bias: the view's image is {q.get('image')}, not the upload")
                for page in PAGES[1:]:
                    await s.run(page=page, timeout=timeout)
                    ran = s.page.page_script_hash == s.pages.get(page)
                    problems += s.page.exceptions() + ([] if ran else [f"the server ran another page than {page}"])
                seen += 1
                record(f"image {seen:2d} ({name}): bias, compare, similarity", time.perf_counter() - t0, problems)
        except Exception as e:  # noqa: BLE001 — recorded, the report is still written
            record(f"{name} steps", time.perf_counter() - t0, [f"{type(e).__name__}: {e}"])
        finally:
            await s.close()
    s, _ = await open_session(base, "/?page=checkpoints", timeout)
    text = s.page.text()
    await s.close()
    return {"images_visited": seen, "pools": pool_sizes(text),
            "budget_line": next((ln for ln in text.splitlines() if ln.startswith("Memory budget")), None)}


def log_evictions(log_text: str) -> list[str]:
    """The server log's eviction lines (`vitpe_core.membudget`, `vitpe_core.store`)."""
    return [ln.strip() for ln in log_text.splitlines() if EVICTED_LOG.search(ln)]
