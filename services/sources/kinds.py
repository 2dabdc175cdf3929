"""What every kind of source offers a sync: a listing of its items with a version each, and a way to bring one
item's bytes to a local file for the product's own readers.

- ``listing()``: every item (``Entry``: key = its path inside the source, version = what changes when its bytes
  do: an ETag, size+mtime, a page's sha256, a blob id). It lists to the end or raises: ``SourceUnreachable``
  (exit 3: the source could not be reached or stopped answering) or ``SourceError`` (it answered no: no such
  bucket, access denied, a listing over a limit).
  A listing is never returned in part: a sync judges "gone" only from a whole one.
- ``fetch(entry, dest)``: the item as a local file (a folder's own file; a download under ``dest``). One item's
  trouble raises ``ItemFailed`` (that item is reported, the others go on); the source's raises
  ``SourceUnreachable`` (the sync stops and deletes nothing).

``services.sources.sync.open_kind`` picks the implementation: ``FolderSource`` here, ``services.sources.s3``,
``services.sources.web`` and ``services.sources.git`` (imported only for their kind: boto3 loads only for s3).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from services.core.errors import PermanentError, TransientError

if TYPE_CHECKING:
    from services.sources.registry import SourceSpec


class SourceUnreachable(TransientError):
    """The source could not be reached, or stopped answering in the middle: nothing is judged, nothing deleted."""


class SourceError(PermanentError):
    """The source answered, but no: no such bucket or repository, access denied, a folder that is gone."""


class ItemFailed(Exception):
    """One item cannot be brought here (it vanished since the listing, it is too large): ``reason`` and the
    message naming the fix; the rest of the sync goes on."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Entry:
    key: str  # the item's path inside the source, '/'-separated: "guide/intro.md"
    version: str  # changes whenever its bytes do
    size: int = 0


class SourceKind(Protocol):
    def listing(self) -> Iterator[Entry]: ...

    def fetch(self, entry: Entry, dest: Path) -> Path: ...

    def close(self) -> None: ...


Fetched = tuple[Entry, "Path | ItemFailed | SourceError | SourceUnreachable"]


def fetch_ahead(kind: SourceKind, todo: list[Entry], dest: Path) -> Iterator[Fetched]:
    """Each entry of ``todo`` in order with its local file, or the error its fetch raised. A kind that declares
    ``fetch_workers`` > 1 (s3: its client is thread-safe) has that many fetches in flight ahead of the reader, so
    downloads overlap each other and the encoding of what came before; stopping early cancels those not begun."""
    workers = int(getattr(kind, "fetch_workers", 1))

    def one(entry: Entry) -> Path | ItemFailed | SourceError | SourceUnreachable:
        try:
            return kind.fetch(entry, dest)
        except (ItemFailed, SourceError, SourceUnreachable) as e:
            return e

    if workers <= 1:
        for entry in todo:
            yield entry, one(entry)
        return
    from collections import deque
    from concurrent.futures import Future, wait

    pool = _fetch_pool(workers)
    window: deque[tuple[Entry, Future[Path | ItemFailed | SourceError | SourceUnreachable]]] = deque()
    try:
        for entry in todo:
            window.append((entry, pool.submit(one, entry)))
            if len(window) >= 2 * workers:
                head, future = window.popleft()
                yield head, future.result()
        while window:
            head, future = window.popleft()
            yield head, future.result()
    finally:  # stopped early: those not begun are dropped, those running are waited for
        for _, future in window:
            future.cancel()
        wait([f for _, f in window])


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _fetch_pool(workers: int) -> ThreadPoolExecutor:
    """The process's fetch threads (kept across syncs: threads made anew at every sync of a long-lived `dpr serve`
    leave their memory arenas behind)."""
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dpr-source-fetch")
        return _POOLS[workers]


class FolderSource:
    """A folder on this machine: regular files under it (hidden entries and symbolic links left out, as the
    folder walk of ``dpr ingest`` leaves them), version = size and mtime in ns; read where they are."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self.root = Path(spec.uri)

    def listing(self) -> Iterator[Entry]:
        if not self.root.is_dir():
            raise SourceUnreachable(f"source {self.spec.name}: {self.root} is not there (unmounted or removed?); "
                                    "mount or restore it, or `dpr sources remove "
                                    f"{self.spec.name}`")
        stack = [("", self.root)]
        while stack:
            prefix, folder = stack.pop()
            try:
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as e:
                raise SourceError(f"source {self.spec.name}: cannot list {folder} ({e.strerror or e}); fix its "
                                  "permissions (nothing is removed while a folder cannot be listed)") from e
            subfolders = []
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                st = entry.stat(follow_symlinks=False)
                key = f"{prefix}{entry.name}"
                if stat.S_ISDIR(st.st_mode):
                    subfolders.append((f"{key}/", Path(entry.path)))
                elif stat.S_ISREG(st.st_mode):
                    yield Entry(key, f"{st.st_size}:{st.st_mtime_ns}", st.st_size)
            stack.extend(reversed(subfolders))

    def fetch(self, entry: Entry, dest: Path) -> Path:
        path = self.root / entry.key
        if not path.is_file():
            raise ItemFailed("gone", f"{path}: removed since it was listed; the next sync removes its documents")
        return path

    def close(self) -> None:
        pass
