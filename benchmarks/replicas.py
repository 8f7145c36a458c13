"""The demo beyond one process: app replicas behind nginx on loopback, a load test through nginx,
and share links made on one replica opened through another (issue 47); figures -> RELIABILITY.md
("Replicas").

    python -m benchmarks.replicas                      # 2 replicas, 100 sessions x 60 s, 5 ViT-B/16 imports
    python -m benchmarks.replicas --short              # CI's: 2 replicas, 10 sessions x 15 s, a small import

What it does, in order (every step's failures collected, the run fails on any):

1. N replicas (`streamlit run app.py`, each its own process and port) on one shared folder for
   uploads and imported models (`VITPE_UPLOAD_DIR`, `VITPE_MODEL_DIR`) and one cookie secret,
   behind nginx (Debian's package, `deploy/replicas/nginx.conf.template`: websocket upgrade,
   affinity by Streamlit's XSRF cookie, uploads up to Streamlit's `maxUploadSize`).
2. **Links across replicas**: on replica 0 (directly), a visitor imports a small model and
   uploads an image; the view's share link (`model=<sha256>`, `image=upload:<sha256>`) opens on
   replica 1 (directly) and through nginx with the same checkpoint, model and image, no warning.
3. **Load through nginx**: the load test's websocket sessions (`benchmarks.load_test`: clicks,
   pages, uploads, share links, one small import; `--big-imports` sessions importing a
   ViT-B/16-shaped model in turns), every answer checked, cross-talk counted; each replica's
   memory sampled (its peak against `--peak-mb`) and CPU time measured; the sessions per replica
   from nginx's access log.
4. **One replica alone** (`--single`, default on): the same load on replica 0 directly, for
   clicks per second against the replicas' together.
5. **Restart**: every replica stopped and started again on the same folder; the link opens
   through nginx as before.

Needs nginx (`apt-get install nginx`); without it the run says so and exits 2. The report goes
to `--out` (default artifacts/replicas.json); the last line says PASS or the failures.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from benchmarks.harness import REPO, Server, free_port, streamlit_server, url_params, write_random_checkpoints
from benchmarks.load_probes import MemorySampler, cpu_model, cpu_seconds

TEMPLATE = REPO / "deploy" / "replicas" / "nginx.conf.template"
SERVER_ARGS = ("--server.fileWatcherType", "none")
GONE = ("is not on this server any more", "not in the upload store", "Ignored", "was removed from the server")


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def max_upload_mb() -> int:
    """Streamlit's `server.maxUploadSize` of the app's own config (what nginx must let through)."""
    cfg = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    return int(cfg.get("server", {}).get("maxUploadSize", 200))


def fill_template(listen: str, upstreams: str, prefix: str) -> str:
    """deploy/replicas/nginx.conf.template with its placeholders filled (uploads: Streamlit's limit)."""
    values = {"LISTEN": listen, "UPSTREAMS": upstreams, "PREFIX": prefix, "MAX_UPLOAD_MB": str(max_upload_mb())}
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], TEMPLATE.read_text(encoding="utf-8"))


def nginx_conf(listen: int, ports: list[int], prefix: Path) -> str:
    """The template filled for replicas on 127.0.0.1 `ports`, listening on 127.0.0.1:`listen`."""
    upstreams = "\n".join(f"        server 127.0.0.1:{p} max_fails=0;" for p in ports)
    return fill_template(f"127.0.0.1:{listen}", upstreams, str(prefix))


COMPOSE_CONF = REPO / "deploy" / "replicas" / "nginx.compose.conf"


def compose_conf() -> str:
    """The template filled for deploy/replicas/compose.yaml: nginx's own paths, Docker's DNS name of the replicas."""
    text = fill_template("8080", "        server app:8501 max_fails=0;   # every replica: Docker's DNS answers with "
                         "all of them", "/tmp")
    return ("# GENERATED from nginx.conf.template for compose.yaml (python -m benchmarks.replicas "
            "--write-compose-conf).\n" + text)


