"""The audit log: one JSON line per write or admin action, appended to ``DATA_DIR/audit.log``.

Each line: ``ts`` (UTC), ``who`` (the key's id and name, never the secret; ``null`` when no valid key was sent),
``role`` (the key's), ``action`` (method and route template), ``collection``, ``target`` (the path parameters:
which document, job, model...), ``status`` (the HTTP status: 2xx done, 401/403 refused, 429 throttled, ...) and
``client`` (the peer address). The file is opened ``O_APPEND`` and each line goes down in one ``write`` followed by
``fsync``, so concurrent processes never interleave a line and a crash loses at most the line being written.
Nothing in the product rewrites or truncates it; rotate it with logrotate's ``copytruncate`` if it grows.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

AUDIT_FILE = "audit.log"


def audit_path(data_dir: Path) -> Path:
    return Path(data_dir) / AUDIT_FILE


class AuditLog:
    def __init__(self, path: Path, fsync: bool = True) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._lock = threading.Lock()

    def append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Write ``entry`` (with ``ts`` added first) as one line; returns what was written."""
        line = {"ts": datetime.now(UTC).isoformat(timespec="milliseconds")} | entry
        data = (json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode("utf-8")
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        return line

    def tail(self, n: int | None = None) -> list[dict[str, Any]]:
        """The last ``n`` entries (all when None), oldest first; a line that is not JSON (a torn last line after a
        crash) comes back as ``{"unreadable": text}``."""
        if not self.path.is_file():
            return []
        lines: deque[str] = deque(maxlen=n) if n is not None else deque()
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for raw in f:
                if raw.strip():
                    lines.append(raw)
        out = []
        for raw in lines:
            try:
                out.append(dict(json.loads(raw)))
            except ValueError:
                out.append({"unreadable": raw.rstrip("\n")})
        return out
