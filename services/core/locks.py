"""Cross-process locks for the model lifecycle (redis-py and fcntl only; never Celery).

- ``Lease``: one holder at a time (one re-embed per collection, one beat). A Redis key with a TTL that the
  holder refreshes when a broker is configured (the holders may live on several machines); otherwise an
  exclusive ``fcntl.flock`` on a file under ``DATA_DIR/locks`` (released by the kernel when the process dies).
- ``WriteFence``: a reader-writer gate around every write to a collection. Writers (an ingest batch, a delete)
  hold it *shared* from resolving the active generation to their last write; the re-embed swap holds it
  *exclusive* for its final catch-up, verification and alias swap, so no write can land in the old generation
  after the final catch-up has read it. The exclusive side announces itself first (a pending marker), so a
  steady stream of writers cannot starve the swap.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from services.core.errors import StoreUnavailable, TransientError
from services.core.fsutil import flock_until, holder_tag

log = logging.getLogger(__name__)

_POLL = 0.05
# Seconds a write-fence key outlives its holder: the holder refreshes it every quarter of that while it holds the
# fence, so the fence of a killed process is free within this time (services.core.locks.RedisFence).
FENCE_HEARTBEAT_TTL = 20.0


class LockBusy(TransientError):
    """Someone else holds the lock; the message names the holder."""


# --------------------------------------------------------------------------------------------------------------
# leases (exclusive, long-lived)
# --------------------------------------------------------------------------------------------------------------


class Lease(Protocol):
    name: str

    def acquire(self, wait: float = 0.0) -> bool: ...

    def refresh(self) -> None: ...

    def release(self) -> None: ...

    def holder(self) -> str: ...


class FileLease:
    """``flock`` on ``path``: exclusive, per open file, released by the kernel if the process dies."""

    def __init__(self, path: Path, name: str = "") -> None:
        self.path = path
        self.name = name or path.stem
        self._fd: int | None = None

    def acquire(self, wait: float = 0.0) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not flock_until(fd, fcntl.LOCK_EX, time.monotonic() + wait):
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_tag().encode(), 0)
        self._fd = fd
        return True

    def refresh(self) -> None:  # a flock does not expire
        return None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "unknown"
        except OSError:
            return "unknown"


class RedisLease:
    """``SET key token NX PX ttl``; refresh and release only while the key still holds our token."""

    _REFRESH = (
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
    )
    _RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"

    def __init__(self, client: Any, key: str, ttl: float, name: str = "", token: str | None = None) -> None:
        """``token``: adopt the lease its holder took (another task of the same work), held from the start."""
        self.client = client
        self.key = key
        self.ttl_ms = int(ttl * 1000)
        self.name = name or key
        self.token = token or f"{uuid.uuid4().hex} {holder_tag()}"
        self._held = token is not None
        self.lapsed = False  # the key expired at least once while held: someone may have had it meanwhile

    def acquire(self, wait: float = 0.0) -> bool:
        deadline = time.monotonic() + wait
        while True:
            if self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
                self._held = True
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)

    def refresh(self) -> None:
        """Extend our TTL; if the key expired meanwhile (``lapsed``) and nobody took it, take it again."""
        if not self._held or self.client.eval(self._REFRESH, 1, self.key, self.token, self.ttl_ms):
            return
        self.lapsed = True
        if self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
            return
        self._held = False
        raise LockBusy(f"lost the lock {self.key!r} (expired and taken by {self.holder()})")

    def release(self) -> None:
        if self._held:
            self._held = False
            with contextlib.suppress(Exception):
                self.client.eval(self._RELEASE, 1, self.key, self.token)

    def holder(self) -> str:
        return redis_holder(self.client, self.key)


def redis_holder(client: Any, key: Any) -> str:
    """Who holds a Redis lock key (the ``holder_tag`` after its token), or "nobody"."""
    value = client.get(key)
    if value is None:
        return "nobody"
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text.partition(" ")[2] or text


class KeepAlive:
    """Refresh a lease from a daemon thread every ``interval`` seconds until stopped."""

    def __init__(self, lease: Lease, interval: float) -> None:
        self.lease = lease
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"keepalive-{lease.name}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.lease.refresh()
            except Exception:
                log.exception("refreshing a lock failed", extra={"lock": self.lease.name})

    def __enter__(self) -> KeepAlive:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


# --------------------------------------------------------------------------------------------------------------
# the write fence (shared for writers, exclusive for the swap)
# --------------------------------------------------------------------------------------------------------------


class WriteFence(Protocol):
    def shared(self) -> contextlib.AbstractContextManager[None]: ...

    def exclusive(self) -> contextlib.AbstractContextManager[None]: ...


class NoFence:
    """For stores nobody else writes to (tests, benchmarks)."""

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        yield


class FileFence:
    """``flock`` shared/exclusive on ``path``; ``path.pending`` announces a waiting exclusive holder.

    Locks are per open file description, so one process may hold the shared side in several threads at once.
    A pending marker older than ``stale_after`` seconds whose owner holds nothing is ignored (its owner died).
    """

    def __init__(self, path: Path, timeout: float = 120.0, stale_after: float = 600.0) -> None:
        self.path = path
        self.pending = path.with_name(path.name + ".pending")
        self.timeout = timeout
        self.stale_after = stale_after

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def _pending(self) -> bool:
        try:
            return time.time() - self.pending.stat().st_mtime < self.stale_after
        except OSError:
            return False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        fd = self._open()
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                if not self._pending() and flock_until(fd, fcntl.LOCK_SH, time.monotonic()):  # one try
                    if not self._pending():
                        break
                    fcntl.flock(fd, fcntl.LOCK_UN)  # a swap announced itself meanwhile: let it go first
                if time.monotonic() >= deadline:
                    raise StoreUnavailable(
                        f"writes to this collection are paused for a re-embed swap ({self.path}) for more than "
                        f"{self.timeout:g} s; retry later"
                    )
                time.sleep(_POLL)
            yield
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        fd = self._open()
        self.pending.write_text(holder_tag())
        try:
            if not flock_until(fd, fcntl.LOCK_EX, time.monotonic() + self.timeout, on_wait=self.pending.touch):
                raise StoreUnavailable(
                    f"in-flight writes did not finish within {self.timeout:g} s ({self.path}); retry the swap"
                )
            yield
        finally:
            with contextlib.suppress(OSError):
                self.pending.unlink()
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class RedisFence:
    """The same gate in Redis for writers on several machines (server store + workers).

    Writers: wait while ``<key>:x`` exists, ``SET <key>:w:<token>``, re-check ``<key>:x`` (if it appeared, step
    back and wait). Swap: ``SET <key>:x NX``, then wait until no ``<key>:w:*`` is left.

    Holders that die are released within ``ttl`` seconds, never waited out: every key is a heartbeat with a short
    TTL that a ``KeepAlive`` thread of its holder refreshes every ``ttl / 4`` seconds while it holds the fence,
    so a killed process's key expires on its own and a live one keeps its key however long it writes. (Owner
    liveness by pid was not used: processes in different containers can share a host name but not a pid
    namespace, and wrongly releasing a live writer would lose its write.) A writer whose key lapsed anyway (a
    process stalled, Redis unreachable for ``ttl`` s) raises ``StoreUnavailable`` when it leaves, so its batch is
    retried (writes are idempotent) instead of ending after a swap that may not have waited for it.
    """

    def __init__(self, client: Any, key: str, timeout: float = 120.0, ttl: float = FENCE_HEARTBEAT_TTL) -> None:
        self.client = client
        self.key = key
        self.timeout = timeout
        self.ttl = ttl
        self.xkey = f"{key}:x"

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        lease = RedisLease(self.client, f"{self.key}:w:{uuid.uuid4().hex}", self.ttl, name=f"{self.key}:w")
        deadline = time.monotonic() + self.timeout
        while True:
            if not self.client.exists(self.xkey):
                lease.acquire()
                if not self.client.exists(self.xkey):
                    break
                lease.release()
            if time.monotonic() >= deadline:
                holder = redis_holder(self.client, self.xkey)
                raise StoreUnavailable(
                    f"writes are paused for a re-embed swap ({self.xkey}, held by {holder}) for more than "
                    f"{self.timeout:g} s; retry later"
                )
            time.sleep(_POLL)
        try:
            with KeepAlive(lease, self.ttl / 4):
                yield
            if not self._kept(lease):
                raise StoreUnavailable(
                    f"this writer lost its hold on the write fence {self.key!r} (its heartbeat lapsed for more than "
                    f"{self.ttl:g} s); a re-embed swap may have passed it, so the batch is retried"
                )
        finally:
            lease.release()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        deadline = time.monotonic() + self.timeout
        lease = RedisLease(self.client, self.xkey, self.ttl, name=self.xkey)
        if not lease.acquire(wait=self.timeout):
            raise StoreUnavailable(f"another swap holds {self.xkey} ({lease.holder()}); retry later")
        try:
            with KeepAlive(lease, self.ttl / 4):
                while writers := list(self.client.scan_iter(match=f"{self.key}:w:*", count=100)):
                    if time.monotonic() >= deadline:
                        holders = "; ".join(redis_holder(self.client, k) for k in writers[:3])
                        raise StoreUnavailable(
                            f"in-flight writes did not finish within {self.timeout:g} s (held by {holders}); "
                            "retry the swap"
                        )
                    time.sleep(_POLL)
                yield
            if not self._kept(lease):
                log.error("the exclusive write fence lapsed during the swap; writes made meanwhile may be missing "
                          "from the new generation: ingest them again", extra={"fence": self.key})
        finally:
            lease.release()

    @staticmethod
    def _kept(lease: RedisLease) -> bool:
        """Whether ``lease`` never lapsed while held (a last refresh checks the time since the keep-alive's)."""
        try:
            lease.refresh()
        except Exception:
            log.warning("could not check the write fence", extra={"lock": lease.name}, exc_info=True)
            return False
        return not lease.lapsed


def redis_client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)


def write_fence(alias: str, data_dir: Path, broker_url: str | None, timeout: float) -> WriteFence:
    """A collection's write fence (writers hold it shared; a re-embed swap and a rollback take it exclusive): in
    Redis when a broker is configured, else a file beside the store. All processes of one deployment must share
    the same settings (broker or not)."""
    if broker_url:
        return RedisFence(redis_client(broker_url), f"dpr:fence:{alias}", timeout=timeout)
    return FileFence(data_dir / "locks" / f"fence-{alias}", timeout=timeout)
