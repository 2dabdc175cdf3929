"""The writes an HNSW build must not miss: while a build runs on a copy of a generation's shard, every write that
reaches the shard is also appended here, and the build replays them onto its copy before the swap
(``edge_index.py``), so a build finishes under writes that never pause instead of being dropped by the first one.

One file per generation, ``build.journal``, present only while a build runs:

- the builder creates it (empty) under the generation's lease, in the same hold as the copy, and keeps a shared
  ``flock`` on it until it is done; it removes the file when it swaps or drops the copy;
- a writer, under the lease and after the shard took the operation, appends one frame if the file exists. If it
  can take the file's lock exclusively, no builder is alive (killed mid-build): the file is stale and removed;
- a frame is ``magic, length, crc32`` and a pickle of ``(operation, argument)``: ``("upsert", points)`` with the
  dense vectors as float32 arrays, or ``("delete", where)``. The file lives in the data dir beside the shard, written
  by this product's processes only (the trust the shard itself has);
- a writer that cannot append (a full disk) removes the file: the builder then drops its copy, as it did before
  journals existed, and nothing is lost. So does a frame that does not check out.

A writer killed between the shard's write and its frame leaves a write the copy misses; its job was not
acknowledged and is redelivered (upserts and deletes are idempotent), and the builder's count check before the
swap drops the copy if the point counts still differ.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import pickle
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

JOURNAL = "build.journal"
_MAGIC = b"DPRJ"
_HEADER = struct.Struct("<4sII")  # magic, payload length, crc32 of the payload

Record = tuple[str, Any]  # ("upsert", points) or ("delete", where)


class JournalBroken(Exception):
    """The journal is gone or a frame does not check out: the build's copy cannot be brought up to date."""


@contextlib.contextmanager
def opened(generation_dir: Path) -> Iterator[Path]:
    """The builder's side, entered under the lease right after the copy: an empty journal that writers append to
    while the block runs (the shared lock tells them a builder is alive); removed when the block ends."""
    path = generation_dir / JOURNAL
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):  # ours, not a later build's
                os.unlink(path)
        os.close(fd)


def record(generation_dir: Path, operation: str, argument: Any) -> None:
    """A writer's side, under the lease after the shard took the operation: append it if a build is running."""
    path = generation_dir / JOURNAL
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:
        return  # no build: the common case, one failed open
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # a builder holds it: append
        else:
            log.info("removing a build journal its builder left", extra={"path": str(path)})
            _unlink(path)
            return
        payload = pickle.dumps((operation, _packed(operation, argument)), protocol=pickle.HIGHEST_PROTOCOL)
        frame = _HEADER.pack(_MAGIC, len(payload), zlib.crc32(payload)) + payload
        try:
            view = memoryview(frame)
            while view:
                view = view[os.write(fd, view):]
        except OSError as e:
            # the copy cannot learn this write: withdraw the journal, and the builder drops its copy
            log.warning("could not journal a write for the running index build (%s); the build will be dropped",
                        errno.errorcode.get(e.errno or 0, e), extra={"path": str(path)})
            _unlink(path)
    finally:
        os.close(fd)


def read(path: Path, offset: int) -> tuple[list[Record], int]:
    """The frames complete after ``offset`` and the offset after them (a frame still being written waits for the
    next read). Raises ``JournalBroken`` if the file is gone or a complete frame does not check out."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        raise JournalBroken(f"{path} was withdrawn (a writer could not append to it)") from None
    out: list[Record] = []
    at = 0
    while len(data) - at >= _HEADER.size:
        magic, length, crc = _HEADER.unpack_from(data, at)
        if magic != _MAGIC:
            raise JournalBroken(f"{path}: no frame at byte {offset + at}")
        end = at + _HEADER.size + length
        if end > len(data):
            break
        payload = data[at + _HEADER.size:end]
        if zlib.crc32(payload) != crc:
            raise JournalBroken(f"{path}: the frame at byte {offset + at} fails its checksum")
        operation, argument = pickle.loads(payload)  # noqa: S301 - written by this product beside the shard
        out.append((operation, _unpacked(operation, argument)))
        at = end
    return out, offset + at


def _packed(operation: str, argument: Any) -> Any:
    """Dense vectors as float32 arrays (a quarter of a pickled list of floats)."""
    if operation != "upsert":
        return argument
    return [(pid, {n: np.asarray(v, dtype=np.float32) if isinstance(v, (list, tuple, np.ndarray)) else v
                   for n, v in vectors.items()}, payload)
            for pid, vectors, payload in argument]


def _unpacked(operation: str, argument: Any) -> Any:
    if operation != "upsert":
        return argument
    return [(pid, {n: v.tolist() if isinstance(v, np.ndarray) else v for n, v in vectors.items()}, payload)
            for pid, vectors, payload in argument]


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
