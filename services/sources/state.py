"""What a source's syncs remember, beside its spec under ``DATA_DIR/sources/NAME/``:

- ``state.json``: per item key, the version last ingested from it (ETag, size+mtime, blob id) and the document
  ids it gave; written only once a sync's job has ended, for the items whose documents all arrived. The store
  stays the truth for *what* is stored (``source`` payload = NAME): a version recorded for a document the store
  no longer holds is read again.
- ``last.json``: the last sync's record (when, outcome, counts, error), for ``dpr sources list`` and status.
- ``sync.lock``: held (``flock``) while a sync runs, so two syncs of one source never run at once: the second
  is refused at once, naming the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.core.errors import TransientError
from services.core.fsutil import flock_until, holder_tag, json_or_empty, write_atomic


class SyncRunning(TransientError):
    """Another sync of the same source holds its lock."""


@dataclass
class Recorded:
    """One item as last ingested: its version and the documents it gave."""

    version: str
    ids: list[str] = field(default_factory=list)


@dataclass
class SourceState:
    items: dict[str, Recorded] = field(default_factory=dict)
    mark: str = ""  # git: the commit last synced

    @classmethod
    def load(cls, folder: Path) -> SourceState:
        path = folder / "state.json"
        if not path.is_file():
            return cls()
        data = json.loads(path.read_text(encoding="utf-8"))
        items = {k: Recorded(str(v["version"]), list(v.get("ids") or [])) for k, v in data.get("items", {}).items()}
        return cls(items=items, mark=str(data.get("mark") or ""))

    def save(self, folder: Path) -> None:
        data = {"mark": self.mark, "items": {k: {"version": r.version, "ids": r.ids} for k, r in self.items.items()}}
        write_atomic(folder / "state.json", json.dumps(data, separators=(",", ":")))


def load_last(folder: Path) -> dict[str, Any]:
    return json_or_empty(folder / "last.json")


def save_last(folder: Path, record: dict[str, Any]) -> None:
    write_atomic(folder / "last.json", json.dumps(record, default=str))


@contextlib.contextmanager
def sync_lock(folder: Path, name: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the source's sync lock for the block; when a sync holds it, wait up to ``wait_s`` seconds for it to
    end, then refuse (``SyncRunning``, naming the holder)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "sync.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not flock_until(fd, fcntl.LOCK_EX, time.monotonic() + wait_s, max_poll=1.0):
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            waited = f" for {wait_s:.0f} s" if wait_s else ""
            raise SyncRunning(f"source {name}: a sync is already running ({holder}), waited{waited or ' not at all'};"
                              " wait for it to end (`dpr sources sync NAME --wait` waits), then sync again")
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_tag().encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def is_running(folder: Path) -> bool:
    """Whether a sync of the source holds its lock now."""
    try:
        fd = os.open(folder / "sync.lock", os.O_RDWR)
    except OSError:
        return False
    try:
        return not flock_until(fd, fcntl.LOCK_SH, time.monotonic())  # one try; the close lets go of it
    finally:
        os.close(fd)
