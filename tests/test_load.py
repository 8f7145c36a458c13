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
RELIABILITY.md ("Load").

The big-import mode's short version (`--big-imports`, `benchmarks.load_big`): 4 sessions, one of
which imports a ViT-S/16-shaped model and clicks with it; its full run (5 ViT-B/16 among 50
sessions, peak <= 1 GiB) is in RELIABILITY.md ("Load with big imports"). The cross-talk rule
for imported models is checked on its own on stub pages (no server)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from benchmarks.harness import checkpoint_grids, streamlit_server
from benchmarks.load_test import SERVER_ARGS, main, make_specs, passed, run_ws_load
from benchmarks.load_ws import WsResult, check_page

SESSIONS, SECONDS, CLICK_PHASE = 8, 12, 6
MEMORY_BOUND_MB = 1536


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_big_import_session_clicks_its_own_model_without_errors_or_crosstalk(app_checkpoint_dir, tmp_path):
    out = tmp_path / "big.json"
    code = main(["--sessions", "4", "--seconds", "10", "--click-phase", "4", "--think", "0.2,1",
                 "--big-imports", "1", "--big-shape", "s16", "--checkpoints", str(app_checkpoint_dir),
                 "--out", str(out)])
    report = json.loads(out.read_text())
    big = report["big_imports"]
    summary = {k: report[k] for k in ("clicks", "unanswered_clicks", "errors", "crosstalk", "memory_mb")}
    assert not report["errors"] and not report["crosstalk"] and not report["unanswered_clicks"], summary
    assert big["sessions"] == [3] and big["imports_confirmed"] == 1 and big["import_s"]["3"], big
    assert big["model_clicks"] > 0 and big["latency_s"]["model_click"]["p95"] is not None, big
    assert report["memory_mb"]["within_limit"] and report["memory_mb"]["limit_mb"] == 1024, summary
    assert code == 0


def _stub_page(models: list[str], link: str) -> SimpleNamespace:
    """A session whose page lists `models` in its checkpoint box and carries `link`."""
    ckpt_box = SimpleNamespace(kind="selectbox", proto=SimpleNamespace(options=["ape", *models]))
    page = SimpleNamespace(exceptions=lambda trace=False: [], texts=lambda: [], page_script_hash="",
                           widgets=lambda: {"bias_ckpt": ckpt_box},
                           elements={(0,): ("code", SimpleNamespace(code_text=link))})
    return SimpleNamespace(page=page, pages={}, notices=[])


def test_another_sessions_imported_model_is_crosstalk_and_ones_own_is_not():
    sha = "a" * 64
    own = WsResult(spec={}, index=3, own_models={"loadb16-s3-upload"})
    other = WsResult(spec={}, index=4, own_models={"loadb16-s4-upload"})
    owners = {f"model:{sha}": 3}
    link = f"http://x/?page=bias&ckpt=loadb16-s3-upload&model={sha}&patch=1,2"
    assert check_page(_stub_page(["loadb16-s3-upload"], link), own, page="bias", ckpt="loadb16-s3-upload",
                      owners=owners) == [] and own.crosstalk == []
    check_page(_stub_page(["loadb16-s3-upload"], link), other, page="bias", owners=owners)
    assert len(other.crosstalk) == 3, other.crosstalk      # in the list, as the view's ckpt, its model id


def test_an_own_model_the_budget_evicted_is_counted_not_an_error():
    """The 50-session run with big imports: session 0's small model, evicted by a ViT-B import,
    made every later answer an error ("link ... does not carry ckpt loadmodel-upload") though the
    page had fallen back as it should. Listed but not in the view is still an error."""
    res = WsResult(spec={}, index=0, own_models={"loadmodel-upload"})
    link = "http://x/?page=bias&ckpt=ape&patch=1,2"
    assert check_page(_stub_page([], link), res, page="bias", ckpt="loadmodel-upload", patch=(3, 3)) == []
    assert res.evicted_models == {"loadmodel-upload"}
    wrong = check_page(_stub_page(["loadmodel-upload"], link), WsResult(spec={}, index=0, own_models={
        "loadmodel-upload"}), page="bias", ckpt="loadmodel-upload")
    assert wrong == [f"bias: link {link} does not carry ckpt loadmodel-upload"]
