"""Server-side: room in the memory budget for a big upload, made before its bytes arrive.

Streamlit reads an uploaded file whole into the server's memory (its upload manager) before any
script run sees it, so nothing in a page can make room for it: a 173 MB ViT-B/16 arriving while
the budget was full took the server 173 MB past it (issue 30's memory walk, peak 1,005 MiB at
the default budget). `MakeRoomForUploads` (ASGI middleware, added by app.py's `st.App`) asks the
process's one budget (`vitpe_core.membudget.shared`) to evict least recently used entries for
the request's bytes as they arrive, `STEP_BYTES` ahead of them: a PUT to Streamlit's upload route
declaring at least `MIN_BYTES`, for a session the server has open, within Streamlit's upload
limit (so a stray request cannot empty the caches). The room follows the bytes received, not
the declared Content-Length: a request that declares 190 MB and sends one evicts no more than
one step. The import form then lets the bytes go before it builds the model, and makes room for
the model in turn (pages/common/import_form.py). Smaller uploads (images, config files) pass
untouched.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

MIN_BYTES = 8 * 2**20           # below this an upload is not worth an eviction (an image, a config.json)
STEP_BYTES = 16 * 2**20         # room is made this far ahead of the bytes received
UPLOAD_ROUTE = "/_stcore/upload_file/"   # Streamlit's (starlette_routes' BASE_ROUTE_UPLOAD_FILE), below any base path


def declared_upload_bytes(scope: dict) -> int:
    """The Content-Length of a PUT to Streamlit's upload route, else 0."""
    if scope.get("type") != "http" or scope.get("method") != "PUT" or UPLOAD_ROUTE not in scope.get("path", ""):
        return 0
    for name, value in scope.get("headers") or []:
        if name.lower() == b"content-length":
            try:
                return max(int(value), 0)
            except ValueError:
                return 0
    return 0


def upload_session(scope: dict) -> str:
    """The session id in an upload route's path (`.../upload_file/<session>/<file>`), else ""."""
    rest = scope.get("path", "").split(UPLOAD_ROUTE, 1)
    return rest[1].split("/", 1)[0] if len(rest) == 2 else ""


def live_session(session_id: str) -> bool:
    """Whether `session_id` is a session this server has open (Streamlit's runtime): a request
    for any other is refused by Streamlit anyway and must not empty the caches."""
    from streamlit.runtime import Runtime
    return bool(session_id) and Runtime.exists() and Runtime.instance().is_active_session(session_id)


def over_upload_limit(nbytes: int) -> bool:
    """Bigger than Streamlit's `server.maxUploadSize` (refused by it, so not worth an eviction)."""
    from streamlit import config
    return nbytes > int(config.get_option("server.maxUploadSize")) * 2**20 + 2**20   # + the form's framing


def make_room(nbytes: int) -> list:
    """Evict from the process's budget until `nbytes` more would fit; what went."""
    from vitpe_core import membudget      # the standard library only: no torch on the event loop
    return membudget.shared().make_room(nbytes, why=f"an upload of {nbytes / 2**20:.0f} MiB")


class MakeRoomForUploads:
    """ASGI middleware: for an upload declaring at least `MIN_BYTES`, room in the budget
    (`make_room`, in a worker thread: it may collect garbage) `step` bytes at a time, each step
    made before the bytes that need it are handed on; everything else passes through."""

    def __init__(self, app: Callable[..., Awaitable[None]], min_bytes: int = MIN_BYTES,
                 step: int = STEP_BYTES) -> None:
        self.app = app
        self.min_bytes, self.step = min_bytes, step

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        nbytes = declared_upload_bytes(scope)
        if nbytes < self.min_bytes or over_upload_limit(nbytes) or not live_session(upload_session(scope)):
            return await self.app(scope, receive, send)
        from starlette.concurrency import run_in_threadpool

        got = room = 0

        async def receive_with_room() -> dict:
            nonlocal got, room
            message = await receive()
            got += len(message.get("body", b""))
            if got > room and room < nbytes:      # the bytes outran the room: one more step (never past the declared)
                room = min(max(room + self.step, got), nbytes)
                await run_in_threadpool(make_room, room)   # room for all of it so far: the upload is no entry
            return message

        await self.app(scope, receive_with_room, send)
