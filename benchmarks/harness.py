"""What the benchmark (`benchmarks.bench`), the load test (`benchmarks.load_test`), the browser
and load tests (tests/test_browser.py, tests/test_load.py), tests/conftest.py and
scripts/screenshots.py share:

* the app server: `streamlit_server` (`python -m streamlit run app.py` on a free loopback port,
  own process group, always stopped) and `wait_http` (seconds to `/_stcore/health` and `GET /`);
* the browser: `CHROMIUM_ARGS`, `chromium_or_reason`, `launch_chromium` (Debian's chromium
  through playwright, sync or async), `wait_script_run` (until a Streamlit script run
  finished), the share-link and page helpers (`share_url`, `click_point`, `url_params`,
  `patch_label`, `full_page_screenshot`);
* the machine: `free_port`, `busy_cpu_s` (the whole machine's busy CPU seconds), `proc_memory`
  (VmHWM / VmRSS), `background_jobs` (running `vitpe_core train` processes, which compete for the
  CPUs);
* checkpoints: `write_random_checkpoints` (the random-weight set the tests, the load test and
  the benchmark use where no trained checkpoint is at hand) and `checkpoint_grids`.

Nothing here imports playwright, streamlit or torch at import time.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from vitpe_core.viewstate import show_value   # torch-free

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- machine
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def busy_cpu_s() -> float | None:
    """Seconds all CPUs spent busy since boot (/proc/stat: all but idle and iowait), None without it."""
    try:
        f = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def proc_memory(pid: int) -> dict[str, float]:
    """{"VmHWM": peak resident, "VmRSS": resident} of a live process in MiB
    (/proc/<pid>/status; psutil's current RSS for both where /proc is missing)."""
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        import psutil

        rss = psutil.Process(pid).memory_info().rss / 2**20
        return {"VmHWM": rss, "VmRSS": rss}
    out = {}
    for line in status.read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0]) / 1024
    return out


def background_jobs() -> list[dict]:
    """Other `python -m vitpe_core train` processes: pid, state (R running, S sleeping,
    T stopped, D waiting on I/O) and the start of their command line."""
    jobs = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            args = (d / "cmdline").read_bytes().split(b"\0")
            if int(d.name) == os.getpid() or b"vitpe_core" not in args:
                continue
            i = args.index(b"vitpe_core")
            if args[i + 1:i + 2] != [b"train"]:
                continue
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue
        jobs.append({"pid": int(d.name), "state": state,
                     "args": " ".join(a.decode(errors="replace") for a in args[i:i + 4])})
    return sorted(jobs, key=lambda j: j["pid"])


# ----------------------------------------------------------------------------- app server
def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except (urllib.error.URLError, ConnectionError, OSError):
        return 0, b""


def health_ok(url: str, timeout: float = 5.0) -> bool:
    """`/_stcore/health` of the server at `url` answers "ok"."""
    status, body = _get(url.rstrip("/") + "/_stcore/health", timeout)
    return status == 200 and body.strip() == b"ok"


@dataclass
class Server:
    url: str                       # http://127.0.0.1:PORT (no trailing slash)
    proc: subprocess.Popen
    log: Path
    started: float                 # time.perf_counter() just before the process started
    ready: dict[str, float] = field(default_factory=dict)   # wait_http's timings

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group, SIGKILL it after 10 s."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_http(server: Server, timeout: float = 60.0) -> dict[str, float]:
    """Seconds from process start until `/_stcore/health` answers "ok", then until `GET /`
    answers 200 with the page shell; raises with the server's log when it exits or is late."""
    deadline = server.started + timeout
    while not health_ok(server.url, timeout=1.0):
        if server.proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with {server.proc.returncode}:\n{server.log_tail()}")
        if time.perf_counter() > deadline:
            raise TimeoutError(f"streamlit not healthy after {timeout:.0f} s:\n{server.log_tail()}")
        time.sleep(0.02)
    health = time.perf_counter() - server.started
    status, body = _get(server.url + "/")
    if status != 200 or b"<html" not in body.lower():
        raise RuntimeError(f"GET / answered {status}:\n{server.log_tail()}")
    return {"health_s": health, "get_root_s": time.perf_counter() - server.started}


