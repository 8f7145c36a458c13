"""Shared fixtures. `shared_dir` is ../shared (data for CI and developers); tests that need it
skip with a reason on a user's fresh clone, where it does not exist. `cifar10_dir`: ../shared's
CIFAR-10 exported once per session. `release` tests run only with --release (or VITPE_RELEASE=1).
Hypothesis profiles: `ci` where Hypothesis detects CI (the CI variable set), else `quick`."""
from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import settings

# Under pytest-xdist the workers (and the servers and training children they start) outnumber the
# cores: each keeps torch to one thread. OpenMP threads of oversubscribed processes spin while they
# wait for each other, and the full suite took 1.3x as much CPU with torch's default of one thread
# per core (fresh clone, 2 cores: 555 -> 432 s). The fused kernel's own tests run it on two threads
# (tests/test_cope_sape2.py), so its parallel split is still checked. OMP_NUM_THREADS set by the
# caller wins.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
import torch  # noqa: E402  (after the thread settings above)

if _WORKER:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
# Without a GPU the Triton kernels of the fused GPU attention run on CPU tensors in Triton's
# interpreter (tests/test_triton_*.py, test_fused_gpu.py). It must be chosen before triton is
# first imported (torch._dynamo imports it), so here, before any test module runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from benchmarks.harness import APP_ENCODINGS, busy_cpu_s, write_random_checkpoints  # noqa: E402  (imports torch)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "data").is_dir():
        pytest.skip(f"../shared not found at {SHARED}: it exists only in this project's dev checkout and CI")
    return SHARED


