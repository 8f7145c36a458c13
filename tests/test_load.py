"""A short but real load test: the server from `streamlit run app.py` on loopback, six
concurrent browser sessions (playwright contexts in one headless chromium), each opening its
own share link and clicking patches for 20 s. Asserts: no errors (every click answered within
30 s, no exception box, no lost websocket), every session got answers, no cross-talk (each
page only ever shows its own patch, checkpoint and image), the server's peak resident memory
under 1.5 GB, and `/_stcore/health` still OK afterwards. The full run (20 sessions x 60 s)
is `python -m benchmarks.load_test`; its figures are in RELIABILITY.md."""
from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from benchmarks.harness import checkpoint_grids, streamlit_server
from benchmarks.load_test import make_specs, run_load

SESSIONS, SECONDS = 6, 20
MEMORY_BOUND_MB = 1536
KNOWN_COMPONENT_RACE = "Cannot read properties of null (reading 'src')"

pytestmark = [pytest.mark.slow, pytest.mark.browser]

if shutil.which("chromium") is None:
    pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run does it)",
                allow_module_level=True)
if importlib.util.find_spec("playwright") is None:
    pytest.skip("playwright is not importable; pip install -r requirements-dev.txt", allow_module_level=True)


def test_concurrent_sessions_click_without_errors_or_crosstalk(app_checkpoint_dir, tmp_path):
    from vitpe_core.gallery import gallery_ids

    specs = make_specs(SESSIONS, checkpoint_grids(app_checkpoint_dir), gallery_ids())
    assert len({(s.ckpt, s.image, s.patch) for s in specs}) == SESSIONS           # six different links
    with streamlit_server(app_checkpoint_dir, log=tmp_path / "server.log") as server:
        report = run_load(server, specs, SECONDS)
        alive = server.proc.poll() is None
    (tmp_path / "load_test.json").write_text(json.dumps(report, indent=2))      # the whole report, for a look
    summary = {k: report[k] for k in ("clicks", "latency_s", "settled_s", "memory_mb", "errors", "crosstalk",
                                      "page_errors", "reloads")}
    assert not report["errors"], summary
    assert not report["sessions_without_answers"], report["per_session"]
    assert not report["crosstalk"], summary
    # The one JavaScript error seen under load is streamlit-image-coordinates' first render
    # missing its <img> (RELIABILITY.md, "Load"); the session reloads once and counts it. Any
    # other uncaught error fails.
    assert all(KNOWN_COMPONENT_RACE in e for e in report["page_errors"]), report["page_errors"]
    assert report["memory_mb"]["hwm"] < MEMORY_BOUND_MB, summary
    assert alive and report["healthy_after"], server.log_tail()
