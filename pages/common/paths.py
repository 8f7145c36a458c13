"""Server-side: a browser address deeper than one page name gets a redirect instead of a blank page.

Streamlit serves its single-page front end at any path, but loads its scripts relative to the
address: `/pages/compare` or `/compare/extra` asks for `/pages/static/...`, gets HTML back and
shows a white page with no message. `RedirectDeepPaths` (ASGI middleware, added by app.py's
`st.App`) answers such a page request (a GET that accepts HTML) with a redirect to the page its
last segment names (`/pages/compare?show=ape` -> `/compare?show=ape`), or to `/` with the same
query, where the link checks (vitpe_core.viewstate) explain what they ignore. The default page's
own name (`/bias?ckpt=ape`, `/pages/bias`) goes to `/` with the same query: Streamlit serves the
default page only at the root and answered its name with a "Page not found" dialog over the page
(whose backdrop took the visitor's first tap or click; issue 44 item 2). Streamlit's own
routes (`_stcore/`, `static/`, `media/`, `component/`, `app/static/`) and anything below the
configured `server.baseUrlPath` are left alone.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from vitpe_core.viewstate import DEFAULT_PAGE, PAGES

from .definitions import URL_PATH as DEFINITIONS

NAMED = (*PAGES, DEFINITIONS)   # every page's url_path: the four views and the encodings' definitions

STREAMLIT_PREFIXES = ("_stcore", "static", "media", "component")   # starlette_routes' BASE_ROUTE_*, and app/static


def redirect_target(path: str, query: str, base: str = "") -> str | None:
    """Where a page request for `path` should go instead, or None to serve it as it is."""
    base = base.strip("/")
    prefix = f"/{base}" if base else ""
    if prefix and not (path == prefix or path.startswith(prefix + "/")):
        return None
    parts = path[len(prefix):].split("/")[1:]             # "/a/b" -> ["a", "b"]; "/a/" -> ["a", ""]
    if parts != [DEFAULT_PAGE] and (len(parts) < 2 or parts[0] in STREAMLIT_PREFIXES
                                    or parts[:2] == ["app", "static"]):
        return None
    named = [p for p in parts if p]
    page = named[-1] if named and named[-1] in NAMED and named[-1] != DEFAULT_PAGE else ""   # the default: `/`
    return f"{prefix}/{page}" + (f"?{query}" if query else "")


class RedirectDeepPaths:
    """ASGI middleware: `redirect_target` for GET/HEAD requests that accept HTML (a browser
    opening an address); everything else, websockets included, passes through."""

    def __init__(self, app: Callable[..., Awaitable[None]], base: str | None = None) -> None:
        self.app = app
        self.base = base

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") in ("GET", "HEAD"):
            headers = dict(scope.get("headers") or [])
            if b"text/html" in headers.get(b"accept", b""):
                target = redirect_target(scope.get("path", "/"), scope.get("query_string", b"").decode("latin-1"),
                                         self._base())
                if target is not None:
                    from starlette.responses import RedirectResponse

                    await RedirectResponse(target, status_code=307)(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    def _base(self) -> str:
        if self.base is None:
            from streamlit import config

            self.base = str(config.get_option("server.baseUrlPath") or "")
        return self.base
