"""A Streamlit client without a browser: speaks the app's own websocket protocol
(`/_stcore/stream`, protobuf `BackMsg` / `ForwardMsg` of the installed streamlit) so that a
load test can run many sessions whose own cost is a small fraction of the server's.

What a browser tab does, and what this does the same way:

* connect: `GET /_stcore/health` sets the XSRF cookie; the websocket to `/_stcore/stream`
  carries the cookie and the subprotocols `["streamlit", <xsrf token>]` (Streamlit passes
  tokens in that header) and an `Origin` of the server itself;
* a script run: `BackMsg.rerun_script` with the page's `query_string`, its `page_name` (URL
  path) or `page_script_hash`, and the widget states the tab holds (`WidgetStates`); the
  server answers with `new_session`, deltas (one element or block each, addressed by
  `metadata.delta_path`) and `script_finished`. A run that ends `FINISHED_EARLY_FOR_RERUN`
  (`st.switch_page`, a callback's rerun) is followed by another: `run` waits for the one
  that finishes successfully;
* a widget change: set its state (found by the widget's `key`: Streamlit's element ids end
  in `-<key>`) and rerun with all the states held, as the frontend does;
* a file upload: `BackMsg.file_urls_request` -> `ForwardMsg.file_urls_response` (an upload
  URL per file), an HTTP `PUT` of the file as multipart form data with the `X-Xsrftoken`
  header, then the uploader's `file_uploader_state_value` in the next rerun (the frontend's
  `FileUploadClient`);
* a button: `trigger_value=True` for one run.

After each run `Page` holds the run's elements: their text (markdown, captions, alerts,
code), widgets by key (id, value, options), and exceptions (`Element.exception`: a
Streamlit error box), so a caller can check what the page says. Only the websockets library
(a Streamlit dependency) and the standard library are used.
"""
from __future__ import annotations

import asyncio
import http.cookies
import json
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

XSRF_COOKIE = "_streamlit_xsrf"
FINISHED_OK = ForwardMsg.ScriptFinishedStatus.Value("FINISHED_SUCCESSFULLY")
EARLY_FOR_RERUN = ForwardMsg.ScriptFinishedStatus.Value("FINISHED_EARLY_FOR_RERUN")
TEXT_FIELDS = {"markdown": "body", "alert": "body", "code": "code_text", "heading": "body", "text": "body"}


class StreamlitError(RuntimeError):
    """The server refused or closed something a browser tab would have been given."""


@dataclass
class Widget:
    kind: str                    # the Element oneof name: selectbox, number_input, file_uploader, ...
    id: str
    proto: Any                   # the element's protobuf (label, options, value, ...)


@dataclass
class Page:
    """What one finished script run drew."""
    elements: dict[tuple[int, ...], tuple[str, Any]] = field(default_factory=dict)   # delta path -> (kind, proto)
    page_script_hash: str = ""

    def texts(self) -> list[str]:
        out = []
        for _, (kind, el) in sorted(self.elements.items()):
            name = TEXT_FIELDS.get(kind)
            if name:
                out.append(getattr(el, name))
        return out

    def text(self) -> str:
        return "\n".join(self.texts())

    def widgets(self) -> dict[str, Widget]:
        """Widgets by user key (the id's part after the last `-` run of Streamlit's prefix)."""
        out = {}
        for _, (kind, el) in self.elements.items():
            wid = getattr(el, "id", "") if hasattr(el, "id") else ""
            if wid.startswith("$$ID-"):
                key = wid.split("-", 2)[2] if wid.count("-") >= 2 else wid
                out[key] = Widget(kind, wid, el)
        return out

    def exceptions(self, trace: bool = False) -> list[str]:
        """Exception elements (Streamlit's error box for an uncaught exception): "Type: message"
        (and the last lines of the stack trace with `trace`)."""
        out = []
        for _, (kind, el) in self.elements.items():
            if kind == "exception":
                tail = " | " + " / ".join(x.strip() for x in el.stack_trace[-4:]) if trace else ""
                out.append(f"{el.type}: {el.message}{tail}")
        return out

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.elements.values() if k == kind)


