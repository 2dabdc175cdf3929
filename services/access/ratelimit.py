"""Per-key token buckets: ``rate`` requests per second on average, ``burst`` at once.

One bucket per key id (and one per client address for requests without a valid key, so guessing keys is
throttled too). Where the buckets live decides who shares them:

- ``SqliteBuckets`` (``dpr serve``'s default): ``DATA_DIR/ratelimit.sqlite``, one short write transaction per take,
  so every process of a server (``DPR_API__WORKERS``) and its restarts within the window share one rate per key;
- ``RedisBuckets`` when a broker is configured: one Lua script per take on the broker's clock, so replicas on other
  machines share it too;
- ``MemoryBuckets``: this process alone (tests, benchmarks).

A shared store that cannot answer (the broker down, the file locked past its timeout) is left alone for a few
seconds while this process's own buckets limit, and that is logged: a rate limit never fails a request by itself.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

MAX_BUCKETS = 100_000  # idle full buckets are dropped past this many (a flood of addresses cannot grow memory)
RATE_FILE = "ratelimit.sqlite"
SHARED_RETRY_S = 5.0


def refill(state: tuple[float, float] | None, rate: float, burst: float, now: float) -> tuple[float, float]:
    """The bucket after one take at ``now``: (tokens left, seconds to wait; 0.0 when the take is allowed)."""
    tokens, at = state or (burst, now)
    tokens = min(burst, tokens + max(0.0, now - at) * rate)
    if tokens >= 1.0:
        return tokens - 1.0, 0.0
    return tokens, (1.0 - tokens) / rate


class Buckets(Protocol):
    def take(self, key: str, rate: float, burst: float) -> float:
        """One token from ``key``'s bucket: 0.0 when allowed, else the seconds until a token is back."""
        ...


class MemoryBuckets:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._buckets: dict[str, tuple[float, float, float]] = {}  # key -> (tokens, at, time it is full again)
        self._lock = threading.Lock()

    def take(self, key: str, rate: float, burst: float) -> float:
        now = self.clock()
        with self._lock:
            old = self._buckets.get(key)
            tokens, wait = refill(old[:2] if old else None, rate, burst, now)
            self._buckets[key] = (tokens, now, now + (burst - tokens) / rate)
            if len(self._buckets) > MAX_BUCKETS:
                for k in [k for k, (_, _, full) in self._buckets.items() if full <= now]:
                    del self._buckets[k]
        return wait


class SqliteBuckets:
    """Buckets in one SQLite file (WAL): each take is one ``BEGIN IMMEDIATE`` transaction, so processes sharing
    the file take turns. Opened on the first take: a server without keys never creates it."""

    PRUNE_EVERY = 1000  # takes between deletions of buckets that are full again (they equal no bucket)

    def __init__(self, path: Path, clock: Callable[[], float] = time.time, timeout: float = 1.0) -> None:
        self.path = path
        self.clock = clock  # wall time: shared by processes and across restarts
        self.timeout = timeout
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._takes = 0

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # a crash may lose the last takes: a rate limit, not a ledger
            db.execute("CREATE TABLE IF NOT EXISTS buckets (key TEXT PRIMARY KEY, tokens REAL, at REAL, full REAL)")
            self._db = db
        return self._db

    def take(self, key: str, rate: float, burst: float) -> float:
        with self._lock:
            db = self._open()
            db.execute("BEGIN IMMEDIATE")
            try:
                now = self.clock()
                row = db.execute("SELECT tokens, at FROM buckets WHERE key = ?", (key,)).fetchone()
                tokens, wait = refill(row, rate, burst, now)
                db.execute("INSERT OR REPLACE INTO buckets VALUES (?, ?, ?, ?)",
                           (key, tokens, now, now + (burst - tokens) / rate))
                self._takes += 1
                if self._takes % self.PRUNE_EVERY == 0:
                    db.execute("DELETE FROM buckets WHERE full <= ?", (now,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return wait

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


# KEYS[1] the bucket; ARGV rate, burst. The broker's clock; the bucket expires once it would be full again.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local old = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(old[1]) or burst, tonumber(old[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return tostring(wait)
"""


class RedisBuckets:
    def __init__(self, client: Any, prefix: str = "dpr:rate:") -> None:
        self.client = client
        self.prefix = prefix
        self._script = client.register_script(_TAKE)

    @classmethod
    def from_url(cls, url: str) -> RedisBuckets:
        import redis

        return cls(redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5))  # never stall a request

    def take(self, key: str, rate: float, burst: float) -> float:
        return float(self._script(keys=[self.prefix + key], args=[repr(rate), repr(burst)]))


class RateLimiter:
    def __init__(self, rate: float | None, burst: int, clock: Callable[[], float] = time.monotonic,
                 buckets: Buckets | None = None) -> None:
        """``rate`` None: only keys with a rate of their own are limited. ``buckets``: where they live (default:
        this process's memory, on ``clock``)."""
        if (rate is not None and rate <= 0) or burst < 1:
            raise ValueError(f"rate {rate} must be > 0 and burst {burst} >= 1")
        self.rate = rate
        self.burst = burst
        self.local = MemoryBuckets(clock)
        self.buckets: Buckets = buckets or self.local
        self._shared_down_until = 0.0  # after a failure the shared store is left alone for SHARED_RETRY_S

    def take(self, key: str, rate: float | None = None) -> float:
        """Take one token from ``key``'s bucket: 0.0 when allowed, else the seconds until a token is back (the
        Retry-After). ``rate`` overrides the default rate for this key (the burst is ``rate_burst`` seconds' worth
        of the default rate, scaled to this rate)."""
        rate = rate or self.rate
        if rate is None:
            return 0.0
        burst = max(1.0, self.burst * rate / self.rate) if self.rate else float(self.burst)
        if self.buckets is not self.local and time.monotonic() >= self._shared_down_until:
            try:
                return self.buckets.take(key, rate, burst)
            except Exception as e:  # the shared store is unreachable: this process's own buckets meanwhile
                self._shared_down_until = time.monotonic() + SHARED_RETRY_S
                log.warning("shared rate-limit buckets unavailable (%s: %s); limiting this process alone for %.0f s",
                            type(e).__name__, e, SHARED_RETRY_S)
        return self.local.take(key, rate, burst)


def shared_buckets(data_dir: Path, broker_url: str | None) -> Buckets:
    """Redis with a broker (replicas share it), else the data dir's SQLite file (this server's processes)."""
    return RedisBuckets.from_url(broker_url) if broker_url else SqliteBuckets(data_dir / RATE_FILE)