def _healthy(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5) as r:
                if r.status == 200:
                    return True
        time.sleep(0.2)
    return False


@contextlib.contextmanager
def nginx(ports: list[int], prefix: Path, listen: int | None = None) -> Iterator[str]:
    """nginx in the foreground in front of `ports`; yields its URL once a replica answers through it."""
    exe = nginx_binary()
    if exe is None:
        raise RuntimeError("nginx is not installed (apt-get install nginx)")
    listen = listen or free_port()
    prefix.mkdir(parents=True, exist_ok=True)
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (prefix / sub).mkdir(exist_ok=True)
        os.chmod(prefix / sub, 0o777)               # nginx's workers may run as another user under root
    conf = prefix / "nginx.conf"
    conf.write_text(nginx_conf(listen, ports, prefix), encoding="utf-8")
    proc = subprocess.Popen([exe, "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"],
                            stdout=subprocess.DEVNULL, stderr=open(prefix / "stderr.log", "wb"),
                            start_new_session=True)
    url = f"http://127.0.0.1:{listen}"
    try:
        if not _healthy(url, 60):
            raise RuntimeError(f"nginx did not answer: {(prefix / 'stderr.log').read_text(errors='replace')[-500:]}")
        yield url
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()


@contextlib.contextmanager
def replicas(n: int, checkpoints: Path, shared: Path, logs: Path, secret: str,
             ports: list[int] | None = None, tag: str = "") -> Iterator[list[Server]]:
    """`n` app processes on one shared folder (uploads, models) and one cookie secret (logs: replicaI`tag`.log)."""
    env = {"VITPE_UPLOAD_DIR": str(shared / "uploads"), "VITPE_MODEL_DIR": str(shared / "models"),
           "STREAMLIT_SERVER_COOKIE_SECRET": secret}
    ports = ports or [free_port() for _ in range(n)]
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(streamlit_server(checkpoints, port=p, log=logs / f"replica{i}{tag}.log", timeout=180,
                                                    args=SERVER_ARGS, env=env)) for i, p in enumerate(ports)]


# ----------------------------------------------------------------------------- links across replicas
async def make_link(base: str, timeout: float = 180.0, model: tuple[str, bytes] | None = None,
                    image: bool = True) -> str:
    """On `base`: import a model (Checkpoints page; `model` = (file name, bytes), default a small
    one), open it on the bias explorer, upload an image there (`image`); the view's share link
    (`model=`, and `image=upload:` with `image`)."""
    from benchmarks.load_ws import share_link_of, tiny_model_npz, upload_png
    from benchmarks.st_client import open_session

    filename, data = model or ("replicamodel.npz", tiny_model_npz(seed=47))
    name = f"{Path(filename).stem}-upload"
    s, _ = await open_session(base, "/?page=checkpoints", timeout)
    try:
        await s.upload("checkpoints_model_upload", filename, data)
        await s.run(timeout=timeout)
        await s.run(timeout=timeout, trigger=s.trigger("checkpoints_model_import"))
        if f"Imported as `{name}`" not in s.page.text():
            raise RuntimeError(f"the import was not confirmed: {[t for t in s.page.texts() if 'mport' in t][:3]}")
        await s.run(page="bias", timeout=timeout)
        if image:
            await s.upload("bias_upload", "replica-image.png", upload_png(47, 1), "image/png")
            await s.run(timeout=timeout)
        link = share_link_of(s)
    finally:
        await s.close()
    q = url_params(link or "")
    if not (q.get("model") and q.get("ckpt") == name and (not image or q.get("image", "").startswith("upload:"))):
        raise RuntimeError(f"the share link names not the imported model{' and an upload' if image else ''}: {link}")
    return link


