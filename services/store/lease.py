"""``ShardLease``: one process's exclusive, shared-by-threads ownership of the generations of an embedded collection.

qdrant-edge lets one process open a shard directory (a second ``load`` fails on the WAL lock). So every call
of the edge engine goes through a lease, and the lease is per **generation**: an exclusive ``fcntl.flock`` on
``A/locks/G.lock``, taken the first time a call touches generation ``G`` (waiting up to
``edge.lock_timeout`` seconds, then ``StoreUnavailable``), its shard loaded lazily while it is held, and kept
open for ``edge.idle_release`` seconds after the last call so that a busy process does not reopen per call (for
``_WAITER_GRACE`` only when another process is waiting for it). A timer thread then flushes, closes and unlocks,
and the next process gets its turn. So ``dpr serve`` reading the active generation and workers writing the next
one (a re-embed) never wait for each other, and neither reloads its shard because the other had a turn.

A process that keeps a generation busy for longer than its fair share yields it at the end of the current call
when another process is waiting (waiters touch ``G.lock.wait``). Making, dropping and restoring generations
(and choosing the first one) hold the directory's lock ``A/.lock`` for their block (``structure``), then each
generation they touch. Locks are taken in the order calls touch generations; two processes crossing orders
(each inside one session) are settled by ``lock_timeout`` (a ``StoreUnavailable``, which callers retry).

In one process every engine of a directory shares one lease (``lease_for``), and a re-entrant mutex serialises
threads. Around ``os.fork()`` the parent hands everything back and the child drops what it inherited; at exit
every lease is released.
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
from collections.abc import Callable, Iterator
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


class _Held:
    """One generation's lock as this process holds it."""

    __slots__ = ("acquired_at", "acquired_wall", "fd", "touched")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.touched = True  # used by the current run of calls (False: kept from an earlier one, idle)
        self.acquired_at = time.monotonic()
        self.acquired_wall = time.time()  # comparable with the wait file's mtime


