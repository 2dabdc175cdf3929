"""HTTP methods as RFC 9110 says, for every path of the API, in one pure ASGI middleware (outermost but metrics):

- a method the path does not serve gets 405 with ``Allow`` naming exactly the methods it does serve (every route
  of the path together: starlette alone names only the first route it meets, so ``GET /v1/feedback`` and ``POST
  /v1/feedback`` answered ``Allow: POST``);
- ``OPTIONS`` on any path answers 204 with that ``Allow`` (no key needed: it says which methods exist, no data);
- ``HEAD`` on a path that serves ``GET`` is answered as the ``GET`` (the same status and headers, access control
  included) without the body.

``Allow`` lists ``HEAD`` wherever ``GET`` is served and ``OPTIONS`` everywhere, because both are answered there.
A path no route matches passes through (404 from the router).
"""

from __future__ import annotations

from typing import Any

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from entrypoints.api.auth import flat_routes
from entrypoints.api.middleware import send_error

# The order methods are listed in ``Allow``.
ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(routes: list[Any], scope: Scope) -> list[str] | None:
    """The methods the request's path serves (with HEAD for GET, and OPTIONS), None when no route has the path."""
    methods: set[str] = set()
    probe = dict(scope, method="GET")  # a route matches the path FULL or PARTIAL (the path, another method)
    for route in routes:
        route_methods = getattr(route, "methods", None)
        if not route_methods:
            continue
        match, _ = route.matches(probe)
        if match != Match.NONE:
            methods.update(m.upper() for m in route_methods)
    if not methods:
        return None
    if "GET" in methods:
        methods.add("HEAD")
    methods.add("OPTIONS")
    return sorted(methods, key=lambda m: ORDER.index(m) if m in ORDER else len(ORDER))


class HttpMethods:
    """405 with the path's exact ``Allow``, ``OPTIONS`` and ``HEAD`` (module docstring)."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute]) -> None:
        self.app = app
        self.routes = routes  # the app's own list: routes added later are seen (flattened again when it grows)
        self._flat: list[Any] = []
        self._seen = -1

    def _routes(self) -> list[Any]:
        if self._seen != len(self.routes):
            self._flat = flat_routes(self.routes)
            self._seen = len(self.routes)
        return self._flat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        allow = allowed_methods(self._routes(), scope)
        method = str(scope.get("method", "")).upper()
        if allow is None:
            await self.app(scope, receive, send)
            return
        header = ", ".join(allow)
        if method == "OPTIONS":
            await send({"type": "http.response.start", "status": 204,
                        "headers": [(b"allow", header.encode()), (b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        if method == "HEAD" and "GET" in allow:
            await self.app(dict(scope, method="GET"), receive, _without_body(send))
            return
        if method not in allow:
            message = f"{method} is not allowed on {scope.get('path', '')}; it answers {header} (see /docs for the API)"
            await send_error(send, 405, "method_not_allowed", message, {"Allow": header})
            return
        await self.app(scope, receive, send)


def _without_body(send: Send) -> Send:
    """``send`` for a HEAD answered as a GET: the status and headers (Content-Length included) go, the body not."""

    async def head_send(message: Message) -> None:
        if message["type"] == "http.response.body":
            if not message.get("more_body", False):
                await send({"type": "http.response.body", "body": b""})
            return
        await send(message)

    return head_send
