"""Who may do what: API keys with a role (read < write < admin) and optionally a set of collections, stored hashed
in ``DATA_DIR/keys.json`` (``keys``); the role order (``roles``); the append-only audit log of write and admin
actions (``audit``); per-key token buckets (``ratelimit``); and ``gate``, the one object the HTTP API asks
"who is this and may they". Pure service code: no web framework here; the API and the CLI only expose it."""

from services.access.audit import AuditLog, audit_path
from services.access.gate import AccessGate, Principal
from services.access.keys import KeyStore, KeyStoreError, keys_path
from services.access.ratelimit import RateLimiter
from services.access.roles import ROLES, Role, allows

__all__ = [
    "ROLES",
    "AccessGate",
    "AuditLog",
    "KeyStore",
    "KeyStoreError",
    "Principal",
    "RateLimiter",
    "Role",
    "allows",
    "audit_path",
    "keys_path",
]
