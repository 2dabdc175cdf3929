"""Per-key token buckets: ``rate`` requests per second on average, ``burst`` at once.

One bucket per key id (and one per client address for requests without a valid key, so guessing keys is
throttled too). In-process: with ``DPR_API__WORKERS=N`` each worker process keeps its own buckets, so a key gets
up to N times the rate; the buckets are not shared across replicas either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAX_BUCKETS = 100_000  # idle full buckets are dropped past this many (a flood of addresses cannot grow memory)


class RateLimiter:
    def __init__(self, rate: float | None, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        """``rate`` None: only keys with a rate of their own are limited."""
        if (rate is not None and rate <= 0) or burst < 1:
            raise ValueError(f"rate {rate} must be > 0 and burst {burst} >= 1")
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, key: str, rate: float | None = None) -> float:
        """Take one token from ``key``'s bucket: 0.0 when allowed, else the seconds until a token is back (the
        Retry-After). ``rate`` overrides the default rate for this key (the burst is ``rate_burst`` seconds' worth
        of the default rate, scaled to this rate)."""
        rate = rate or self.rate
        if rate is None:
            return 0.0
        burst = max(1.0, self.burst * rate / self.rate) if self.rate else float(self.burst)
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (burst, now))
            tokens = min(burst, tokens + (now - at) * rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                wait = 0.0
            else:
                self._buckets[key] = (tokens, now)
                wait = (1.0 - tokens) / rate
            if len(self._buckets) > MAX_BUCKETS:
                self._prune(now)
        return wait

    def _prune(self, now: float) -> None:
        rate = self.rate or 1.0
        full = [k for k, (tokens, at) in self._buckets.items() if tokens + (now - at) * rate >= self.burst]
        for k in full:
            del self._buckets[k]