@dataclass
class RunStats:
    seconds: float = 0.0         # rerun sent -> script_finished (successfully)
    messages: int = 0
    bytes: int = 0


class Session:
    """One browser tab's Streamlit session (connect with `await Session.open(base, path_query)`)."""

    def __init__(self, base: str):
        self.base = base.rstrip("/")
        self.ws = None
        self.cookie = ""
        self.xsrf = ""
        self.session_id = ""
        self.pages: dict[str, str] = {}          # url path -> page_script_hash (from the navigation message)
        self.page_hash = ""
        self.url_path = ""                       # the tab's URL path: the page it shows ("" = default)
        self.query = ""
        self.states: dict[str, Any] = {}         # widget id -> WidgetState the tab holds
        self.page = Page()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._reader: asyncio.Task | None = None
        self.closed_reason: str | None = None
        self.total_bytes = 0
        self.notices: list[str] = []             # what the tab would show beside the page (page not found)

    # ------------------------------------------------------------------ connection
    async def connect(self) -> None:
        import websockets

        loop = asyncio.get_running_loop()
        self.cookie, self.xsrf = await loop.run_in_executor(None, self._xsrf_cookie)
        parts = urlsplit(self.base)
        ws_url = f"ws://{parts.netloc}{parts.path}/_stcore/stream"
        self.ws = await websockets.connect(
            ws_url, subprotocols=["streamlit", self.xsrf] if self.xsrf else ["streamlit"],
            additional_headers={"Origin": self.base, "Cookie": f"{XSRF_COOKIE}={self.cookie}"} if self.cookie
            else {"Origin": self.base}, max_size=None, open_timeout=60, ping_interval=None, compression=None)
        self._reader = asyncio.create_task(self._read())

    def _xsrf_cookie(self) -> tuple[str, str]:
        """(cookie value, token for the header) from `/_stcore/health`'s Set-Cookie."""
        with urllib.request.urlopen(self.base + "/_stcore/health", timeout=30) as r:
            raw = r.headers.get_all("Set-Cookie") or []
        for header in raw:
            c = http.cookies.SimpleCookie()
            try:
                c.load(header)
            except http.cookies.CookieError:
                # the value holds "|" characters Streamlit writes unquoted
                name, _, rest = header.partition("=")
                if name.strip() == XSRF_COOKIE:
                    value = rest.split(";", 1)[0]
                    return value, value
                continue
            if XSRF_COOKIE in c:
                return c[XSRF_COOKIE].value, c[XSRF_COOKIE].value
        return "", ""

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                self.total_bytes += len(data)
                msg = ForwardMsg()
                msg.ParseFromString(data)
                await self._queue.put((msg, len(data)))
        except Exception as e:  # noqa: BLE001 — a lost connection is reported to whoever waits
            self.closed_reason = f"{type(e).__name__}: {e}"
        finally:
            self.closed_reason = self.closed_reason or f"closed ({getattr(self.ws, 'close_code', None)})"
            await self._queue.put((None, 0))

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            try:
                await asyncio.wait_for(self._reader, 5)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                self._reader.cancel()

    async def _next(self, timeout: float) -> tuple[ForwardMsg, int]:
        msg, n = await asyncio.wait_for(self._queue.get(), timeout)
        if msg is None:
            raise StreamlitError(f"websocket lost: {self.closed_reason}")
        return msg, n

    async def _send(self, back: BackMsg) -> None:
        await self.ws.send(back.SerializeToString())

    # ------------------------------------------------------------------ script runs
    async def run(self, *, query: str | None = None, page: str | None = None, timeout: float = 120.0,
                  trigger: dict[str, Any] | None = None) -> RunStats:
        """Rerun the script as a tab does (with `query` as its query string, on page `page` =
        URL path, or the current one) and wait until a run finished successfully; `self.page`
        holds what it drew. `trigger`: widget id -> WidgetState sent for this run only."""
        if query is not None:
            self.query = query
        back = BackMsg()
        rs = back.rerun_script
        rs.query_string = self.query
        if page is not None:
            self.url_path = page
        # as the frontend: the page's URL path and, once known, its script hash
        rs.page_name = self.url_path
        if self.url_path in self.pages:
            rs.page_script_hash = self.pages[self.url_path]
        for wid, ws in {**self.states, **(trigger or {})}.items():
            rs.widget_states.widgets.add().CopyFrom(ws)
        want = self.pages.get(page) if page else None       # known before the request: a page switch
        t0 = time.perf_counter()
        await self._send(back)
        stats = await self._collect(timeout)
        while want and self.page.page_script_hash != want and time.perf_counter() - t0 < timeout:
            # a run the server started before this request (a callback's st.rerun) finished first:
            # the tab shows the page it asked for once that run's answer is in
            more = await self._collect(max(0.01, timeout - (time.perf_counter() - t0)))
            stats.messages, stats.bytes = stats.messages + more.messages, stats.bytes + more.bytes
        stats.seconds = time.perf_counter() - t0
        return stats

    async def _collect(self, timeout: float) -> RunStats:
        deadline = time.monotonic() + timeout
        stats, page = RunStats(), Page()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise asyncio.TimeoutError(f"no finished script run in {timeout:.0f} s")
            msg, n = await self._next(left)
            stats.messages += 1
            stats.bytes += n
            kind = msg.WhichOneof("type")
            if kind == "new_session":
                ns = msg.new_session
                if ns.initialize.session_id:
                    self.session_id = ns.initialize.session_id
                page = Page(page_script_hash=ns.page_script_hash)
                self.page_hash = ns.page_script_hash or self.page_hash
                for p in ns.app_pages:
                    self.pages[p.url_pathname] = p.page_script_hash
            elif kind == "navigation":
                for p in msg.navigation.app_pages:
                    self.pages[p.url_pathname] = p.page_script_hash
                if msg.navigation.page_script_hash:
                    self.page_hash = page.page_script_hash = msg.navigation.page_script_hash
            elif kind == "page_info_changed":
                self.query = msg.page_info_changed.query_string
            elif kind == "delta":
                d = msg.delta
                which = d.WhichOneof("type")
                if which == "new_element":
                    ek = d.new_element.WhichOneof("type")
                    el = getattr(d.new_element, ek) if ek else None
                    page.elements[tuple(msg.metadata.delta_path)] = (ek, el)
                    self._sync_widget(ek, el)
                elif which == "add_block":
                    page.elements[tuple(msg.metadata.delta_path)] = ("block", d.add_block)
            elif kind == "script_finished":
                if msg.script_finished == EARLY_FOR_RERUN:
                    continue
                self.page = page
                paths = [p for p, h in self.pages.items() if h == page.page_script_hash and p and " " not in p]
                if paths and self.url_path not in paths:     # the app switched pages (st.switch_page)
                    self.url_path = paths[0]
                self._drop_stale(page)
                return stats
            elif kind == "page_not_found":   # the tab shows a notice; the script runs the default page
                self.notices.append(f"page not found: {msg.page_not_found.page_name!r}")

    def _sync_widget(self, kind: str | None, el: Any) -> None:
        """A widget the server set (`set_value`): the tab now holds that value."""
        if kind == "number_input" and el.set_value and el.id in self.states:
            self.states[el.id].double_value = el.value

    def _drop_stale(self, page: Page) -> None:
        ids = {w.id for w in page.widgets().values()}
        self.states = {k: v for k, v in self.states.items() if k in ids}

    # ------------------------------------------------------------------ widgets
    def widget(self, key: str) -> Widget:
        w = self.page.widgets().get(key)
        if w is None:
            raise StreamlitError(f"no widget with key {key!r} on the page (have {sorted(self.page.widgets())})")
        return w

    def _state(self, wid: str):
        from streamlit.proto.WidgetStates_pb2 import WidgetState

        ws = WidgetState()
        ws.id = wid
        return ws

    def set_number(self, key: str, value: float) -> None:
        ws = self._state(self.widget(key).id)
        ws.double_value = value
        self.states[ws.id] = ws

    def set_string(self, key: str, value: str) -> None:
        ws = self._state(self.widget(key).id)
        ws.string_value = value
        self.states[ws.id] = ws

    def set_json_value(self, wid: str, value: Any) -> None:
        """A custom component's value (`json_value`), by widget id."""
        ws = self._state(wid)
        ws.json_value = json.dumps(value)
        self.states[wid] = ws

    def set_selection(self, wid: str, value: Any) -> None:
        """A chart's selection (`st.plotly_chart(on_select=...)`: a JSON `string_value`), by widget id."""
        ws = self._state(wid)
        ws.string_value = json.dumps(value)
        self.states[wid] = ws

    def selectbox_set(self, key: str, option: str) -> None:
        """A selectbox's choice, as the frontend sends it (the option's text)."""
        self.set_string(key, option)

    def trigger(self, key: str) -> dict[str, Any]:
        ws = self._state(self.widget(key).id)
        ws.trigger_value = True
        return {ws.id: ws}

    async def upload(self, key: str, name: str, data: bytes, content_type: str = "application/octet-stream",
                     timeout: float = 60.0) -> None:
        """Put `data` into file uploader `key` as the frontend does; the next `run` sends it."""
        from streamlit.proto.WidgetStates_pb2 import WidgetState

        wid = self.widget(key).id
        back = BackMsg()
        req = back.file_urls_request
        req.request_id = uuid.uuid4().hex
        req.file_names.append(name)
        req.session_id = self.session_id
        await self._send(back)
        deadline = time.monotonic() + timeout
        while True:
            msg, _ = await self._next(max(0.01, deadline - time.monotonic()))
            if msg.WhichOneof("type") == "file_urls_response" and msg.file_urls_response.response_id == req.request_id:
                break
        resp = msg.file_urls_response
        if resp.error_msg or not resp.file_urls:
            raise StreamlitError(f"no upload URL: {resp.error_msg!r}")
        urls = resp.file_urls[0]
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._put, urls.upload_url, name, data, content_type, timeout)
        ws = WidgetState()
        ws.id = wid
        info = ws.file_uploader_state_value.uploaded_file_info.add()
        info.name, info.size, info.file_id = name, len(data), urls.file_id
        info.file_urls.CopyFrom(urls)
        self.states[wid] = ws

    def _put(self, url: str, name: str, data: bytes, content_type: str, timeout: float) -> None:
        if url.startswith("/"):
            parts = urlsplit(self.base)
            url = f"{parts.scheme}://{parts.netloc}{url}"
        boundary = uuid.uuid4().hex
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
                f"Content-Type: {content_type}\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
        req = urllib.request.Request(url, data=body, method="PUT", headers={
            "Content-Type": f"multipart/form-data; boundary={boundary}", "X-Xsrftoken": self.xsrf,
            "Cookie": f"{XSRF_COOKIE}={self.cookie}", "Origin": self.base})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if r.status not in (200, 204):
                raise StreamlitError(f"upload answered {r.status}")


async def open_session(base: str, path_query: str = "/", timeout: float = 120.0) -> tuple[Session, RunStats]:
    """A new tab opening `base + path_query` (e.g. `/?page=bias&patch=3,4`): connected, first
    run finished (`session.page`)."""
    s = Session(base)
    await s.connect()
    parts = urlsplit(path_query)
    stats = await s.run(query=parts.query, page=parts.path.strip("/"), timeout=timeout)
    return s, stats
