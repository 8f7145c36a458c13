"""A short but real load test (what CI runs): the server from `streamlit run app.py` on
loopback and 8 concurrent sessions speaking Streamlit's own websocket protocol
(`benchmarks.st_client`) for 12 s, then 6 s of clicks only. The sessions click patches, switch
pages, upload images of their own, open their share links in new sessions, and session 0
imports a model on the Checkpoints page. Fails on any error (an exception on a page, an action
not answered within 60 s, a lost websocket), an unanswered click, a session without clicks,
cross-talk (a page showing another session's upload or listing another session's model, a
patch or checkpoint that is not the session's own), server memory over 1.5 GB or a failed
health check afterwards. The full run (50 sessions x 60 s, with chromium pages beside them) is
`python -m benchmarks.load_test --sessions 50 --seconds 60 --browsers 3`; its figures are in
RELIABILITY.md ("Load")."""
from __future__ import annotations

import json

import pytest

from benchmarks.harness import checkpoint_grids, streamlit_server
from benchmarks.load_test import SERVER_ARGS, make_specs, passed, run_ws_load

SESSIONS, SECONDS, CLICK_PHASE = 8, 12, 6
MEMORY_BOUND_MB = 1536

pytestmark = pytest.mark.slow


def test_concurrent_sessions_without_errors_unanswered_clicks_or_crosstalk(app_checkpoint_dir, tmp_path):
    from vitpe_core.gallery import gallery_ids

    specs = make_specs(SESSIONS, checkpoint_grids(app_checkpoint_dir), gallery_ids())
    assert len({(s.ckpt, s.image, s.patch) for s in specs}) == SESSIONS           # eight different links
    with streamlit_server(app_checkpoint_dir, log=tmp_path / "server.log", args=SERVER_ARGS,
                          env={"VITPE_UPLOAD_DIR": str(tmp_path / "uploads")}) as server:
        report = run_ws_load(server, specs, SECONDS, think=(0.2, 1.0), click_phase=CLICK_PHASE)
        alive = server.proc.poll() is None
    (tmp_path / "load_test.json").write_text(json.dumps(report, indent=2))      # the whole report, for a look
    summary = {k: report[k] for k in ("actions", "latency_s", "clicks", "unanswered_clicks", "uploads", "cpu",
                                      "memory_mb", "errors", "crosstalk", "sessions_without_clicks")}
    assert not report["errors"], summary
    assert not report["unanswered_clicks"] and not report["sessions_without_clicks"], summary
    assert not report["crosstalk"], summary
    assert report["actions"]["model"] == 1 and report["uploads"] > 0, summary     # every kind of action ran
    assert report["actions"]["page"] > 0 and report["actions"]["share"] > 0, summary
    assert report["memory_mb"]["hwm"] < MEMORY_BOUND_MB, summary
    assert alive and report["healthy_after"] and passed(report), server.log_tail()
