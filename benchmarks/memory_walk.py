"""The app's memory under a small host's limit: the server runs in a memory cgroup capped at
`--limit-mb` (default 1024 MiB) while one visitor after another opens every page with every
checkpoint of the folder (a new session per page and checkpoint, as a shared link opens), clicks
a patch on each bias page, uploads an image and imports a small model; the server's peak
resident memory is the figure for the README's "Host a demo".

    python -m benchmarks.memory_walk                       # checkpoints/, 1 GiB -> artifacts/memory_walk.json
    python -m benchmarks.memory_walk --limit-mb 0          # no limit: measure only
    python -m benchmarks.memory_walk --big                 # two imported ViT-B/16, 60 images (memory_walk_big.py)

How the limit is set, first that works: a child of this process's cgroup v2 (`memory.max`, swap
off with `memory.swap.max`), a child of its cgroup v1 memory controller (`memory.limit_in_bytes`,
and `memory.memsw.limit_in_bytes` where swap accounting exists), `systemd-run --scope -p
MemoryMax=`. The server is started inside it (`sh -c 'echo $$ > cgroup.procs; exec ...'`, so the
pid stays the server's). RLIMIT_AS (`ulimit -v`, `prlimit --as`) is not used: it caps virtual
address space, and PyTorch and its thread pools reserve far more address space than they touch,
so the server would fail at a limit its resident memory never comes near; RLIMIT_RSS is not
enforced by Linux. Where no cgroup can be made the walk runs unlimited and says so.

Recorded after every step: the server's VmRSS and VmHWM (/proc/<pid>/status) and the cgroup's
usage (which also counts page cache of the files the server read; the kernel reclaims that
before it kills anything), the cgroup's peak and how often the limit was hit (`failcnt` v1 /
`memory.events` max v2), OOM kills, and whether every page answered without an exception.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import REPO, health_ok, proc_memory, streamlit_server

PAGES = ("bias", "similarity", "compare", "checkpoints")


# ----------------------------------------------------------------------------- cgroups
class Limit:
    """A memory cgroup (or nothing) the server is started in: `prefix` for the command."""

    def __init__(self, limit_mb: int):
        self.limit = limit_mb * 2**20
        self.kind, self.path, self.prefix, self.why_not = "none", None, [], []
        if limit_mb <= 0:
            self.why_not.append("no limit asked for")
            return
        for make in (self._v2, self._v1, self._systemd):
            try:
                if make():
                    return
            except OSError as e:
                self.why_not.append(f"{make.__name__}: {e}")

    def _own(self, controller: str | None) -> str | None:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            num, ctrls, path = line.split(":", 2)
            if (controller is None and num == "0" and ctrls == "") or (controller and controller in ctrls.split(",")):
                return path
        return None

    def _enter(self, path: Path) -> None:
        self.path = path
        self.prefix = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(path)]

    def _v2(self) -> bool:
        root = Path("/sys/fs/cgroup")
        if not (root / "cgroup.controllers").exists():
            self.why_not.append("_v2: no unified cgroup v2 hierarchy at /sys/fs/cgroup")
            return False
        path = root / self._own(None).lstrip("/") / f"vitpe-memwalk-{os.getpid()}"
        path.mkdir()
        (path / "memory.max").write_text(str(self.limit))
        if (path / "memory.swap.max").exists():
            (path / "memory.swap.max").write_text("0")
        self.kind = "cgroup v2 memory.max"
        self._enter(path)
        return True

    def _v1(self) -> bool:
        own = self._own("memory")
        root = Path("/sys/fs/cgroup/memory")
        if own is None or not root.is_dir():
            self.why_not.append("_v1: no cgroup v1 memory controller")
            return False
        path = root / own.lstrip("/") / f"vitpe-memwalk-{os.getpid()}"
        path.mkdir()
        (path / "memory.limit_in_bytes").write_text(str(self.limit))
        if (path / "memory.memsw.limit_in_bytes").exists():
            (path / "memory.memsw.limit_in_bytes").write_text(str(self.limit))
        self.kind = "cgroup v1 memory.limit_in_bytes (+ memsw)"
        self._enter(path)
        return True

    def _systemd(self) -> bool:
        import subprocess

        if shutil.which("systemd-run") is None:
            self.why_not.append("_systemd: no systemd-run")
            return False
        probe = subprocess.run(["systemd-run", "--scope", "-q", "-p", f"MemoryMax={self.limit}", "true"],
                               capture_output=True, text=True)
        if probe.returncode:
            why = probe.stderr.strip().splitlines()[0] if probe.stderr.strip() else probe.returncode
            self.why_not.append(f"_systemd: {why}")
            return False
        self.kind = "systemd-run --scope MemoryMax"
        self.prefix = ["systemd-run", "--scope", "-q", "-p", f"MemoryMax={self.limit}"]
        return True

    def stats(self) -> dict:
        """The cgroup's usage / peak in MiB, limit hits and OOM kills (empty without a cgroup)."""
        p = self.path
        if p is None:
            return {}
        read = lambda name: (p / name).read_text() if (p / name).exists() else ""
        if self.kind.startswith("cgroup v2"):
            events = dict(line.split() for line in read("memory.events").splitlines())
            return {"usage_mb": int(read("memory.current") or 0) / 2**20,
                    "peak_mb": int(read("memory.peak") or 0) / 2**20 if read("memory.peak") else None,
                    "limit_hits": int(events.get("max", 0)), "oom_kills": int(events.get("oom_kill", 0))}
        oom = dict(line.split() for line in read("memory.oom_control").splitlines())
        return {"usage_mb": int(read("memory.usage_in_bytes")) / 2**20,
                "peak_mb": int(read("memory.max_usage_in_bytes")) / 2**20,
                "limit_hits": int(read("memory.failcnt")), "oom_kills": int(oom.get("oom_kill", 0))}

    def remove(self) -> None:
        if self.path is not None:
            for _ in range(20):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.25)


