"""uvicorn's h11 protocol with read deadlines, so slow clients (slowloris) cannot hold connections open.

uvicorn times out idle keep-alive connections but not a client that sends its request slowly: a connection that
trickles one header byte a second stays open forever, and enough of them exhaust the server's sockets. Here:

- a new connection (and each keep-alive connection after a response) has ``header_timeout`` seconds to deliver
  a complete request line and headers; the deadline is not extended by further bytes;
- once the headers are in, the body may stall at most ``body_timeout`` seconds between two chunks;

past either, the connection is closed. The limits travel on uvicorn's ``Config`` (``dpr_header_timeout``,
``dpr_body_timeout``), which uvicorn hands to every protocol instance and to its worker processes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0


class GuardedH11Protocol(H11Protocol):
    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.header_timeout = float(getattr(config, "dpr_header_timeout", DEFAULT_HEADER_TIMEOUT))
        self.body_timeout = float(getattr(config, "dpr_body_timeout", DEFAULT_BODY_TIMEOUT))
        self._read_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout, "headers")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm(self.body_timeout, "body")  # idle time between two body chunks
        elif state is not h11.IDLE:
            self._disarm()  # the request is in; the app takes its time
        # IDLE: headers still incomplete: the deadline set when the wait began stands (more bytes do not extend it)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm(self.header_timeout, "headers")  # the next request on this keep-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._read_deadline = self.loop.call_later(seconds, self._too_slow, what, seconds)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _too_slow(self, what: str, seconds: float) -> None:
        self._read_deadline = None
        if self.transport.is_closing() or self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            return
        log.warning("closing a connection from %s: the request %s took over %g s", self.client, what, seconds)
        self.transport.close()
