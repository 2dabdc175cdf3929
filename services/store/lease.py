"""``ShardLease``: one process's exclusive, shared-by-threads ownership of an embedded collection directory.

qdrant-edge lets one process open a shard directory (a second ``load`` fails on the WAL lock). So every call
of the edge engine goes through a lease: an exclusive ``fcntl.flock`` on ``A/.lock`` (waiting up to
``edge.lock_timeout`` seconds, then ``StoreUnavailable``), shards loaded lazily while it is held, and kept open
for ``edge.idle_release`` seconds after the last call so that a busy process does not reopen per call (for
``_WAITER_GRACE`` only when another process is waiting). A timer thread then flushes, closes and unlocks, and the
next process gets its turn. A process that keeps the lease
busy for longer than its fair share yields at the end of the current call when another process is waiting
(waiters touch ``A/.lock.wait``). In one process every engine of a directory shares one lease (``lease_for``),
and a re-entrant mutex serialises threads. Around ``os.fork()`` the parent hands everything back and the child
drops what it inherited; at exit every lease is released.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

from qdrant_edge import EdgeShard

from services.core.errors import StoreUnavailable
from services.core.fsutil import flock_until

log = logging.getLogger(__name__)

_POLL_MIN, _POLL_MAX = 0.005, 0.02  # seconds between flock attempts while waiting
_MIN_FAIR_SHARE = 0.25  # seconds a busy holder keeps the lease before yielding to a waiter
_HANDOFF_WINDOW = 2.0  # seconds a holder that yielded waits for the waiter to take the lock
# An idle holder hands the lease to a waiting process after this many seconds without a call, instead of the
# whole ``idle_release``: consecutive calls of one piece of work (ensure the collection, read its document states)
# come closer together than this, while the gap a worker spends encoding its next batch is far longer, and holding
# the lease through it stalled the other process's store calls (and its cores) for up to ``idle_release`` per batch.
# Two workers hand the lease over twice per batch each, so every millisecond here is paid ~4 times per batch.
_WAITER_GRACE = 0.01
_WAITER_POLL = 0.02  # seconds between an idle holder's later looks for a waiter


class ShardLease:
    """This process's exclusive ownership of one collection directory. Thread-safe; one per directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock_path = root / ".lock"
        self.wait_path = root / ".lock.wait"
        self._mutex = threading.RLock()
        self._fd: int | None = None
        self._shards: dict[str, EdgeShard] = {}
        self._dirty: set[str] = set()
        self._depth = 0
        self._acquired_at = 0.0  # monotonic
        self._acquired_wall = 0.0  # wall clock, comparable with the wait file's mtime
        self._timer: threading.Timer | None = None  # one idle timer at a time, re-armed lazily
        self._last_used = 0.0
        self._idle_release = 0.0
        self._yield_until = 0.0

    # -- public -------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def held(self, lock_timeout: float, idle_release: float) -> Iterator[ShardLease]:
        with self._mutex:
            if self._fd is None:
                self._acquire(lock_timeout)
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._after_use(idle_release)

    def shard(self, generation: str, path: Path) -> EdgeShard:
        """The open shard of ``generation`` (loading it if needed). Only while ``held``."""
        shard = self._shards.get(generation)
        if shard is None:
            started = time.monotonic()
            try:
                shard = EdgeShard.load(str(path))
            except Exception as e:  # the engine raises plain Exception
                raise StoreUnavailable(
                    f"cannot open the embedded shard {path}: {e}; another program may hold it outside the "
                    f"{self.lock_path} lock"
                ) from e
            log.debug("loaded shard", extra={"generation": generation, "ms": (time.monotonic() - started) * 1e3})
            self._shards[generation] = shard
        return shard

    def opened(self, generation: str) -> EdgeShard | None:
        """The shard of ``generation`` if this process has it open (never loads it)."""
        return self._shards.get(generation)

    def adopt(self, generation: str, shard: EdgeShard) -> None:
        self._shards[generation] = shard

    def mark_dirty(self, generation: str) -> None:
        self._dirty.add(generation)

    def forget(self, generation: str) -> None:
        """Flush and close one generation's shard (before deleting its directory)."""
        shard = self._shards.pop(generation, None)
        if shard is not None:
            self._close_shard(generation, shard)

    def release(self) -> None:
        """Flush, close every shard and unlock, now."""
        with self._mutex:
            self._cancel_timer()
            self._release_locked()

    def release_before_fork(self) -> None:
        """In the parent, just before ``os.fork()``: hand everything back so the child inherits nothing.

        Skipped when a call is in flight (the child then closes what it inherited, see ``reset_after_fork``).
        """
        if not self._mutex.acquire(timeout=5):
            return
        try:
            if self._depth == 0:
                self._release_locked()
        finally:
            self._mutex.release()

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's lock and shards are not ours.

        The shard objects are never used or dropped here; their inherited descriptors (the WAL lock among
        them) and ours are closed, otherwise the child would keep the parent's locks alive and neither could
        reopen the shard. Closing a duplicate does not release the parent's own locks.
        """
        self._mutex = threading.RLock()
        _ORPHANED.extend(self._shards.values())
        self._fd, self._shards, self._dirty, self._depth, self._timer = None, {}, set(), 0, None
        _close_inherited_descriptors(self.root)

    # -- internals ----------------------------------------------------------------------------------------
    def _acquire(self, lock_timeout: float) -> None:
        # We just yielded to a waiter: let it take its turn first. It records its pid in the lock file when it
        # gets the lock; until then (or until the hand-off window closes, if it gave up) we stay out of its way.
        # A fixed pause was not enough on a loaded machine: the waiter was not scheduled in time and the busy
        # holder took the lock straight back, again and again.
        mine = f"pid {os.getpid()} "
        while time.monotonic() < self._yield_until and self._holder().startswith(mine):
            time.sleep(_POLL_MIN)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + lock_timeout
        try:
            if not flock_until(fd, fcntl.LOCK_EX, deadline, on_wait=self._signal_waiting, poll=_POLL_MIN,
                               max_poll=_POLL_MAX):
                raise StoreUnavailable(
                    f"the embedded store {self.root} is busy: another process ({self._holder()}) has held "
                    f"{self.lock_path} for more than {lock_timeout:g} s; retry later, raise "
                    "DPR_EDGE__LOCK_TIMEOUT, or run a Qdrant server (DPR_QDRANT_URL) for concurrent access"
                )
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} host {socket.gethostname()} since {time.time():.3f}\n".encode(), 0)
        self._fd = fd
        self._acquired_at = time.monotonic()
        self._acquired_wall = time.time()
        log.debug("edge lock acquired", extra={"lock": str(self.lock_path)})

    def _holder(self) -> str:
        try:
            text = self.lock_path.read_text().strip()
        except OSError:
            text = ""
        return text or "holder unknown"

    def _signal_waiting(self) -> None:
        with contextlib.suppress(OSError):
            self.wait_path.touch()

    def _someone_waiting(self) -> bool:
        try:
            return self.wait_path.stat().st_mtime >= self._acquired_wall
        except OSError:
            return False

    def _after_use(self, idle_release: float) -> None:
        self._last_used = time.monotonic()
        self._idle_release = idle_release
        if idle_release <= 0:
            self._release_locked()
        elif self._last_used - self._acquired_at > max(idle_release, _MIN_FAIR_SHARE) and self._someone_waiting():
            log.debug("yielding the edge lock to a waiting process", extra={"lock": str(self.lock_path)})
            self._release_locked()
            self._yield_until = time.monotonic() + _HANDOFF_WINDOW
        elif self._timer is None:
            self._start_timer(min(idle_release, _WAITER_GRACE))

    def _start_timer(self, delay: float) -> None:
        timer = threading.Timer(delay, self._idle_expired)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _idle_expired(self) -> None:
        """Release once the lease has been idle for ``idle_release``, or for ``_WAITER_GRACE`` while another
        process waits for it; until then the timer checks again (every ``_WAITER_POLL``)."""
        with self._mutex:
            if self._timer is not threading.current_thread():
                return
            self._timer = None
            if self._fd is None or self._depth > 0:
                return  # released already, or in use: the end of that use re-arms the timer
            now = time.monotonic()
            release_at = self._last_used + self._idle_release
            waiter_at = self._last_used + _WAITER_GRACE
            if now >= release_at:
                self._release_locked()
            elif now >= waiter_at and self._someone_waiting():
                log.debug("handing the idle edge lock to a waiting process", extra={"lock": str(self.lock_path)})
                self._release_locked()
                self._yield_until = now + _HANDOFF_WINDOW
            else:
                self._start_timer(min(release_at, max(waiter_at, now + _WAITER_POLL)) - now)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _close_shard(self, generation: str, shard: EdgeShard) -> None:
        try:
            if generation in self._dirty:
                shard.flush()
        finally:
            self._dirty.discard(generation)
            shard.close()

    def _release_locked(self) -> None:
        self._cancel_timer()
        shards, self._shards = self._shards, {}
        try:
            for generation, shard in shards.items():
                try:
                    self._close_shard(generation, shard)
                except Exception:
                    log.exception("closing an edge shard failed", extra={"generation": generation})
        finally:
            self._dirty.clear()
            if self._fd is not None:
                fd, self._fd = self._fd, None
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                log.debug("edge lock released", extra={"lock": str(self.lock_path)})


_LEASES: dict[Path, ShardLease] = {}
_LEASES_GUARD = threading.Lock()
_LIVE: weakref.WeakSet[ShardLease] = weakref.WeakSet()
_ORPHANED: list[EdgeShard] = []


def lease_for(root: Path) -> ShardLease:
    key = root.resolve()
    with _LEASES_GUARD:
        lease = _LEASES.get(key)
        if lease is None:
            lease = _LEASES[key] = ShardLease(root)
            _LIVE.add(lease)
        return lease


def _release_all() -> None:
    for lease in list(_LIVE):
        try:
            lease.release()
        except Exception:
            log.exception("releasing the edge lock at exit failed", extra={"lock": str(lease.lock_path)})


def _close_inherited_descriptors(root: Path) -> None:
    """Close every descriptor of this process that points inside ``root`` (Linux: /proc/self/fd)."""
    prefix = str(root.resolve()) + os.sep
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(prefix):
            with contextlib.suppress(OSError):
                os.close(int(name))


def _before_fork() -> None:
    for lease in list(_LIVE):
        lease.release_before_fork()


def _after_fork_in_child() -> None:
    global _LEASES_GUARD
    _LEASES_GUARD = threading.Lock()
    for lease in list(_LIVE):
        lease.reset_after_fork()


atexit.register(_release_all)
os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