async def open_link(base: str, link: str, timeout: float = 180.0) -> dict:
    """The view `link` opens as on `base`: its checkpoint, model, image, and what the page warns."""
    from benchmarks.load_ws import share_link_of
    from benchmarks.st_client import open_session

    s, _ = await open_session(base, "/?" + link.split("?", 1)[1], timeout)
    try:
        q = url_params(share_link_of(s) or "")
        said = [t for t in s.page.texts() if any(g in t for g in GONE)]
        return {"ckpt": q.get("ckpt"), "model": q.get("model"), "image": q.get("image"), "warnings": said,
                "exceptions": s.page.exceptions()}
    finally:
        await s.close()


def link_errors(link: str, opened: dict, where: str) -> list[str]:
    want = url_params(link)
    errors = [f"{where}: {k} {opened.get(k)!r}, the link's {want.get(k)!r}" for k in ("ckpt", "model", "image")
              if opened.get(k) != want.get(k)]
    errors += [f"{where}: says {w[:120]!r}" for w in opened["warnings"]]
    errors += [f"{where}: exception {e[:120]}" for e in opened["exceptions"]]
    return errors


# ----------------------------------------------------------------------------- load
@dataclass
class Front:
    """The load test's view of the replicas behind nginx: one URL, the first replica's pid for the
    load test's own sampling (each replica is sampled here too), all replicas' logs."""

    url: str
    pid: int
    servers: list[Server]

    def log_tail(self, n: int = 3000) -> str:
        return "\n".join(s.log_tail(n) for s in self.servers)


def load(front, specs, args, big) -> dict:
    """`benchmarks.load_test.run_ws_load` through `front`, each replica's memory and CPU measured."""
    from benchmarks.load_test import run_ws_load
    servers = getattr(front, "servers", [front])
    samplers = [MemorySampler(s.pid) for s in servers]
    cpu0 = [cpu_seconds(s.pid) for s in servers]
    for m in samplers:
        m.start()
    t0 = time.monotonic()
    try:
        report = run_ws_load(front, specs, args.seconds, think=(args.think[0], args.think[1]),
                             click_phase=args.click_phase, warm=True, big=big, peak_limit_mb=args.peak_mb)
    finally:
        peaks = [m.stop() for m in samplers]
    wall = time.monotonic() - t0
    report["replicas"] = [{"pid": s.pid, "peak_rss_mb": round(p, 1), "cpu_s": round(cpu_seconds(s.pid) - c, 1),
                           "started_epoch": round(m.started_epoch, 1), "rss_timeline_mb": m.timeline}
                          for s, p, c, m in zip(servers, peaks, cpu0, samplers)]
    report["clicks_per_s"] = round(report["clicks"] / wall, 2)
    return report


def sessions_per_replica(access_log: Path, ports: list[int]) -> dict[str, int]:
    """Websocket sessions nginx sent to each replica (`/_stcore/stream` lines of its access log, by
    upstream address: a line is written when the connection closes)."""
    lines = access_log.read_text(errors="replace").splitlines() if access_log.is_file() else []
    streams = [line for line in lines if "/_stcore/stream" in line]
    return {str(p): sum(line.endswith(f"upstream=127.0.0.1:{p}") for line in streams) for p in ports}


def _specs(folder: Path, n: int):
    from benchmarks.harness import checkpoint_grids
    from benchmarks.load_plan import make_specs
    from vitpe_core.gallery import gallery_ids
    return make_specs(n, checkpoint_grids(folder), gallery_ids())


