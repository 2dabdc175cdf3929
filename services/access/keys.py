"""API keys stored hashed in ``DATA_DIR/keys.json``: created and revoked by ``dpr keys`` while the server runs.

A token is ``dpr_<id>_<secret>`` (the id says which key, the secret is 256 random bits); the file keeps only
``sha256(token)``, compared with ``hmac.compare_digest``. A high-entropy random token needs no slow hash: there is
nothing to guess from the digest. The file is replaced atomically under an ``flock`` (two ``dpr keys create`` at
once both land), and readers reload it when its stat changes, so a new or revoked key takes effect on the next
request without a restart. A revoked key stays listed (with when) and is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from services.access.roles import ROLES, Role, parse_role
from services.core.errors import ConfigError
from services.core.fsutil import now_iso, write_atomic

KEYS_FILE = "keys.json"
FORMAT = 1
_TOKEN = re.compile(r"dpr_([0-9a-f]{12})_[A-Za-z0-9_-]{20,}")
_COLLECTION = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class KeyStoreError(ConfigError):
    """The keys file cannot be read or the request to change it is wrong; the message names the file or key."""


def keys_path(data_dir: Path) -> Path:
    return Path(data_dir) / KEYS_FILE


def digest(token: str | bytes) -> str:
    raw = token.encode("utf-8") if isinstance(token, str) else token
    return "sha256:" + hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True)
class ApiKey:
    """One key as stored: never the token, only its digest."""

    id: str
    role: Role
    hash: str
    name: str = ""
    collections: tuple[str, ...] | None = None  # None: every collection
    rate: float | None = None  # requests per second; None: the server's DPR_API__RATE_LIMIT
    created: str = field(default_factory=now_iso)
    revoked: str | None = None

    @property
    def active(self) -> bool:
        return self.revoked is None

    def to_json(self, with_hash: bool = False) -> dict[str, Any]:
        out = asdict(self)
        out["collections"] = list(self.collections) if self.collections is not None else None
        if not with_hash:
            out.pop("hash")
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ApiKey:
        collections = data.get("collections")
        return cls(
            id=str(data["id"]), role=parse_role(str(data["role"])), hash=str(data["hash"]),
            name=str(data.get("name") or ""),
            collections=tuple(str(c) for c in collections) if collections is not None else None,
            rate=float(data["rate"]) if data.get("rate") is not None else None,
            created=str(data.get("created") or ""), revoked=data.get("revoked"),
        )


class KeyStore:
    """The keys file of one data dir. Thread-safe; every process reads the same file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._keys: dict[str, ApiKey] = {}

    # --- reading -------------------------------------------------------------------------------------------------

    def exists(self) -> bool:
        """Whether a keys file exists: from then on the API asks every request for a key (even with every key
        revoked: revoking the last key must not open the server)."""
        return self.path.is_file()

    def keys(self) -> list[ApiKey]:
        """Every key, revoked ones included, oldest first."""
        return list(self._current().values())

    def authenticate(self, token: str | bytes) -> ApiKey | None:
        """The active key whose digest is ``sha256(token)``, else None."""
        text = token.decode("utf-8", "replace") if isinstance(token, bytes) else token
        given = digest(token)
        keys = self._current()
        match = _TOKEN.fullmatch(text)
        candidates = [keys[match.group(1)]] if match and match.group(1) in keys else []
        return next((key for key in candidates if hmac.compare_digest(key.hash, given) and key.active), None)

    def _current(self) -> dict[str, ApiKey]:
        """The parsed file, re-read only when its (inode, mtime, size) changed: one stat per request."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            with self._lock:
                self._stamp, self._keys = None, {}
            return {}
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp != self._stamp:
                self._keys = self._read()
                self._stamp = stamp
            return self._keys

    def _read(self) -> dict[str, ApiKey]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            keys = [ApiKey.from_json(k) for k in data["keys"]]
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise KeyStoreError(
                f"cannot read the keys file {self.path} ({type(e).__name__}: {e}); restore it from a backup, or "
                "move it away and create keys again with `dpr keys create`"
            ) from None
        return {k.id: k for k in keys}

    # --- changing ------------------------------------------------------------------------------------------------

    def create(self, role: str, collections: list[str] | None = None, name: str = "",
               rate: float | None = None) -> tuple[ApiKey, str]:
        """A new key and its token. The token is returned once and stored nowhere."""
        try:
            checked_role = parse_role(role)
        except ValueError as e:
            raise KeyStoreError(str(e)) from None
        for c in collections or []:
            if not _COLLECTION.fullmatch(c):
                raise KeyStoreError(f"collection name {c!r} is not valid; use letters, digits, '_', '-', '.'")
        if rate is not None and not rate > 0:
            raise KeyStoreError(f"rate {rate} must be above 0 requests per second")
        if len(name) > 200:
            raise KeyStoreError("a key name is at most 200 characters")
        with self._locked() as keys:
            key_id = secrets.token_hex(6)
            while key_id in keys:  # pragma: no cover - 48 random bits
                key_id = secrets.token_hex(6)
            token = f"dpr_{key_id}_{secrets.token_urlsafe(32)}"
            key = ApiKey(id=key_id, role=checked_role, hash=digest(token), name=name,
                         collections=tuple(dict.fromkeys(collections)) if collections else None, rate=rate)
            keys[key_id] = key
        return key, token

    def revoke(self, key_id: str) -> ApiKey:
        """Mark a key revoked (it stays listed); refused from the next request on."""
        with self._locked() as keys:
            key = keys.get(key_id)
            if key is None:
                known = ", ".join(keys) or "none"
                raise KeyStoreError(f"no key {key_id!r} in {self.path}; `dpr keys list` shows the ids (known: {known})")
            if key.active:
                key = keys[key_id] = replace(key, revoked=now_iso())
        return key

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, ApiKey]]:
        """Read-modify-write under an exclusive flock on ``keys.json.lock``; the file is replaced atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            keys = self._read()
            yield keys
            text = json.dumps({"format": FORMAT, "roles": list(ROLES),
                               "keys": [k.to_json(with_hash=True) for k in keys.values()]}, indent=2)
            write_atomic(self.path, text + "\n")
            os.chmod(self.path, 0o600)
        finally:
            os.close(fd)
