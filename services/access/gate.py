"""``AccessGate``: the one decision the HTTP API asks for each request: who is this key, may it call a route that
needs role R on collection C, and is it within its rate. The web layer only reads the headers and writes the answer.

Auth is on ("locked") when ``DPR_API__API_KEY`` is set or ``DATA_DIR/keys.json`` exists. The single
``DPR_API__API_KEY`` is an admin key for every collection (id ``env``). With neither, every request is served as
an anonymous admin: that is only allowed on loopback or with ``dpr serve --insecure``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.access.audit import AuditLog, audit_path
from services.access.keys import KeyStore, keys_path
from services.access.ratelimit import Buckets, RateLimiter, shared_buckets
from services.access.roles import Role, allows
from services.core.settings import Settings

AUTH_HINT = "send it as header 'X-API-Key: KEY' or 'Authorization: Bearer KEY'"


@dataclass(frozen=True)
class Principal:
    """Who a request acts as (never the secret)."""

    id: str
    name: str
    role: Role
    collections: tuple[str, ...] | None = None
    rate: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "role": self.role,
                "collections": list(self.collections) if self.collections is not None else None}


ANONYMOUS = Principal(id="anonymous", name="no API keys configured", role="admin")
ENV_KEY = Principal(id="env", name="DPR_API__API_KEY", role="admin")


@dataclass(frozen=True)
class Decision:
    """``status`` 0: go on as ``principal``; else the error to answer (401, 403, 429, 503) and its message."""

    status: int
    principal: Principal | None = None
    type: str = ""
    message: str = ""
    retry_after: float = 0.0


class AccessGate:
    def __init__(self, data_dir: Path, env_key: bytes | None = None, rate: float | None = None, burst: int = 1,
                 audit_fsync: bool = True, buckets: Buckets | None = None) -> None:
        self.store = KeyStore(keys_path(data_dir))
        self.audit_log = AuditLog(audit_path(data_dir), fsync=audit_fsync)
        self.env_key = env_key
        self.limiter = RateLimiter(rate, burst, buckets=buckets)

    @classmethod
    def from_settings(cls, settings: Settings) -> AccessGate:
        api = settings.api
        secret = api.api_key.get_secret_value().encode("utf-8") if api.api_key is not None else None
        return cls(settings.data_dir, env_key=secret, rate=api.rate_limit, burst=api.rate_burst,
                   buckets=shared_buckets(settings.data_dir, settings.broker_url))  # one rate across processes

    @property
    def locked(self) -> bool:
        """Whether requests need a key: ``DPR_API__API_KEY`` set, or a keys file present."""
        return self.env_key is not None or self.store.exists()

    def authenticate(self, token: bytes | None) -> Principal | None:
        """The principal for ``token`` (UTF-8 bytes), ANONYMOUS when nothing is locked, None when refused."""
        if not self.locked:
            return ANONYMOUS
        if token is None:
            return None
        if self.env_key is not None and hmac.compare_digest(token, self.env_key):
            return ENV_KEY
        key = self.store.authenticate(token)
        if key is None:
            return None
        return Principal(id=key.id, name=key.name, role=key.role, collections=key.collections, rate=key.rate)

    def decide(self, token: bytes | None, need: Role, collection: str | None, client: str,
               action: str = "this route") -> Decision:
        """May ``token`` call ``action`` (which needs ``need``) on ``collection`` (None: not collection-scoped)?"""
        principal = self.authenticate(token)
        if principal is None:
            wait = self.limiter.take(f"client:{client}", None)  # key guessing is throttled per client address
            if wait:
                return Decision(429, None, "rate_limited", f"too many requests without a valid key from {client}; "
                                f"retry after {wait:.1f} s", wait)
            text = "missing API key" if token is None else "wrong or revoked API key"
            return Decision(401, None, "unauthorized", f"{text}; {AUTH_HINT}")
        if principal is not ANONYMOUS:
            wait = self.limiter.take(f"key:{principal.id}", principal.rate)
            if wait:
                rate = principal.rate or self.limiter.rate or 0
                return Decision(429, principal, "rate_limited", f"key {principal.id} is over its rate limit of "
                                f"{rate:g} requests/s; retry after {wait:.1f} s", wait)
        if not allows(principal.role, need):
            return Decision(403, principal, "forbidden",
                            f"{action} needs role '{need}'; this key ({principal.id}) has role '{principal.role}'. "
                            f"Use a key with role '{need}' (an admin creates one: dpr keys create --role {need})")
        if collection is not None and principal.collections is not None and collection not in principal.collections:
            return Decision(403, principal, "forbidden",
                            f"this key ({principal.id}) may use collection(s) {', '.join(principal.collections)} "
                            f"only, not {collection!r}")
        return Decision(0, principal)