class ShardLease:
    """This process's exclusive ownership of the generations of one collection directory it touches.
    Thread-safe; one per directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock_path = root / ".lock"  # the directory's: making, dropping and restoring generations
        self._mutex = threading.RLock()
        self._owner: int | None = None  # the thread inside ``held``
        self._held: dict[str, _Held] = {}  # generation -> its lock, taken by ``claim``
        self._shards: dict[str, EdgeShard] = {}
        self._dirty: set[str] = set()
        self._depth = 0
        self._lock_timeout = 120.0  # the current run's (``held`` sets it); the settings' default until then
        self._structure_fd: int | None = None
        self._structure_depth = 0
        self._timer: threading.Timer | None = None  # one idle timer at a time, re-armed lazily
        self._last_used = 0.0
        self._idle_release = 0.0
        self._yield_until: dict[str, float] = {}

    # -- public -------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def held(self, lock_timeout: float, idle_release: float) -> Iterator[ShardLease]:
        """A run of calls: this thread alone uses the lease, and every generation it claims stays locked until
        the run ends (then ``idle_release`` decides)."""
        with self._mutex:
            outer = self._depth == 0
            if outer:
                self._cancel_timer()
                self._lock_timeout = lock_timeout
                self._owner = threading.get_ident()
                for h in self._held.values():
                    h.touched = False
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None
                    self._after_use(idle_release)

    def in_use_here(self) -> bool:
        """This thread is inside ``held``."""
        return self._owner == threading.get_ident()

    @contextlib.contextmanager
    def structure(self) -> Iterator[None]:
        """The directory's lock for the block (making, dropping or restoring generations); only inside ``held``."""
        with self._mutex:
            if self._structure_fd is None:
                self._structure_fd = self._acquire(self.lock_path, "")
            self._structure_depth += 1
            try:
                yield
            finally:
                self._structure_depth -= 1
                if self._structure_depth == 0:
                    fd, self._structure_fd = self._structure_fd, None
                    _unlock(fd)

    def claim(self, generation: str) -> None:
        """Lock ``generation`` for this process if it has not yet (no shard is loaded). Only inside ``held``."""
        held = self._held.get(generation)
        if held is not None:
            held.touched = True
        else:
            self._held[generation] = _Held(self._acquire(self._lock_file(generation), generation))
            log.debug("edge lock acquired", extra={"lock": str(self._lock_file(generation))})

    def shard(self, generation: str, path: Path, prepare: Callable[[], None] | None = None) -> EdgeShard:
        """The open shard of ``generation`` (claiming it and loading it if needed; ``prepare`` runs first, under
        the claim). Only inside ``held``."""
        shard = self._shards.get(generation)
        if shard is not None:
            self._held[generation].touched = True
        else:
            self.claim(generation)
            if prepare is not None:
                prepare()
            started = time.monotonic()
            try:
                shard = EdgeShard.load(str(path))
            except Exception as e:  # the engine raises plain Exception
                raise StoreUnavailable(
                    f"cannot open the embedded shard {path}: {e}; another program may hold it outside the "
                    f"{self._lock_file(generation)} lock"
                ) from e
            log.debug("loaded shard", extra={"generation": generation, "ms": (time.monotonic() - started) * 1e3})
            self._shards[generation] = shard
        return shard

    def opened(self, generation: str) -> EdgeShard | None:
        """The shard of ``generation`` if this process has it open (never loads it)."""
        return self._shards.get(generation)

    def adopt(self, generation: str, shard: EdgeShard) -> None:
        self.claim(generation)
        self._shards[generation] = shard

    def mark_dirty(self, generation: str) -> None:
        self._dirty.add(generation)

    def forget(self, generation: str) -> None:
        """Flush and close one generation's shard (before replacing or deleting its directory); the claim stays."""
        shard = self._shards.pop(generation, None)
        if shard is not None:
            self._close_shard(generation, shard)

    def dropped(self, generation: str) -> None:
        """``generation``'s directory is gone: close its shard, unlock and remove its lock files."""
        self.forget(generation)
        for path in (self._lock_file(generation), self._wait_file(generation)):
            with contextlib.suppress(OSError):
                path.unlink()
        self._unclaim(generation)

    def release(self) -> None:
        """Flush, close every shard and unlock, now."""
        with self._mutex:
            self._cancel_timer()
            self._release_locked(list(self._held))

    def release_before_fork(self) -> None:
        """In the parent, just before ``os.fork()``: hand everything back so the child inherits nothing.

        Skipped when a call is in flight (the child then closes what it inherited, see ``reset_after_fork``).
        """
        if not self._mutex.acquire(timeout=5):
            return
        try:
            if self._depth == 0:
                self._release_locked(list(self._held))
        finally:
            self._mutex.release()

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's locks and shards are not ours.

        The shard objects are never used or dropped here; their inherited descriptors (the WAL lock among
        them) and ours are closed, otherwise the child would keep the parent's locks alive and neither could
        reopen the shard. Closing a duplicate does not release the parent's own locks.
        """
        self._mutex = threading.RLock()
        _ORPHANED.extend(self._shards.values())
        self._held, self._shards, self._dirty, self._depth, self._timer = {}, {}, set(), 0, None
        self._owner, self._structure_fd, self._structure_depth = None, None, 0
        _close_inherited_descriptors(self.root)

    # -- internals ----------------------------------------------------------------------------------------
    def _lock_file(self, generation: str) -> Path:
        return self.root / "locks" / f"{generation}.lock"

    def _wait_file(self, generation: str) -> Path:
        return self.root / "locks" / f"{generation}.lock.wait"

    def _acquire(self, lock_path: Path, generation: str) -> int:
        """Take ``lock_path`` (a generation's lock, or the directory's when ``generation`` is empty)."""
        # We just yielded this generation to a waiter: let it take its turn first. It records its pid in the lock
        # file when it gets the lock; until then (or until the hand-off window closes, if it gave up) we stay out
        # of its way. A fixed pause was not enough on a loaded machine: the waiter was not scheduled in time and
        # the busy holder took the lock straight back, again and again.
        mine = f"pid {os.getpid()} "
        while time.monotonic() < self._yield_until.get(generation, 0.0) and _holder(lock_path).startswith(mine):
            time.sleep(_POLL_MIN)
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self._lock_timeout
        wait_file = self._wait_file(generation) if generation else None

        def signal_waiting() -> None:
            if wait_file is not None:
                with contextlib.suppress(OSError):
                    wait_file.touch()
            # While we wait, hand on what this run of calls has not used but an earlier one kept (idle) and
            # another process wants: that process may be the one we wait for (it holds ours, wants theirs).
            carried = [g for g, h in self._held.items() if not h.touched and self._someone_waiting(g)]
            if carried:
                self._release_locked(carried)

        try:
            if not flock_until(fd, fcntl.LOCK_EX, deadline, on_wait=signal_waiting, poll=_POLL_MIN,
                               max_poll=_POLL_MAX):
                raise StoreUnavailable(
                    f"the embedded store {self.root} is busy: another process ({_holder(lock_path)}) has held "
                    f"{lock_path} for more than {self._lock_timeout:g} s; retry later, raise "
                    "DPR_EDGE__LOCK_TIMEOUT, or run a Qdrant server (DPR_QDRANT_URL) for concurrent access"
                )
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} host {socket.gethostname()} since {time.time():.3f}\n".encode(), 0)
        return fd

    def _someone_waiting(self, generation: str) -> bool:
        held = self._held.get(generation)
        try:
            return held is not None and self._wait_file(generation).stat().st_mtime >= held.acquired_wall
        except OSError:
            return False

    def _after_use(self, idle_release: float) -> None:
        self._last_used = time.monotonic()
        self._idle_release = idle_release
        if idle_release <= 0:
            self._release_locked(list(self._held))
            return
        busy_too_long = [
            g for g, h in self._held.items()
            if self._last_used - h.acquired_at > max(idle_release, _MIN_FAIR_SHARE) and self._someone_waiting(g)
        ]
        if busy_too_long:
            log.debug("yielding edge locks to a waiting process", extra={"generations": busy_too_long})
            self._release_locked(busy_too_long)
            for g in busy_too_long:
                self._yield_until[g] = time.monotonic() + _HANDOFF_WINDOW
        if self._held and self._timer is None:
            self._start_timer(min(idle_release, _WAITER_GRACE))

    def _start_timer(self, delay: float) -> None:
        timer = threading.Timer(delay, self._idle_expired)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _idle_expired(self) -> None:
        """Release once the lease has been idle for ``idle_release``; a generation another process waits for
        goes after ``_WAITER_GRACE``; until then the timer checks again (every ``_WAITER_POLL``)."""
        with self._mutex:
            if self._timer is not threading.current_thread():
                return
            self._timer = None
            if not self._held or self._depth > 0:
                return  # released already, or in use: the end of that use re-arms the timer
            now = time.monotonic()
            release_at = self._last_used + self._idle_release
            waiter_at = self._last_used + _WAITER_GRACE
            if now >= release_at:
                self._release_locked(list(self._held))
                return
            if now >= waiter_at:
                wanted = [g for g in self._held if self._someone_waiting(g)]
                if wanted:
                    log.debug("handing idle edge locks to a waiting process", extra={"generations": wanted})
                    self._release_locked(wanted)
                    for g in wanted:
                        self._yield_until[g] = now + _HANDOFF_WINDOW
            if self._held:
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

    def _release_locked(self, generations: list[str]) -> None:
        if len(generations) == len(self._held):
            self._cancel_timer()
        for generation in generations:
            try:
                self.forget(generation)
            except Exception:
                log.exception("closing an edge shard failed", extra={"generation": generation})
            finally:
                self._dirty.discard(generation)
                self._unclaim(generation)

    def _unclaim(self, generation: str) -> None:
        held = self._held.pop(generation, None)
        if held is not None:
            _unlock(held.fd)
            log.debug("edge lock released", extra={"lock": str(self._lock_file(generation))})


def _unlock(fd: int | None) -> None:
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _holder(lock_path: Path) -> str:
    try:
        text = lock_path.read_text().strip()
    except OSError:
        text = ""
    return text or "holder unknown"


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