@contextlib.contextmanager
def streamlit_server(checkpoints: str | Path, *, port: int | None = None, log: Path | None = None,
                     timeout: float = 60.0, args: Sequence[str] = (), env: dict[str, str] | None = None,
                     prefix: Sequence[str] = (), script: str | Path = "app.py") -> Iterator[Server]:
    """`python -m streamlit run app.py` on 127.0.0.1 with `VITPE_CHECKPOINTS=checkpoints`, in its
    own process group; yields once it answers HTTP (`server.ready`: `wait_http`'s timings) and
    always stops it. `args`: more `streamlit run` options; `env`: more environment variables;
    `prefix`: a command that runs the server (it must exec it, so the pid stays the server's);
    `script`: another script to serve, still from the repository root (its `.streamlit/config.toml`)."""
    port = port or free_port()
    log = log or Path(tempfile.mkstemp(prefix="vitpe-streamlit-", suffix=".log")[1])
    env = {**os.environ, "VITPE_CHECKPOINTS": str(checkpoints), "PYTHONUNBUFFERED": "1", **(env or {})}
    if not env.get("VITPE_UPLOAD_DIR"):   # uploads and imported models of a server started here: not the user's cache
        env["VITPE_UPLOAD_DIR"] = tempfile.mkdtemp(prefix="vitpe-uploads-")
    cmd = [*prefix, sys.executable, "-m", "streamlit", "run", str(script), "--server.headless", "true",
           "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false", *args]
    with open(log, "wb") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", proc, Path(log), started)
    try:
        server.ready = wait_http(server, timeout)
        yield server
    finally:
        _stop(proc)


# ----------------------------------------------------------------------------- browser
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def chromium_or_reason() -> tuple[str | None, str | None]:
    """(Debian's chromium, None) when it and playwright are there, else (None, why not)."""
    exe = shutil.which("chromium")
    if exe is None:
        return None, "chromium not found"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as e:
        return None, f"playwright not importable: {e}"
    return exe, None


def skip_module_without_browser(pytest: Any) -> None:
    """In a browser test module: skip it, saying what to install, where chromium or playwright is missing."""
    _, missing = chromium_or_reason()
    if missing:
        pytest.skip(f"{missing}: apt-get install chromium (.ci/run does it); pip install -r requirements-dev.txt",
                    allow_module_level=True)


def launch_chromium(playwright: Any, **kwargs: Any) -> Any:
    """Headless Debian chromium from a started playwright (sync: the browser; async: awaitable)."""
    return playwright.chromium.launch(executable_path=shutil.which("chromium"), headless=True, args=CHROMIUM_ARGS,
                                      **kwargs)


# Streamlit's own marker on the app root: the script run is over.
IDLE_JS = "() => document.querySelector('[data-testid=stApp]')?.dataset.testScriptState === 'notRunning'"
_IDLE_WITH_TEXT_JS = "(t) => document.body.innerText.includes(t) && (" + IDLE_JS + ")()"


# The first page is ready for a person when its charts are drawn, not when the script went idle:
# [Plotly plots in the DOM, those holding their drawn traces (`_fullData`, set by Plotly.newPlot),
# whether the script run is over].
CHARTS_JS = ("() => { const p = [...document.querySelectorAll('.js-plotly-plot')];"
             " return [p.length, p.filter(e => e._fullData && e._fullData.length > 0).length, ("
             + IDLE_JS + ")()]; }")
CHARTS_SETTLE_S = 0.5


def wait_charts_drawn(page: Any, timeout_s: float = 180.0, settle_s: float = CHARTS_SETTLE_S) -> float:
    """Until the page's Plotly charts are drawn, the script run is over and no other chart came
    for `settle_s` (a page's charts can reach the DOM in more than one batch: a test once saw 2 of
    the first page's 6 there, both drawn, the script idle). Returns the `time.perf_counter()` at
    which the last of them was drawn (polled every 50 ms)."""
    deadline = time.perf_counter() + timeout_s
    done_at, count = None, -1
    while True:
        n, drawn, idle = page.evaluate(CHARTS_JS)
        now = time.perf_counter()
        if n > 0 and drawn == n and idle:
            if n != count:
                done_at, count = now, n
            elif now - done_at >= settle_s:
                return done_at
        else:
            done_at, count = None, -1
        if now > deadline:
            raise TimeoutError(f"the page's charts were not all drawn within {timeout_s:.0f} s ({drawn} of {n})")
        time.sleep(0.05)


