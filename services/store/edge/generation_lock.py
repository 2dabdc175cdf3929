"""``GenerationLock``: a lock file of one generation of an embedded collection, as one process holds it.

Two per generation, each ``flock``-ed exclusively and recording its holder (``pid host since``): ``A/locks/G.lock``
(the generation's files: writing the shard, loading it, copying or swapping it) and ``A/locks/G.open`` (having its
shard open: qdrant-edge lets one process load a shard directory). ``A/locks/G.lock.wait`` (``G.open.wait``) is
touched by every process waiting for one, so the holder can tell that someone wants it (``wanted``). Which
generations a process holds and when it hands them on is ``ShardLease``'s business (``services/store/edge/lease.py``);
this module is only the files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from services.core.errors import StoreUnavailable
from services.core.fsutil import flock_until, holder_tag

_POLL_MIN, _POLL_MAX = 0.005, 0.02  # seconds between flock attempts while waiting


KINDS = ("lock", "open")


def lock_file(root: Path, generation: str, kind: str = "lock") -> Path:
    return root / "locks" / f"{generation}.{kind}"


def wait_file(root: Path, generation: str, kind: str = "lock") -> Path:
    return root / "locks" / f"{generation}.{kind}.wait"


def holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    return text or "holder unknown"


def busy(root: Path, path: Path, timeout: float) -> StoreUnavailable:
    return StoreUnavailable(
        f"the embedded store {root} is busy: another process ({holder(path)}) has held {path} for more than "
        f"{timeout:g} s; retry later, raise DPR_EDGE__LOCK_TIMEOUT, or run a Qdrant server (DPR_QDRANT_URL) for "
        "concurrent access"
    )


class GenerationLock:
    """Generation ``generation`` of the collection at ``root``, locked by this process (``take``)."""

    __slots__ = ("acquired_at", "acquired_wall", "fd", "generation", "kind", "root", "touched")

    def __init__(self, root: Path, generation: str, fd: int, kind: str = "lock") -> None:
        self.root, self.generation, self.fd, self.kind = root, generation, fd, kind
        self.touched = True  # used by the current run of calls (False: kept from an earlier one, idle)
        self.acquired_at = time.monotonic()
        self.acquired_wall = time.time()  # comparable with the wait file's mtime

    @classmethod
    def take(cls, root: Path, generation: str, timeout: float, yield_until: float = 0.0,
             on_wait: Callable[[], None] | None = None, kind: str = "lock") -> GenerationLock:
        """Wait up to ``timeout`` seconds for the lock (then ``StoreUnavailable`` naming the holder), touching
        the wait file meanwhile and calling ``on_wait`` before each pause."""
        path, waiting = lock_file(root, generation, kind), wait_file(root, generation, kind)
        # This process just handed the generation to a waiter: let it take its turn first. It records its pid in
        # the lock file when it gets the lock; until then (or until ``yield_until``, if it gave up) stay out of its
        # way. A fixed pause was not enough on a loaded machine: the waiter was not scheduled in time and the busy
        # holder took the lock straight back, again and again.
        mine = f"pid {os.getpid()} "
        while time.monotonic() < yield_until and holder(path).startswith(mine):
            time.sleep(_POLL_MIN)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

        def signal() -> None:
            with contextlib.suppress(OSError):
                waiting.touch()
            if on_wait is not None:
                on_wait()

        try:
            if not flock_until(fd, fcntl.LOCK_EX, time.monotonic() + timeout, on_wait=signal, poll=_POLL_MIN,
                               max_poll=_POLL_MAX):
                raise busy(root, path, timeout)
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder_tag() + "\n").encode(), 0)
        return cls(root, generation, fd, kind)

    def wanted(self) -> bool:
        """Another process has waited for this generation since this process took it."""
        try:
            return wait_file(self.root, self.generation, self.kind).stat().st_mtime >= self.acquired_wall
        except OSError:
            return False

    def release(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)

    def remove_files(self) -> None:
        """The generation is gone: its lock and wait files go too (a waiter then finds no generation)."""
        for path in [f(self.root, self.generation, kind) for kind in KINDS for f in (lock_file, wait_file)]:
            with contextlib.suppress(OSError):
                path.unlink()
