"""Server-side: room in the memory budget for a big upload, made before its bytes arrive.

Streamlit reads an uploaded file whole into the server's memory (its upload manager) before any
script run sees it, so nothing in a page can make room for it: a 173 MB ViT-B/16 arriving while
the budget was full took the server 173 MB past it (issue 30's memory walk, peak 1,005 MiB at
the default budget). `MakeRoomForUploads` (ASGI middleware, added by app.py's `st.App`) asks the
process's one budget (`vitpe_core.membudget.shared`) to evict least recently used entries for
the request's declared length first: a PUT to Streamlit's upload route over `MIN_BYTES`, for a
session the server has open, within Streamlit's upload limit (so a stray request cannot empty
the caches). The import form then lets the bytes go before it builds the model, and makes room
for the model in turn (pages/common/import_form.py). Smaller uploads (images, config files)
pass untouched.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

MIN_BYTES = 8 * 2**20           # below this an upload is not worth an eviction (an image, a config.json)
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
    """ASGI middleware: `make_room` (in a worker thread: it may collect garbage) for an upload of
    at least `MIN_BYTES`, then the request as it came; everything else passes through."""

    def __init__(self, app: Callable[..., Awaitable[None]], min_bytes: int = MIN_BYTES) -> None:
        self.app = app
        self.min_bytes = min_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        nbytes = declared_upload_bytes(scope)
        if nbytes >= self.min_bytes and not over_upload_limit(nbytes) and live_session(upload_session(scope)):
            from starlette.concurrency import run_in_threadpool

            await run_in_threadpool(make_room, nbytes)
        await self.app(scope, receive, send)
