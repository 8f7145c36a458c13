"""A big upload gets room in the one memory budget before Streamlit reads its bytes
(pages/common/upload_room.py, issue 30): the middleware evicts least recently used entries for
the bytes of a PUT to Streamlit's upload route as they arrive (a step ahead of them, never more
than the declared length), and passes the request on whole;
small uploads, requests for a session the server does not have, uploads over Streamlit's
limit and other requests pass untouched; app.py's server has the middleware."""
from __future__ import annotations

import asyncio

import pytest

from pages.common import upload_room
from vitpe_core import membudget

MIB = 2**20
ROUTE = "/_stcore/upload_file/session-1/file-1"


def scope(path: str = ROUTE, method: str = "PUT", length: int | None = 40 * MIB, kind: str = "http") -> dict:
    headers = [(b"content-type", b"multipart/form-data; boundary=x")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": kind, "method": method, "path": path, "headers": headers}


@pytest.mark.parametrize("s, expected", [
    (scope(), 40 * MIB),
    (scope(path="/base/_stcore/upload_file/s/f"), 40 * MIB),         # below server.baseUrlPath
    (scope(method="DELETE"), 0),                                       # the uploader's ✕
    (scope(path="/_stcore/health"), 0),
    (scope(length=None), 0),                                           # chunked: nothing declared
    ({**scope(), "headers": [(b"Content-Length", b"nan")]}, 0),
    ({**scope(), "headers": [(b"Content-Length", b"-5")]}, 0),
    (scope(kind="websocket"), 0),
])
def test_only_a_put_to_the_upload_route_declares_bytes(s, expected):
    assert upload_room.declared_upload_bytes(s) == expected


def test_the_session_is_read_from_the_path_and_none_is_live_without_a_server():
    assert upload_room.upload_session(scope()) == "session-1"
    assert upload_room.upload_session(scope(path="/base/_stcore/upload_file/abc/f")) == "abc"
    assert upload_room.upload_session(scope(path="/_stcore/health")) == ""
    assert not upload_room.live_session("session-1")          # no Streamlit runtime in this process
    assert not upload_room.over_upload_limit(190 * MIB)        # .streamlit/config.toml: maxUploadSize 200 (MB)
    assert upload_room.over_upload_limit(300 * MIB)


@pytest.fixture
def budget(monkeypatch):
    """The process's budget replaced by a 100 MiB one holding three 30 MiB entries; "session-1"
    is the server's one open session."""
    monkeypatch.setattr(upload_room, "live_session", lambda session_id: session_id == "session-1")
    b = membudget.Budget(100 * MIB)
    pool = b.pool("traces")
    for k in ("old", "middle", "new"):
        pool.put(k, object(), 30 * MIB)
    monkeypatch.setattr(membudget, "_shared", b)
    return b


def call(s: dict, body: bytes = b"x" * 1024, parts: int = 1) -> dict:
    """Run the middleware on one request whose body arrives in `parts` messages; what the app
    behind it saw (the budget's total before each message it read, and after the last)."""
    seen: dict = {"totals_mib": []}
    chunks = [body[i * len(body) // parts:(i + 1) * len(body) // parts] for i in range(parts)]

    async def app(scope, receive, send):
        got = b""
        while True:
            seen["totals_mib"].append(membudget.shared().total / MIB)
            message = await receive()
            got += message["body"]
            if not message["more_body"]:
                break
        seen["total_mib"], seen["body"] = membudget.shared().total / MIB, got
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive():
        part = chunks.pop(0)
        return {"type": "http.request", "body": part, "more_body": bool(chunks)}

    sent: list = []

    async def send(message):
        sent.append(message)

    asyncio.run(upload_room.MakeRoomForUploads(app)(s, receive, send))
    seen["status"] = sent[0]["status"]
    return seen


def test_a_big_upload_evicts_the_least_recently_used_as_its_bytes_arrive(budget):
    """Room for each step (`STEP_BYTES` ahead of the bytes received) is made before the bytes
    that need it are handed on, for all the bytes so far: 70 MiB in seven parts into a budget
    holding 90 of 100 MiB evicts the two least recently used entries, one at a time."""
    budget.pool("traces").get("old")                       # now the most recent: "middle" goes first
    body = b"x" * (70 * MIB)
    seen = call(scope(length=len(body)), body, parts=7)
    assert seen["status"] == 204 and seen["body"] == body
    # room for 16 MiB at the first 10 (middle goes), 32 at 20, 48 at 40 (new goes), 64 at 50, 70 at 70
    assert seen["totals_mib"] == [90, 60, 60, 60, 30, 30, 30] and seen["total_mib"] == 30
    assert budget.pool("traces").keys() == ["old"]


def test_a_declared_length_the_body_does_not_bear_out_evicts_one_step_at_most(budget):
    """A PUT that declares 190 MB and sends 1 KiB (a lying client, or a cancelled upload): room
    for one step, not for the declared length; every entry used to go."""
    seen = call(scope(length=190 * MIB))
    assert seen["status"] == 204 and seen["body"] == b"x" * 1024
    assert seen["total_mib"] == 60 and budget.pool("traces").keys() == ["middle", "new"]


def test_small_uploads_and_other_requests_pass_untouched(budget):
    for s in (scope(length=upload_room.MIN_BYTES - 1), scope(method="GET"), scope(path="/_stcore/health"),
              scope(path="/_stcore/upload_file/not-a-session/file-1"),      # Streamlit refuses it: no eviction
              scope(length=10_000 * MIB)):                                   # over the upload limit: likewise
        assert call(s)["total_mib"] == 90
    assert len(budget.pool("traces")) == 3


def test_the_apps_server_makes_room_for_uploads():
    import importlib

    app_module = importlib.import_module("app")            # as `streamlit run app.py` does: builds the st.App
    names = [m.cls.__name__ for m in app_module.app._user_middleware]   # st.App keeps them there (private)
    assert "MakeRoomForUploads" in names and "RedirectDeepPaths" in names