@pytest.fixture(scope="session")
def cifar10_dir(shared_dir, tmp_path_factory) -> Path:
    """A folder holding `cifar-10-batches-py`: ../shared/data/cifar10_webp.npz written out by
    ../shared's own export tool (the command load_cifar's error message gives users; byte-identical
    to the official files). Once per test run: test_data and test_shipped_checkpoints share it,
    also from two xdist workers (the folder above each worker's temp root is the run's, and a
    file lock lets the first worker write it while the other waits)."""
    from filelock import FileLock   # a torch requirement

    npz = shared_dir / "data" / "cifar10_webp.npz"
    if not npz.is_file():
        pytest.skip(f"{npz} does not exist (only in this project's dev checkout and CI)")
    if importlib.util.find_spec("PIL") is None:
        pytest.skip("Pillow is needed to export ../shared/data/cifar10_webp.npz")
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "cifar10-export"
    done = root / "done"
    with FileLock(str(root) + ".lock"):
        if not done.exists():
            proc = subprocess.run([sys.executable, str(shared_dir / "tools" / "cifar_export.py"), str(npz),
                                   "--pickle-dir", str(root / "cifar-10-batches-py")], capture_output=True,
                                  text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr[-2000:]
            done.touch()
    return root


# ----------------------------------------------------------------------------- release tests
RELEASE_ENV = "VITPE_RELEASE"


def pytest_addoption(parser) -> None:
    parser.addoption("--release", action="store_true",
                     help=f"also run the tests marked `release` (the full test-set reproduction of every shipped "
                          f"checkpoint, minutes); {RELEASE_ENV}=1 does the same")


def _release_requested(config) -> bool:
    return config.getoption("--release") or os.environ.get(RELEASE_ENV, "") not in ("", "0")


# ----------------------------------------------------------------------------- hypothesis profiles
# `ci`: Hypothesis's own (derandomized, no deadline, failing examples printed as blobs), loaded by
# Hypothesis itself wherever the CI variable (or a vendor's) is set; each test runs the
# `max_examples` its @settings gives. `quick` (the default elsewhere): at most a tenth of them
# (at least QUICK_MIN). `--hypothesis-profile NAME` or HYPOTHESIS_PROFILE=NAME choose one
# (HYPOTHESIS_PROFILE=ci runs the full counts locally). An explicit @settings(max_examples=N)
# outranks any profile, so `quick` lowers N on the test itself, through the attribute Hypothesis
# reads its settings from at every call (private; were it renamed, tests would run all N).
QUICK_MIN = 10
settings.register_profile("quick", deadline=None)
_profile = os.environ.get("HYPOTHESIS_PROFILE") or (None if settings.get_current_profile_name() == "ci" else "quick")
if _profile:
    settings.load_profile(_profile)


def _quick_examples(n: int) -> int:
    return min(n, max(QUICK_MIN, n // 10))


def pytest_report_header(config) -> list[str]:
    profile = settings.get_current_profile_name()
    note = " (a tenth of each test's examples; HYPOTHESIS_PROFILE=ci runs them all)" if profile == "quick" else ""
    release = "run" if _release_requested(config) else f"skipped (--release or {RELEASE_ENV}=1 runs them)"
    return [f"hypothesis profile: {profile}{note}", f"release tests: {release}"]


# ----------------------------------------------------------------------------- workers
# pyproject's addopts run the suite under pytest-xdist, one test module at a time per worker
# (`--dist loadfile`: a module's server and browser are started once). One worker more than the
# cores (a worker waiting on its server and browser leaves a core free), at most MAX_WORKERS: each
# may hold a Streamlit server and a chromium. `-n 0` runs the suite in one process.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config) -> int:
    return max(1, min(MAX_WORKERS, (os.cpu_count() or 1) + 1))


# The longest modules first (measured in a fresh clone on 2 cores; `--no-loadscope-reorder` in
# pyproject keeps this order, which xdist otherwise replaces by the number of tests), so that the short ones fill
# the workers' last minutes instead of one long module running alone at the end. The cold-start
# module leads (on a fresh machine its server compiles the kernel), then compiled training (the
# suite's one inductor compile, 1-2 min in a cold cache on 2 busy cores).
FIRST_MODULES = ("test_browser_coldstart.py", "test_train.py", "test_replicas.py", "test_browser_share.py",
                 "test_browser.py",
                 "test_browser_ux.py", "test_browser_touch.py", "test_memory_walk.py", "test_browser_families.py",
                 "test_bench.py", "test_browser_stress.py", "test_shipped_checkpoints.py", "test_app.py",
                 "test_cope_sape2.py", "test_browser_definitions.py", "test_app_fuzz.py", "test_browser_views.py",
                 "test_load.py", "test_app_families.py", "test_resolution.py", "test_app_import_form.py")


def _module_rank(item) -> int:
    name = item.path.name
    return FIRST_MODULES.index(name) if name in FIRST_MODULES else len(FIRST_MODULES)


def pytest_collection_modifyitems(config, items) -> None:
    items.sort(key=_module_rank)   # stable: the rest keep their order
    release = _release_requested(config)
    skip_release = pytest.mark.skip(reason=f"release check (full CIFAR-10 test set, minutes): run with --release "
                                           f"or {RELEASE_ENV}=1")
    quick = settings.get_current_profile_name() == "quick"
    for item in items:
        if not release and item.get_closest_marker("release") is not None:
            item.add_marker(skip_release)
        fn = getattr(item, "obj", None)
        current = getattr(fn, "_hypothesis_internal_use_settings", None)   # what @settings gave the test
        if quick and current is not None and not getattr(fn, "_quick_examples", None):   # once per function
            fn._quick_examples = _quick_examples(current.max_examples)
            fn._hypothesis_internal_use_settings = settings(current, max_examples=fn._quick_examples)


# ----------------------------------------------------------------------------- where the time goes
# `VITPE_TEST_CPU=FILE python -m pytest -n 0 ...`: one line per test appended to FILE, the CPU
# seconds the whole machine spent during it (Linux's /proc/stat, so the Streamlit servers and the
# chromium processes a test drives count too, which the test process's own times leave out) and
# its wall seconds. Meaningful with one worker (`-n 0`) on an otherwise idle machine; a module's
# server and browser start are counted in its first test.
CPU_LOG_ENV = "VITPE_TEST_CPU"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    log = os.environ.get(CPU_LOG_ENV)
    busy = busy_cpu_s() if log else None
    if busy is None:                 # not asked for, or no /proc/stat
        yield
        return
    t0 = time.monotonic()
    yield
    with open(log, "a") as f:
        f.write(f"{busy_cpu_s() - busy:.1f}\t{time.monotonic() - t0:.1f}\t{item.nodeid}\n")


# ----------------------------------------------------------------------------- AppTest
def _scan_components_once() -> None:
    """Each AppTest run scans every installed package's metadata for Streamlit components
    (`streamlit.components.v2.manifest_scanner`; a server does it once, at start): ~0.45 s of CPU
    a run, half of what the AppTest modules spent. The installed packages do not change during a
    test run: the first scan serves the others."""
    try:
        from streamlit.components.v2 import manifest_scanner
    except ImportError:             # no Streamlit, or another one: nothing to share
        return
    scan = manifest_scanner.scan_component_manifests
    first = functools.cache(lambda: tuple(scan()))
    manifest_scanner.scan_component_manifests = lambda max_workers=None: list(first())


_scan_components_once()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ----------------------------------------------------------------------------- app checkpoints
@pytest.fixture(autouse=True)
def _own_upload_store(tmp_path_factory, monkeypatch):
    """Every test's uploads and imported models (`ImageStore`, `ModelStore`) in a folder of its
    own, never the user's cache folder (a test may set its own)."""
    monkeypatch.setenv("VITPE_UPLOAD_DIR", str(tmp_path_factory.mktemp("uploads")))
    monkeypatch.delenv("VITPE_MODEL_DIR", raising=False)


@pytest.fixture(scope="session")
def app_checkpoint_dir(tmp_path_factory) -> Path:
    """A folder of tiny random-weight checkpoints (8x8 grid, D 32, 2 layers, 2 heads), one per
    APP_ENCODINGS, with minimal metrics and a two-epoch history, for the Streamlit app tests
    (`benchmarks.harness.write_random_checkpoints`, which the load test and the benchmark use too)."""
    return write_random_checkpoints(tmp_path_factory.mktemp("app_checkpoints"), APP_ENCODINGS)


# ----------------------------------------------------------------------------- browser tests
BROWSER_EXPECT_TIMEOUT_MS = 60_000


def pytest_runtest_setup(item) -> None:
    """Browser tests: playwright's `expect` waits up to 60 s for its condition (its default is
    5 s), as their page calls do; on a loaded 2-core machine the app's first run takes longer."""
    if item.get_closest_marker("browser") is not None:
        from playwright.sync_api import expect

        expect.set_options(timeout=BROWSER_EXPECT_TIMEOUT_MS)


@pytest.fixture(scope="session")
def app_url(app_checkpoint_dir, tmp_path_factory):
    """`python -m streamlit run app.py` on `app_checkpoint_dir`, on a free loopback port with
    VITPE_CHECKPOINTS set; healthy within 60 s; its process group is always terminated. One for
    the session: browser modules on these checkpoints share it (a module with other checkpoints or
    settings defines its own `app_url`)."""
    from benchmarks import harness
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with harness.streamlit_server(app_checkpoint_dir, log=log, timeout=60) as server:
        yield server.url


VIEWPORT = {"width": 1400, "height": 1000}


class Tabs:
    """Browser tabs that a test module's tests take turns in, one per kind of visitor (a browser
    context made with the options given the first time a name is asked for). A fresh tab per test
    cost ~7 CPU-s of chromium per page load: each new renderer compiled Streamlit's and Plotly's
    ~8 MB of JavaScript again; a reused tab loads the app for ~3. Between tests every tab goes back
    to about:blank (so the next `goto` is a new Streamlit session, a visitor of its own), at its
    first viewport, with the other pages of its context closed."""

    def __init__(self, browser, timeout_ms: float):
        self.browser, self.timeout_ms = browser, timeout_ms
        self.open: dict[str, tuple] = {}       # name -> (context, page, viewport)

    def tab(self, name: str = "visitor", **context_options):
        ctx, pg, viewport = self.open.get(name, (None, None, None))
        if ctx is None:
            context_options.setdefault("viewport", VIEWPORT)
            ctx, viewport = self.browser.new_context(**context_options), context_options["viewport"]
        if pg is None or pg.is_closed():
            pg = ctx.new_page()
            pg.set_default_timeout(self.timeout_ms)
        self.open[name] = (ctx, pg, viewport)
        return pg

    def reset(self) -> None:
        for ctx, pg, viewport in self.open.values():
            for other in ctx.pages:
                if other is not pg:
                    other.close()
            if not pg.is_closed():
                pg.goto("about:blank")
                if pg.viewport_size != viewport:
                    pg.set_viewport_size(viewport)

    def close(self) -> None:
        for ctx, _, _ in self.open.values():
            ctx.close()
        self.open.clear()


@pytest.fixture(scope="module")
def _module_tabs(browser, request):
    tabs = Tabs(browser, getattr(request.module, "TIMEOUT_MS", BROWSER_EXPECT_TIMEOUT_MS))
    yield tabs
    tabs.close()


@pytest.fixture
def tabs(_module_tabs):
    """The module's `Tabs` (its default timeout the module's `TIMEOUT_MS`, else
    `BROWSER_EXPECT_TIMEOUT_MS`), reset to about:blank after the test."""
    yield _module_tabs
    _module_tabs.reset()


@pytest.fixture
def page(tabs):
    """A 1400x1000 tab of the module's visitor (`Tabs`: reused by the module's tests, on
    about:blank at the start of each). A phone: `phone`; other kinds of visitor (downloads) are
    asked of `tabs`."""
    return tabs.tab()


@pytest.fixture
def phone(tabs):
    """A 390x844 phone's tab (touch, mobile, device scale 2) of the module's `Tabs`."""
    return tabs.tab("phone", viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                    device_scale_factor=2)


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium through playwright for a browser test module (module scope: it is
    closed before tests/test_load.py starts its own, async, playwright)."""
    from playwright.sync_api import sync_playwright

    from benchmarks import harness
    with sync_playwright() as p:
        b = harness.launch_chromium(p)
        yield b
        b.close()
