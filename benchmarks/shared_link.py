"""Visitors of one shared link to a big imported model (issue 47's turns, `vitpe_core.turns`): one
visitor imports a ViT-B/16-shaped model (random weights, `memory_walk_big.vit_npz`) into a fresh
server and shares its bias-explorer link; then `--visitors` sessions open that link at once, each
uploads an image of its own (the model traces it) and clicks `--clicks` patches. Prints the latency
(p50 / p95 / max) of opening the link, of the upload and of each click, the turns the server log
says were waited for, and the server's peak resident memory.

    python -m benchmarks.shared_link                       # 6 visitors x (an upload, 5 clicks)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time

from benchmarks.harness import REPO, streamlit_server, url_params
from benchmarks.load_probes import MemorySampler, cpu_model, percentile
from benchmarks.memory_walk_big import vit_npz
from benchmarks.replicas import make_link

TIMEOUT = 300.0


async def visitor(base: str, link: str, i: int, clicks: int, upload: bool, out: dict[str, list[float]],
                  errors: list[str]) -> None:
    """Open `link`, upload an image of its own (`upload`), then click `clicks` random patches (as the
    page takes a click: `load_ws.click_state`), each answer checked to show the clicked patch."""
    from benchmarks.load_ws import click_state, share_link_of
    from benchmarks.st_client import open_session

    rng = random.Random(i)
    t0 = time.perf_counter()
    s, _ = await open_session(base, "/?" + link.split("?", 1)[1], TIMEOUT)
    out["open"].append(time.perf_counter() - t0)
    try:
        if upload:                      # an image of its own: the model traces it (seconds for a ViT-B/16)
            from benchmarks.load_ws import upload_png
            t0 = time.perf_counter()
            await s.upload("bias_upload", f"visitor-{i}.png", upload_png(60, i, side=256), "image/png")
            await s.run(timeout=TIMEOUT)
            out["upload"].append(time.perf_counter() - t0)
            errors += s.page.exceptions()
        for _ in range(clicks):
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            r, c = rng.randrange(14), rng.randrange(14)
            click_state(s, "bias", (r, c), (14, 14))
            t0 = time.perf_counter()
            await s.run(timeout=TIMEOUT)
            out["click"].append(time.perf_counter() - t0)
            shown = url_params(share_link_of(s) or "").get("patch")
            errors += s.page.exceptions() + ([] if shown == f"{r},{c}" else [f"clicked {r},{c}, shown {shown}"])
    finally:
        await s.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--visitors", type=int, default=6)
    ap.add_argument("--clicks", type=int, default=5)
    ap.add_argument("--no-upload", action="store_true", help="the visitors keep the link's image (no trace to compute)")
    args = ap.parse_args(argv)
    with streamlit_server(REPO / "checkpoints", timeout=180, args=("--server.fileWatcherType", "none")) as server:
        link = asyncio.run(make_link(server.url, TIMEOUT, model=("sharedb16.npz", vit_npz(7, "b16")), image=False))
        sampler = MemorySampler(server.pid)
        sampler.start()
        latencies: dict[str, list[float]] = {"open": [], "upload": [], "click": []}
        errors: list[str] = []

        async def all_visitors():
            await asyncio.gather(*(visitor(server.url, link, i, args.clicks, not args.no_upload, latencies, errors)
                                   for i in range(args.visitors)))

        t0 = time.perf_counter()
        asyncio.run(all_visitors())
        wall = time.perf_counter() - t0
        peak = sampler.stop()
        waits = re.findall(r"turns: .* waited ([\d.]+) s", server.log_tail(10**6))
    report = {"cpu": cpu_model(), "visitors": args.visitors, "clicks": len(latencies["click"]),
              "wall_s": round(wall, 1), "turn_waits_logged": len(waits), "peak_rss_mb": round(peak, 1),
              "errors": errors}
    for what, xs in latencies.items():   # opening the link (all at once), an upload, then each click
        if xs:
            report[what] = {"p50_s": round(percentile(xs, 50), 2), "p95_s": round(percentile(xs, 95), 2),
                            "max_s": round(max(xs), 2)}
    print(json.dumps(report))
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
