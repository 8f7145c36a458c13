"""Where a big model's visit takes its memory (issue 47): one visitor imports a ViT-B/16-shaped
model (random weights, `memory_walk_big.vit_npz`) into a fresh server and visits three uploaded
images (the bias page with the model chosen, an upload, a patch click, the compare and similarity
pages); the server's resident memory is sampled every 20 ms and the peak of each step printed.
The big memory walk (`python -m benchmarks.memory_walk --big`) says how high; this says where.

    python -m benchmarks.step_memory            # prints "step  peak RSS MiB", one line per step
"""
from __future__ import annotations

import asyncio
import time

from benchmarks.harness import REPO, streamlit_server
from benchmarks.load_probes import MemorySampler

TIMEOUT = 300.0


async def visit(base: str, peaks: MemorySampler, images: int = 3) -> None:
    from benchmarks.load_ws import upload_png
    from benchmarks.memory_walk_big import vit_npz
    from benchmarks.st_client import open_session

    data = vit_npz(0, "b16")
    s, _ = await open_session(base, "/?page=checkpoints", TIMEOUT)
    try:
        peaks.step = "upload the model"
        await s.upload("checkpoints_model_upload", "vitb16.npz", data)
        del data
        await s.run(timeout=TIMEOUT)
        peaks.step = "import"
        await s.run(timeout=TIMEOUT, trigger=s.trigger("checkpoints_model_import"))
        for i in range(images):
            peaks.step = f"{i}: bias page"
            await s.run(page="bias", timeout=TIMEOUT)
            if "bias_ckpt" in s.page.widgets():
                s.selectbox_set("bias_ckpt", "vitb16-upload")
            peaks.step = f"{i}: upload an image"
            await s.upload("bias_upload", f"step-{i}.png", upload_png(50, i, side=256), "image/png")
            await s.run(timeout=TIMEOUT)
            s.set_number("bias_row", 1 + i)
            s.set_number("bias_col", 2 + i)
            peaks.step = f"{i}: click a patch"
            await s.run(timeout=TIMEOUT)
            for page in ("compare", "similarity"):
                peaks.step = f"{i}: {page} page"
                await s.run(page=page, timeout=TIMEOUT)
    finally:
        await s.close()


def main() -> int:
    with streamlit_server(REPO / "checkpoints", timeout=180, args=("--server.fileWatcherType", "none")) as server:
        time.sleep(8)                                  # the warm-up done: the start is not a step
        peaks = MemorySampler(server.pid, every=0.02)
        peaks.start()
        try:
            asyncio.run(visit(server.url, peaks))
        finally:
            peaks.stop()
    for step, mib in peaks.step_peaks.items():
        print(f"{step:24s} {mib:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
