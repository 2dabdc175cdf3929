"""Documents whose parser crashed its process, remembered by the sha256 of their bytes, beyond one process
(docs/documents.md, "The crash quarantine").

The same bytes are then refused at once, without another crash, by this process and, when the quarantine has a
directory (``DPR_DOCUMENTS__QUARANTINE_DIR``, default ``DATA_DIR/quarantine``), by every process using it: one
small JSON file per crash, ``<sha256>.json``, written atomically. Lifted by any change to the bytes, or by
deleting the record (the refusal names it).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from services.core.fsutil import write_atomic
from services.core.settings import DocumentSettings, Settings

_MEMORY: dict[str, dict[str, str]] = {}  # records kept in this process: no directory, or it cannot be written
_LOCK = threading.Lock()


def limits_for(settings: Settings) -> DocumentSettings:
    """``settings.documents`` with the quarantine directory filled in (``DATA_DIR/quarantine`` unless set)."""
    docs = settings.documents
    if docs.quarantine_dir is not None:
        return docs
    return docs.model_copy(update={"quarantine_dir": (settings.data_dir / "quarantine").absolute()})


@dataclass
class Quarantine:
    """The records of one quarantine directory (None: this process only)."""

    directory: Path | None = None

    def record_path(self, digest: str) -> Path | None:
        return self.directory / f"{digest}.json" if self.directory is not None else None

    def get(self, digest: str) -> dict[str, str] | None:
        """The record of a crash on these bytes, or None. With a directory, its file decides (read each time, so
        a record deleted by hand lifts the quarantine in running workers too)."""
        if not digest:
            return None
        path = self.record_path(digest)
        if path is not None:
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                record = None
            except (OSError, ValueError):  # unreadable or half-written by hand: still a crash on these bytes
                record = {"what": "crashed the parser (its quarantine record is unreadable)"}
            if isinstance(record, dict):
                return {str(k): str(v) for k, v in record.items()}
        with _LOCK:  # no directory, or its record could not be written
            return _MEMORY.get(digest)

    def add(self, digest: str, what: str, name: str) -> None:
        """Remember that these bytes crashed the parser (``what``: how); never raises (a data dir that cannot be
        written keeps the record in this process only)."""
        if not digest:
            return
        record = {"sha256": digest, "what": what, "name": name, "pid": str(os.getpid()),
                  "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        path = self.record_path(digest)
        if path is not None:
            with contextlib.suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, json.dumps(record))
                return
        with _LOCK:
            _MEMORY[digest] = record

    def forget(self, digest: str) -> None:
        """Drop the record (this process's and the file)."""
        with _LOCK:
            _MEMORY.pop(digest, None)
        path = self.record_path(digest)
        if path is not None:
            path.unlink(missing_ok=True)

    def refusal(self, digest: str, record: dict[str, str]) -> str:
        """The failure's message for a document refused by its record."""
        where = self.record_path(digest)
        when = f" at {record['at']}" if record.get("at") else ""
        first = f" (as {record['name']})" if record.get("name") else ""
        retry = (f"; to try these same bytes again (e.g. after upgrading the parser), delete {where}" if where
                 else "")
        return (f"is quarantined: the same bytes (sha256 {digest[:16]}...) {record.get('what', 'crashed the parser')}"
                f"{when}{first} and are not parsed again; repair or re-create the file (any change to its bytes "
                f"lifts this){retry}")


def forget_all_in_process() -> None:
    """Tests: drop this process's records (a fresh process has none)."""
    with _LOCK:
        _MEMORY.clear()
