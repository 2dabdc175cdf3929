"""A ``ShardLease``'s lifetime in its process (``lease.py``): one per collection directory (``one_per_directory``),
and when it lets go without a call asking it to: when idle (``IdleTimer``), at exit, and around ``os.fork()``.

The lease keeps its generations and shards after a run of calls so that a busy process does not reopen them per
call. ``WAITER_GRACE`` seconds after the last call it hands on what another process waits for, and every
``_WAITER_POLL`` after that it looks again, until ``idle_release`` seconds after the last call it lets go of
everything (``IdleTimer.due`` says which; what to let go is the lease's business). One thread per lease sleeps
until the deadline (None: disarmed), runs the lease's look under the lease's mutex, and ends after
``_TICKER_IDLE`` seconds disarmed; the next use starts it again. A Timer thread per use cost a thread start per
sequential question (~0.7 ms of a 5 ms dense question on 2 busy cores).

At exit every lease lets go. Just before ``os.fork()`` the parent hands everything back (unless a call is in
flight), and the child drops what it inherited: the shard objects are never used or dropped there, and the
descriptors that point inside the collection directory (the WAL lock among them) are closed, otherwise the child
would keep the parent's locks alive and neither could reopen the shard. Closing a duplicate does not release the
parent's own locks.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from services.store.edge.lease import ShardLease

log = logging.getLogger(__name__)

# An idle holder hands the lease to a waiting process after this many seconds without a call, instead of the
# whole ``idle_release``: consecutive calls of one piece of work (ensure the collection, read its document states)
# come closer together than this, while the gap a worker spends encoding its next batch is far longer, and holding
# the lease through it stalled the other process's store calls (and its cores) for up to ``idle_release`` per batch.
# Two workers hand the lease over twice per batch each, so every millisecond here is paid ~4 times per batch.
WAITER_GRACE = 0.01  # public: benchmarks/bench_lease.py sets it for its baseline
_WAITER_POLL = 0.02  # seconds between an idle holder's later looks for a waiter
_TICKER_IDLE = 30.0  # seconds the timer's thread waits disarmed before it ends (a use starts it again)

Due = Literal["release", "hand on"] | None


class IdleTimer:
    """The idle timer of one lease; every method runs with the lease's mutex held (its thread takes it)."""

    def __init__(self, mutex: threading.RLock, expired: Callable[[], bool]) -> None:
        """``expired``: the lease's look once the deadline passed, run by the timer's thread with ``mutex`` held
        (it asks ``due`` what to let go); True while it keeps something, so that the timer looks again."""
        self._mutex = mutex
        self._expired = expired
        self._wake = threading.Condition(mutex)
        self._deadline: float | None = None
        self._ticker: threading.Thread | None = None
        self._last_used = 0.0
        self._idle_release = 0.0
        self._again = _WAITER_POLL  # when to look again after the current look (``due`` sets it)
        self._sleeping_until: float | None = None  # the deadline the thread sleeps towards (None: disarmed)

    def used(self, idle_release: float) -> float:
        """A run of calls ended now (returned): the idle time counts from here, up to ``idle_release``."""
        self._last_used = time.monotonic()
        self._idle_release = idle_release
        return self._last_used

    def start(self) -> None:
        """Arm the timer for the first look after the last use, unless it is armed."""
        if self._deadline is None:
            self._arm(min(self._idle_release, WAITER_GRACE))

    def cancel(self) -> None:
        self._deadline = None  # the timer thread wakes at the old deadline, finds none and sleeps on

    def due(self) -> Due:
        """What the time since the last use lets go now: ``release`` everything (``idle_release``), ``hand on``
        what other processes wait for (``WAITER_GRACE``), or nothing yet."""
        now = time.monotonic()
        release_at = self._last_used + self._idle_release
        waiter_at = self._last_used + WAITER_GRACE
        self._again = max(_WAITER_POLL, min(release_at, max(waiter_at, now + _WAITER_POLL)) - now)
        return "release" if now >= release_at else "hand on" if now >= waiter_at else None

    def _arm(self, delay: float) -> None:
        """The next look ``delay`` seconds from now."""
        self._deadline = time.monotonic() + delay
        if self._ticker is None or not self._ticker.is_alive():
            self._sleeping_until = None
            self._ticker = threading.Thread(target=self._tick, name="dpr-lease-idle", daemon=True)
            self._ticker.start()
        elif self._sleeping_until is None or self._sleeping_until > self._deadline:
            self._wake.notify()  # else it wakes at its earlier deadline and sleeps on to this one: a wake-up per
            # use cost an in-process question 0.1-0.15 ms (the thread took the GIL and the mutex between two)

    def _tick(self) -> None:
        """The timer thread: the lease's ``expired`` at each deadline; it ends after ``_TICKER_IDLE`` s disarmed."""
        with self._mutex:
            while True:
                if self._ticker is not threading.current_thread():
                    return  # replaced (a new one started)
                if self._deadline is None:
                    self._sleeping_until = None
                    if not self._wake.wait(_TICKER_IDLE) and self._deadline is None:
                        self._ticker = None
                        return
                    continue
                delay = self._deadline - time.monotonic()
                if delay > 0:
                    self._sleeping_until = self._deadline
                    self._wake.wait(delay)
                    continue
                self._deadline = None
                if self._expired():
                    self._arm(self._again)


_LEASES: dict[Path, ShardLease] = {}
_LEASES_GUARD = threading.Lock()
_LIVE: weakref.WeakSet[ShardLease] = weakref.WeakSet()
_ORPHANED: list[Any] = []


def one_per_directory(root: Path, make: Callable[[Path], ShardLease]) -> ShardLease:
    """The lease of the directory ``root`` in this process (``make(root)`` the first time), released at exit."""
    key = root.resolve()
    with _LEASES_GUARD:
        lease = _LEASES.get(key)
        if lease is None:
            lease = _LEASES[key] = make(root)
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
        _ORPHANED.extend(lease.reset_after_fork())
        _close_inherited_descriptors(lease.root)


atexit.register(_release_all)
os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