def wait_script_run(page: Any, timeout_s: float = 180.0, text: str | None = None) -> Any:
    """Until the script run finished (and, if given, `text` is on the page). Sync playwright
    waits; async playwright returns the awaitable."""
    if text is None:
        return page.wait_for_function(IDLE_JS, timeout=timeout_s * 1e3)
    return page.wait_for_function(_IDLE_WITH_TEXT_JS, arg=text, timeout=timeout_s * 1e3)


IMAGE_FRAME = "iframe[title*='streamlit_image_coordinates']"   # the old clickable image component (iframe)
# The patch picker (`st.plotly_chart(..., on_select="rerun")`, key `<page>_click`): its plot area,
# Plotly's drag layer, spans exactly the image (no margins), so a patch's centre is `click_point`
# of its bounding box.
PICKER_AREA = ".st-key-{key} .nsewdrag"


def wait_quiet(page: Any, still_ms: int = 1000, timeout_s: float = 180.0) -> None:
    """Until the script run is over and no other starts for `still_ms`, the address bar unchanged
    meanwhile. One idle moment is not the end: quick actions queue reruns behind the one running,
    and a slider sends its new value only after a short debounce, so the rerun for the last key
    press may not have begun when the one before it ends."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        page.wait_for_function(IDLE_JS, timeout=timeout_s * 1e3)
        url = page.url
        page.wait_for_timeout(still_ms)
        if page.evaluate(IDLE_JS) and page.url == url:
            return
    raise AssertionError(f"the app did not settle in {timeout_s:g} s")


SHARE_CODE = "[data-testid='stPopoverBody'] [data-testid='stCode']"   # the share popover's link (a portal)


def share_link(page: Any, timeout_s: float = 60.0, contains: str | None = None) -> str:
    """The sidebar's link to the view (`viewsync.render_share`, a popover drawn when opened): open
    the popover, read the link (waiting until it holds `contains`, if given), close it again."""
    code = page.locator(SHARE_CODE).first
    if not code.is_visible():
        page.locator(".st-key-share button").first.click()
    code.wait_for(state="visible", timeout=timeout_s * 1e3)
    if contains is not None:
        page.wait_for_function("([sel, text]) => (document.querySelector(sel)?.innerText || '').includes(text)",
                               arg=[SHARE_CODE, contains], timeout=timeout_s * 1e3)
    link = code.inner_text().strip()
    page.keyboard.press("Escape")
    code.wait_for(state="hidden", timeout=timeout_s * 1e3)
    return link


def open_section(page: Any, key: str, timeout_s: float = 180.0) -> None:
    """Open the expander with key `key` (the bias page's `bias_rollout_open`, `bias_stress_open`:
    sections computed only while open, `stress_panel.section`) and wait for its run."""
    details = page.locator(f".st-key-{key} details").first
    details.wait_for(state="attached", timeout=timeout_s * 1e3)
    if details.get_attribute("open") is None:
        details.locator("summary").first.click()
        page.wait_for_function("el => el.open", arg=details.element_handle(), timeout=timeout_s * 1e3)
    wait_quiet(page, still_ms=500, timeout_s=timeout_s)


def picker_area(page: Any, key: str = "bias_click") -> Any:
    """The patch picker's clickable plot area on a playwright page (sync or async locator)."""
    return page.locator(PICKER_AREA.format(key=key)).first


def patch_label(patch: tuple[int, int]) -> str:
    """The text the pages show for the query patch."""
    return f"Patch ({patch[0]}, {patch[1]})"


def share_url(base: str, *, page: str = "bias", ckpt: str | None = None, image: str | None = None,
              patch: tuple[int, int] | None = None, layer: int | None = None, head: str | None = None,
              show: list[str] | None = None) -> str:
    q = {"page": page, "ckpt": ckpt, "image": image, "patch": patch and f"{patch[0]},{patch[1]}",
         "layer": None if layer is None else str(layer), "head": head, "show": show and show_value(show)}
    return base.rstrip("/") + "/?" + urlencode({k: v for k, v in q.items() if v is not None}, safe=",", quote_via=quote)