# ----------------------------------------------------------------------------- the walk
def _recorder(steps: list[dict], pid: int, limit: Limit):
    """`record(step, seconds, problems)`: appends the step with the server's memory and prints it."""
    def record(what: str, seconds: float, exceptions: list[str]) -> None:
        mem = proc_memory(pid)
        steps.append({"step": what, "seconds": round(seconds, 2), "exceptions": exceptions,
                      "rss_mb": round(mem.get("VmRSS", 0), 1), "hwm_mb": round(mem.get("VmHWM", 0), 1),
                      **{k: (round(v, 1) if isinstance(v, float) else v) for k, v in limit.stats().items()}})
        print(f"{what:40s} {seconds:6.1f} s  RSS {steps[-1]['rss_mb']:7.1f} MiB  HWM {steps[-1]['hwm_mb']:7.1f}"
              + (f"  cgroup {steps[-1]['usage_mb']:7.1f}" if "usage_mb" in steps[-1] else "")
              + (f"  EXCEPTIONS {exceptions}" if exceptions else ""), flush=True)
    return record


async def walk(base: str, names: list[str], pid: int, limit: Limit, timeout: float) -> list[dict]:
    from benchmarks.load_ws import MODEL_NAME, tiny_model_npz, upload_png
    from benchmarks.st_client import open_session

    steps = []
    record = _recorder(steps, pid, limit)

    for page in PAGES:
        for name in names:
            t0 = time.perf_counter()
            try:
                s, _ = await open_session(base, f"/?page={page}&ckpt={name}", timeout)
            except Exception as e:  # noqa: BLE001 — a page that does not answer is the finding
                record(f"{page} {name}", time.perf_counter() - t0, [f"no answer: {type(e).__name__}: {e}"])
                continue
            exc = s.page.exceptions()
            if page == "bias" and not exc:
                s.set_number("bias_row", 1)
                s.set_number("bias_col", 2)
                await s.run(timeout=timeout)
                exc = s.page.exceptions()
            record(f"{page} {name}", time.perf_counter() - t0, exc)
            await s.close()
            if page == "compare":
                break                    # the compare page shows its default pick whichever is chosen
    # a visitor's image and model
    t0 = time.perf_counter()
    s, _ = await open_session(base, "/?page=bias", timeout)
    try:
        await s.upload("bias_upload", "walk.png", upload_png(0, 0, side=1024), "image/png")
        await s.run(timeout=timeout)
        record("bias + a 1024 px upload", time.perf_counter() - t0, s.page.exceptions())
        t0 = time.perf_counter()
        await s.run(page="checkpoints", timeout=timeout)
        await s.upload("checkpoints_model_upload", f"{MODEL_NAME}.npz", tiny_model_npz())
        await s.run(timeout=timeout)
        await s.run(timeout=timeout, trigger=s.trigger("checkpoints_model_import"))
        ok = f"Imported as `{MODEL_NAME}-upload`" in s.page.text()
        record("checkpoints + a model import", time.perf_counter() - t0,
               s.page.exceptions() + ([] if ok else ["import not confirmed"]))
        for page in ("bias", "similarity", "compare"):
            t0 = time.perf_counter()
            await s.run(page=page, timeout=timeout)
            ran = s.page.page_script_hash == s.pages.get(page)
            missing = [] if ran else [f"the server ran another page than {page}: {s.notices[-1:]}"]
            record(f"{page} with the imported model", time.perf_counter() - t0, s.page.exceptions() + missing)
    except Exception as e:  # noqa: BLE001 — recorded, the report is still written
        record("upload / import steps", time.perf_counter() - t0, [f"{type(e).__name__}: {e}"])
    finally:
        await s.close()
    return steps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.memory_walk", description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoints", default=str(REPO / "checkpoints"))
    ap.add_argument("--limit-mb", type=int, default=1024, help="memory limit of the server's cgroup (0: none)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a page may take")
    ap.add_argument("--out", default=None, help="report (default artifacts/memory_walk.json, "
                    "artifacts/memory_walk_big.json with --big)")
    ap.add_argument("--big", action="store_true", help="the big-model run: visitors import ViT-B/16-shaped models "
                    "and visit distinct images on the bias, compare and similarity pages")
    ap.add_argument("--models", type=int, default=2, help="--big: models imported (one visitor each)")
    ap.add_argument("--images", type=int, default=60, help="--big: distinct images visited in all")
    ap.add_argument("--shape", choices=("b16", "s16"), default="b16", help="--big: the imported models' shape")
    ap.add_argument("--peak-mb", type=float, default=900.0, help="--big: the peak resident memory that passes")
    ap.add_argument("--cache-mb", type=float, default=None, help="the server's VITPE_CACHE_MB (default: its own)")
    args = ap.parse_args(argv)
    args.out = args.out or str(REPO / "artifacts" / ("memory_walk_big.json" if args.big else "memory_walk.json"))
    from vitpe_core.checkpoint import list_checkpoints

    names = list_checkpoints(args.checkpoints)
    if not names:
        ap.error(f"no checkpoints in {args.checkpoints}")
    limit = Limit(args.limit_mb)
    print(f"limit: {limit.kind} {args.limit_mb} MiB" + (f" (not set: {limit.why_not})" if limit.kind == "none" else ""))
    report = {"command": " ".join(["python -m benchmarks.memory_walk", *(argv if argv is not None else sys.argv[1:])]),
              "limit_mb": args.limit_mb, "limit_kind": limit.kind, "limit_not_set_because": limit.why_not,
              "checkpoints": names}
    env = {"VITPE_UPLOAD_DIR": None}
    if args.cache_mb is not None:
        env["VITPE_CACHE_MB"] = str(args.cache_mb)
        report["cache_mb"] = args.cache_mb
    try:
        with tempfile.TemporaryDirectory(prefix="vitpe-memwalk-") as tmp:
            env["VITPE_UPLOAD_DIR"] = str(Path(tmp) / "uploads")
            with streamlit_server(args.checkpoints, prefix=limit.prefix, timeout=120,
                                  args=("--server.fileWatcherType", "none"), env=env) as server:
                report["memory_start_mb"] = proc_memory(server.pid)
                t0 = time.perf_counter()
                if args.big:
                    report.update(_run_big(server, limit, args))
                else:
                    report["steps"] = asyncio.run(walk(server.url, names, server.pid, limit, args.timeout))
                report["wall_s"] = round(time.perf_counter() - t0, 1)
                mem = proc_memory(server.pid)
                report["server_alive"] = server.proc.poll() is None
                report["healthy_after"] = health_ok(server.url)
                report["peak_rss_mb"] = round(mem["VmHWM"], 1)
                report["cgroup"] = limit.stats()
                report["server_log_tail"] = server.log_tail(1500)
                if args.big:
                    from benchmarks.memory_walk_big import log_evictions
                    report["evictions_logged"] = log_evictions(server.log_tail(10**8))
    finally:
        limit.remove()
    steps = report.get("steps", [])
    report["exceptions"] = [f"{s['step']}: {e}" for s in steps for e in s["exceptions"]]
    if args.big:
        report["peak_ok"] = max(report.get("peak_rss_mb", 0.0), report.get("watched_peak_mb", 0.0)) <= args.peak_mb
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k not in ("steps", "server_log_tail")}, indent=2))
    ok = report.get("server_alive") and report.get("healthy_after") and not report["exceptions"]
    if args.big:
        ok = ok and report["peak_ok"] and bool(report.get("evictions_logged"))
    return 0 if ok else 1


def _run_big(server, limit: Limit, args) -> dict:
    """The big-model walk (`memory_walk_big.big_walk`) under an RSS watch beside the limit."""
    from benchmarks.memory_walk_big import RssWatch, big_walk

    steps: list[dict] = []
    record = _recorder(steps, server.pid, limit)
    with RssWatch(server.pid) as watch:
        out = asyncio.run(big_walk(server.url, server.pid, record, args.timeout, models=args.models,
                                   images=args.images, shape=args.shape))
    return {"steps": steps, "watched_peak_mb": round(watch.peak_mb, 1), "peak_limit_mb": args.peak_mb,
            "models": args.models, "shape": args.shape, **out}


if __name__ == "__main__":
    sys.exit(main())
