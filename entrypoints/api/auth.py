"""Who may call which route: every route declares the role it needs, in one place, with ``@requires(role)`` on its
endpoint (``"public"`` for probes and the console's static files). A route that declares nothing needs ``admin``
(deny by default); ``tests/unit/test_role_matrix.py`` fails for any route without an explicit declaration.

The check itself runs in ``entrypoints.api.middleware.AccessControl`` before the body is read, with the decision
made by ``services.access.AccessGate``. Keys arrive as header ``X-API-Key`` or ``Authorization: Bearer``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from starlette.routing import BaseRoute

from services.access import Principal, Role
from services.access.gate import ANONYMOUS

Need = Literal["public", "read", "write", "admin"]
DEFAULT: Need = "admin"
_ATTRIBUTE = "__dpr_access__"
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class RouteAccess:
    """The role a route needs, and whether it acts on a collection (a key limited to collections is checked)."""

    role: Need
    collection: bool = True
    declared: bool = True

    @property
    def public(self) -> bool:
        return self.role == "public"

    @property
    def needed(self) -> Role:
        if self.role == "public":
            raise ValueError("a public route needs no role")
        return self.role

    @property
    def audited(self) -> bool:
        """Write and admin actions land in the audit log, whatever their outcome."""
        return self.role in ("write", "admin")


PUBLIC = RouteAccess("public", collection=False)


def requires(role: Need, *, collection: bool = True) -> Callable[[F], F]:
    """Declare the role an endpoint needs: ``@router.get(...)`` then ``@requires("read")`` on the function.

    ``collection=False``: the route does not act on a collection (who am I), so a key limited to collections may
    call it whatever the server's collection."""
    if role not in ("public", "read", "write", "admin"):
        raise ValueError(f"unknown role {role!r}")

    def mark(endpoint: F) -> F:
        setattr(endpoint, _ATTRIBUTE, RouteAccess(role, collection=collection and role != "public"))
        return endpoint

    return mark


def declared_access(route: Any) -> RouteAccess | None:
    """What ``route``'s endpoint declares, None when it declares nothing."""
    endpoint = getattr(route, "endpoint", None)
    access = getattr(endpoint, _ATTRIBUTE, None)
    return access if isinstance(access, RouteAccess) else None


def access_of(route: Any, public_paths: frozenset[str] = frozenset()) -> RouteAccess:
    """The access a route needs: its declaration; FastAPI's own schema and docs pages (``public_paths``) are
    public; anything else is admin-only (deny by default)."""
    access = declared_access(route)
    if access is not None:
        return access
    if getattr(route, "path", None) in public_paths:
        return PUBLIC
    return RouteAccess(DEFAULT, declared=False)


def flat_routes(routes: Sequence[BaseRoute]) -> list[Any]:
    """Every route of an app, included routers flattened (FastAPI >= 0.13x keeps an included router as one entry;
    ``iter_route_contexts`` yields its routes with their full paths)."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # an older FastAPI copies included routes into the app's list
        return list(routes)
    return list(iter_route_contexts(routes))


def key_bytes(header_value: str) -> bytes:
    """The key a client sent, as UTF-8 bytes. HTTP headers arrive as bytes that the server decodes as Latin-1, so a
    UTF-8 client's "clé" arrives as "clÃ©": take the raw bytes back, read them as UTF-8 (or, failing that, as the
    Latin-1 a Latin-1 client meant) and compare UTF-8 with UTF-8."""
    raw = header_value.encode("latin-1", "replace")
    try:
        raw.decode("utf-8")
        return raw
    except UnicodeDecodeError:
        return header_value.encode("utf-8")


def token_from_headers(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The key of an ASGI request: ``X-API-Key``, else ``Authorization: Bearer``; UTF-8 bytes, None when absent."""
    bearer = None
    for name, value in headers:
        if name == b"x-api-key" and value.strip():
            return key_bytes(value.decode("latin-1").strip())
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                bearer = key_bytes(credentials.strip())
    return bearer


def security_schemes() -> dict[str, Any]:
    """The OpenAPI description of the two ways to send a key."""
    return {
        "APIKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key",
                   "description": "An API key (`dpr keys create`, or DPR_API__API_KEY: an admin key)."},
        "HTTPBearer": {"type": "http", "scheme": "bearer", "description": "The API key as a bearer token."},
    }


def request_principal(request: Any) -> Principal:
    """Who the request acts as (set by ``AccessControl``); the anonymous admin when no keys are configured."""
    principal = getattr(request.state, "principal", None)
    return principal if isinstance(principal, Principal) else ANONYMOUS