def click_point(box: dict, patch: tuple[int, int], grid: tuple[int, int]) -> dict[str, float]:
    """The centre of `patch` in the clickable image's box (position relative to the element)."""
    (r, c), (H, W) = patch, grid
    return {"x": box["width"] * (c + 0.5) / W, "y": box["height"] * (r + 0.5) / H}


def url_params(url: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}


CONTENT_HEIGHT_JS = ("() => Math.max(...['stMain', 'stSidebarContent'].map("
                     "id => document.querySelector(`[data-testid=${id}]`)?.scrollHeight || 0))")


def full_page_screenshot(page: Any, path: str | Path, *, max_height: int = 6000) -> None:
    """A whole-page PNG (sync playwright `page`). Streamlit scrolls inside its main block, so
    `full_page=True` alone sees one screen: grow the viewport to the content, shoot, restore."""
    vp = page.viewport_size
    height = min(max(vp["height"], int(page.evaluate(CONTENT_HEIGHT_JS))), max_height)
    page.set_viewport_size({"width": vp["width"], "height": height})
    page.wait_for_timeout(400)                                        # charts re-layout
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(vp)


# ----------------------------------------------------------------------------- checkpoints
APP_ENCODINGS = ("ape", "sape2+ape", "rope_mixed", "rpb", "none")   # the tests' set
TINY = {"img_size": (32, 32), "patch_size": 4, "dim": 32, "depth": 2, "heads": 2, "mlp_dim": 64}


def write_random_checkpoints(folder: str | Path, encodings: tuple[str, ...] | list[str] = APP_ENCODINGS, *,
                             preset: str | None = None, epochs: int = 1) -> Path:
    """Random-weight checkpoints in the format training writes, one `ENC.safetensors` (+ `.json`)
    per encoding, into `folder`: the tiny size (8x8 grid, D 32, 2 layers, 2 heads) or a preset's
    (`preset="compact"`: the shipped size, as the benchmark needs). Encoding i is seeded with i.
    Each has minimal metrics (recipe, a made-up test top-1 of 10 + i and top-5 of 50 + i, an
    `epochs`-long curve, `random_weights: true`; `ape` also a made-up resolution record) and a
    history of its position parameters for epochs 0..`epochs`, nudged every epoch so that
    epochs differ. Compute per click does not depend on the weights' values."""
    import torch

    from vitpe_core import ViTConfig, build_model, preset_config
    from vitpe_core.checkpoint import history_params, save_checkpoint

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i, enc in enumerate(encodings):
        torch.manual_seed(i)
        cfg = preset_config(preset, encoding=enc) if preset else ViTConfig(**TINY, encoding=enc)
        model = build_model(cfg).eval()
        history = {0: history_params(model)}
        for epoch in range(1, epochs + 1):
            with torch.no_grad():
                for p in model.pos_enc.parameters():
                    p.add_(0.01 * torch.randn_like(p))
            history[epoch] = history_params(model)
        top1, top5 = 10.0 + i, 50.0 + i
        metrics = {"recipe": {"dataset": "cifar10", "encoding": enc, "epochs": epochs}, "epochs": epochs,
                   "test": {"top1": top1, "top5": top5, "loss": 2.3},
                   "curves": {"epoch": list(range(1, epochs + 1)), "train_loss": [2.3] * epochs,
                              "train_acc": [10.0] * epochs, "test_top1": [top1] * epochs, "test_top5": [top5] * epochs,
                              "test_loss": [2.3] * epochs},
                   "random_weights": True}
        if enc == "ape":
            metrics["resolution"] = {"24": {"top1": 9.0, "top5": 49.0, "grid": [6, 6]},
                                     "40": {"top1": 8.0, "top5": 48.0, "grid": [10, 10]}}
        save_checkpoint(folder / f"{enc}.safetensors", model, metrics=metrics, history=history)
    return folder


def checkpoint_grids(folder: str | Path) -> dict[str, tuple[int, int]]:
    """name -> patch grid (H, W) of every checkpoint in `folder`."""
    from vitpe_core.checkpoint import list_checkpoints, load_checkpoint, resolve_checkpoint

    return {n: tuple(load_checkpoint(resolve_checkpoint(n, folder)).config.grid) for n in list_checkpoints(folder)}