def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="vitpe-replicas-"))
    folder = write_random_checkpoints(work / "checkpoints")
    shared, logs, secret = work / "shared", work / "logs", secrets.token_hex(16)
    logs.mkdir()
    big = None
    if args.big_imports:
        from benchmarks.load_big import build_plan
        big = build_plan(args.sessions, args.big_imports, args.big_shape, work / "big", stagger=10.0,
                         extra_s=args.big_extra_s)
    specs = _specs(folder, args.sessions)
    report: dict = {"replicas": args.replicas, "sessions": args.sessions, "seconds": args.seconds,
                    "big_imports": args.big_imports, "cpu_model": cpu_model(), "cpus": os.cpu_count(),
                    "nginx": subprocess.run([nginx_binary(), "-v"], capture_output=True, text=True).stderr.strip()}
    errors: list[str] = []
    ports = [free_port() for _ in range(args.replicas)]
    with replicas(args.replicas, folder, shared, logs, secret, ports) as servers, \
            nginx(ports, work / "nginx") as url:
        link = asyncio.run(make_link(servers[0].url))
        report["link"] = link
        for i, s in enumerate(servers[1:], start=1):
            errors += link_errors(link, asyncio.run(open_link(s.url, link)), f"replica {i}")
        errors += link_errors(link, asyncio.run(open_link(url, link)), "through nginx")
        report["load"] = load(Front(url, servers[0].pid, servers), specs, args, big)
        report["sessions_per_replica"] = sessions_per_replica(work / "nginx" / "access.log", ports)
        if args.single:
            report["single"] = load(servers[0], specs, args, None)
    with replicas(args.replicas, folder, shared, logs, secret, ports, tag="-restarted") as servers, \
            nginx(ports, work / "nginx2") as url:                    # both restarted: nothing in memory
        errors += link_errors(link, asyncio.run(open_link(url, link)), "after a restart")
    report["errors"] = errors
    report["failures"] = failures(report, args)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return report


def failures(report: dict, args: argparse.Namespace) -> list[str]:
    from benchmarks.load_test import failures as load_failures
    out = list(report["errors"]) + [f"load: {f}" for f in load_failures(report["load"])]
    out += [f"replica {i}: peak {r['peak_rss_mb']} MiB > {args.peak_mb}" for i, r in
            enumerate(report["load"]["replicas"]) if r["peak_rss_mb"] > args.peak_mb]
    busy = [p for p, n in report["sessions_per_replica"].items() if n]
    if len(busy) < min(args.replicas, 2):
        out.append(f"nginx sent every session to one replica: {report['sessions_per_replica']}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", action="store_true", help="CI's run: 2 replicas, 10 sessions x 15 s, a small import")
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--think", type=lambda t: [float(x) for x in t.split(",")], default=[1.0, 3.0])
    ap.add_argument("--click-phase", type=float, default=15.0)
    ap.add_argument("--big-imports", type=int, default=5, help="sessions importing a ViT-B/16-shaped model")
    ap.add_argument("--big-shape", default="b16")
    ap.add_argument("--big-extra-s", type=float, default=480.0, help="how long the window may stay open beyond "
                    "--seconds until every big session had its turn (imports take turns; two replicas on two "
                    "cores import slower than one process)")
    ap.add_argument("--peak-mb", type=float, default=1024.0, help="each replica's peak resident memory that passes")
    ap.add_argument("--no-single", dest="single", action="store_false", help="skip the one-replica comparison")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, nginx's access log)")
    ap.add_argument("--out", default=str(REPO / "artifacts" / "replicas.json"))
    ap.add_argument("--write-compose-conf", action="store_true", help="write deploy/replicas/nginx.compose.conf "
                    "from the template and exit")
    args = ap.parse_args(argv)
    if args.write_compose_conf:
        COMPOSE_CONF.write_text(compose_conf(), encoding="utf-8")
        return 0
    if args.short:
        args.sessions, args.seconds, args.big_imports, args.click_phase = 10, 15.0, 0, 5.0
        args.think = [0.5, 1.5]
    if nginx_binary() is None:
        print("nginx is not installed (apt-get install nginx): no replicas to test", file=sys.stderr)
        return 2
    report = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    load_r = report["load"]
    print(json.dumps({"clicks": load_r["clicks"], "clicks_per_s": load_r["clicks_per_s"],
                      "single_clicks_per_s": report.get("single", {}).get("clicks_per_s"),
                      "latency_click": load_r["latency_s"].get("click"), "replicas": load_r["replicas"],
                      "sessions_per_replica": report["sessions_per_replica"], "errors": len(load_r["errors"]),
                      "crosstalk": len(load_r["crosstalk"])}))
    print("PASS" if not report["failures"] else "FAIL: " + "; ".join(report["failures"][:10]))
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
