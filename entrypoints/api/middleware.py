"""Pure ASGI middleware: access control (key, role, collection, rate; audit of write and admin actions), request
body limit (413 before the body is read into memory; a stalled body cut) and HTTP metrics."""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from entrypoints.api.auth import PUBLIC, RouteAccess, access_of, flat_routes, token_from_headers
from entrypoints.api.metrics import ApiMetrics
from services.access import AccessGate
from services.core.errors import DprError

log = logging.getLogger(__name__)


class _BodyTooLarge(Exception):
    pass


class _Status:
    """Passes an app's messages on to ``send`` and keeps the status of its response (None: not started)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.code: int | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.code = int(message["status"])
        await self._send(message)


async def send_error(send: Send, status: int, type_: str, message: str,
                      headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"error": {"type": type_, "message": message}}).encode()
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                        *extra],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Refuse bodies over ``max_bytes``: by Content-Length at once, or while streaming a chunked body."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return (
            f"request body is over the {self.max_bytes:,}-byte limit; send smaller batches or raise "
            "DPR_API__MAX_REQUEST_BYTES"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await send_error(send, 400, "bad_request", "Content-Length is not a number")
                    return
                if length > self.max_bytes:
                    await send_error(send, 413, "too_large", self._message())
                    return
        received = 0
        status = _Status(send)

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge
            return message

        try:
            await self.app(scope, limited_receive, status.send)
        except _BodyTooLarge:
            if status.code is None:
                await send_error(send, 413, "too_large", self._message())


class HttpMetrics:
    """Count and time every request by its route template (never the raw path: bounded label values)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = _Status(send)
        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, status.send)
        finally:
            self.metrics.observe_http(_route_of(scope), scope.get("method", ""), status.code or 500,
                                      time.perf_counter() - t0)


def _route_of(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


class AccessControl:
    """Before anything reads the body: find the route, the role it needs (``entrypoints.api.auth``), and ask the
    gate whether the request's key may (401 no or wrong key, 403 role or collection, 429 over its rate, 503 keys
    file unreadable). Then, for write and admin routes, one audit line with the outcome, refusals included.

    The collection a request acts on: a ``collection`` path or query parameter when a route has one, else the
    collection this server answers for."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute], gate: AccessGate, collection: str,
                 public_paths: frozenset[str]) -> None:
        self.app = app
        self.routes = routes  # the app's route list itself: routes mounted later are seen too
        self.gate = gate
        self.collection = collection
        self.public_paths = public_paths
        self._flat: list[Any] | None = None  # flat_routes(routes), kept: flattening costs more than matching

    def _match(self, scope: Scope) -> tuple[Any, dict[str, Any]]:
        found = self._first(scope)
        if found[0] is None:  # none kept yet, or a route added since: flatten the app's list again
            self._flat = flat_routes(self.routes)
            found = self._first(scope)
        return found

    def _first(self, scope: Scope) -> tuple[Any, dict[str, Any]]:
        for route in self._flat or ():
            match, child = route.matches(scope)
            if match == Match.FULL:
                return route, child
        return None, {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route, child = self._match(scope)
        access = access_of(route, self.public_paths) if route is not None else PUBLIC  # unmatched: 404/405
        if access.public or route is None:
            await self.app(scope, receive, send)
            return
        path_params: dict[str, Any] = child.get("path_params", {})
        collection = self._collection(scope, route, path_params) if access.collection else None
        client = (scope.get("client") or ("unknown", 0))[0]
        action = f"{scope.get('method', '')} {getattr(route, 'path', '')}"
        token = token_from_headers(scope.get("headers", []))
        try:
            decision = self.gate.decide(token, access.needed, collection, client, action)
        except DprError as e:  # the keys file is unreadable: fail closed
            log.error("access check failed: %s", e)
            scope["route"] = route
            await send_error(send, 503, "unavailable", str(e), {"Retry-After": "5"})
            return
        principal = decision.principal
        status = decision.status
        if status:
            scope["route"] = route  # metrics label the refusal by its route
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
            if status == 429:
                headers["Retry-After"] = str(max(1, math.ceil(decision.retry_after)))
            await send_error(send, status, decision.type, decision.message, headers)
        else:
            scope.setdefault("state", {})["principal"] = principal
            sent = _Status(send)
            try:
                await self.app(scope, receive, sent.send)
            finally:
                if access.audited:
                    await self._audit(access, principal, action, collection or self.collection, path_params,
                                      sent.code or 500, client)
            return
        if access.audited:
            await self._audit(access, principal, action, collection or self.collection, path_params, status, client)

    def _collection(self, scope: Scope, route: Any, path_params: dict[str, Any]) -> str:
        """The route's own ``collection`` path or query parameter, else the server's collection. A query parameter
        the route does not declare is ignored: the route would not read it, so it must not pick the check."""
        if "collection" in path_params:
            return str(path_params["collection"])
        if "collection" in _query_params(route):
            values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("collection")
            if values:
                return values[0]
        return self.collection

    async def _audit(self, access: RouteAccess, principal: Any, action: str, collection: str,
                     target: dict[str, Any], status: int, client: str) -> None:
        entry = {
            "who": {"id": principal.id, "name": principal.name} if principal is not None else None,
            "role": principal.role if principal is not None else None,
            "action": action,
            "needs": access.role,
            "collection": collection,
            "target": {k: str(v) for k, v in target.items()},
            "status": status,
            "client": client,
        }
        try:
            await run_in_threadpool(self.gate.audit_log.append, entry)
        except OSError:
            log.exception("could not append to the audit log %s", self.gate.audit_log.path)


def _query_params(route: Any) -> set[str]:
    """The query parameters a FastAPI route reads (its dependencies' included)."""
    names: set[str] = set()
    pending = [getattr(getattr(route, "original_route", route), "dependant", None)]
    while pending:
        dependant = pending.pop()
        if dependant is None:
            continue
        names.update(param.alias for param in getattr(dependant, "query_params", ()))
        pending.extend(getattr(dependant, "dependencies", ()))
    return names
