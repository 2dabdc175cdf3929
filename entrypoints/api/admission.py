"""Admission control for `dpr serve`: a burst beyond capacity is shed with 503 + Retry-After, never queued without
bound (docs/capacity.md).

At most ``api.max_in_flight`` requests under ``/v1/`` run at once in a worker process; up to ``api.max_queue`` more
wait (first come, first served) for at most ``api.queue_timeout`` seconds; anything beyond is answered at once with
503 and a ``Retry-After`` estimated from the recent service time and the queue ahead. A waiting request holds only
its connection and a future: its body is not read until it is admitted (``BodyLimit`` runs inside), so memory under
a burst is bounded by ``max_in_flight`` requests at work. Health, metrics and the console's static files are never
held back. Per-key rate limits (429) are ``AccessControl``'s and run first (one rate per key for the whole server:
``services/access/ratelimit.py``); this limit is per process (``api.workers`` processes admit ``workers x
max_in_flight``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque

from starlette.types import ASGIApp, Receive, Scope, Send

from entrypoints.api.middleware import send_error

log = logging.getLogger(__name__)

GUARDED_PREFIX = "/v1/"
_EWMA = 0.2  # weight of the newest service time in the running estimate
_MAX_RETRY_AFTER = 60


class Admission:
    """Pure ASGI middleware: a counter of requests at work plus a bounded FIFO of waiting futures."""

    def __init__(self, app: ASGIApp, max_in_flight: int, max_queue: int, queue_timeout: float) -> None:
        if max_in_flight < 1 or max_queue < 0 or queue_timeout <= 0:
            raise ValueError("admission needs max_in_flight >= 1, max_queue >= 0 and queue_timeout > 0")
        self.app = app
        self.max_in_flight = max_in_flight
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        self.active = 0  # requests at work
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.service_s = 0.05  # running estimate of one request's time at work (seconds)
        self.shed = 0  # requests answered 503 since start (tests, logs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith(GUARDED_PREFIX):
            await self.app(scope, receive, send)
            return
        if not await self._admit():
            await self._refuse(send)
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await self.app(scope, receive, send)
        finally:
            self.service_s += _EWMA * (loop.time() - started - self.service_s)
            self._release()

    async def _admit(self) -> bool:
        """True once a slot is this request's; False when the queue is full or the wait ran out."""
        if self.active < self.max_in_flight and not self.waiting:
            self.active += 1
            return True
        if len(self.waiting) >= self.max_queue:
            return False
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(ticket)
        try:
            await asyncio.wait({ticket}, timeout=self.queue_timeout)
        except asyncio.CancelledError:  # the client went away while waiting
            self._give_up(ticket)
            raise
        if ticket.done():
            return True  # _release handed its slot over (active unchanged)
        self._give_up(ticket)
        return False

    def _give_up(self, ticket: asyncio.Future[None]) -> None:
        if ticket.done():  # granted in the same loop turn: pass the slot on
            self._release()
            return
        ticket.cancel()
        with contextlib.suppress(ValueError):
            self.waiting.remove(ticket)

    def _release(self) -> None:
        while self.waiting:
            ticket = self.waiting.popleft()
            if not ticket.done():
                ticket.set_result(None)  # the slot goes straight to the oldest waiter
                return
        self.active -= 1

    def retry_after(self) -> int:
        """Seconds until the queue ahead has likely drained: its length times the service time, over the slots."""
        ahead = len(self.waiting) + self.active
        return max(1, min(_MAX_RETRY_AFTER, math.ceil(ahead * self.service_s / self.max_in_flight)))

    async def _refuse(self, send: Send) -> None:
        self.shed += 1
        seconds = self.retry_after()
        log.warning("request shed: at capacity", extra={"active": self.active, "waiting": len(self.waiting),
                                                        "retry_after": seconds})
        await send_error(send, 503, "overloaded",
                         f"the server is at capacity ({self.active} requests at work, {len(self.waiting)} waiting); "
                         f"retry after {seconds} s, or raise DPR_API__MAX_IN_FLIGHT / DPR_API__MAX_QUEUE on a larger "
                         "machine", {"Retry-After": str(seconds)})
