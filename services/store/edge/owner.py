"""The serving process owns the shards it has open; writers in other processes send it their reads and writes.

qdrant-edge opens a shard in one process at a time, so a writer in another process (a `dpr worker`, `dpr ingest`)
used to take the generation's lease from `dpr serve` for each batch: the server closed its shard, the writer loaded
it, wrote, and the server loaded it again on its next question (both loads hold the GIL: each one a stall of every
question; at 1M passages 1-2 s a turn, results/query-speed/ingest-stalls.md). Now `dpr serve` (``Owner``) listens on
an abstract Unix socket named after the store directory, and a process that does not hold the generation itself
asks there first: the owner runs the call (the point reads and writes an ingest makes; ``ServedStore`` and
``Answers`` in ``services/store/__init__.py`` are both ends' store side, this module the socket) on its own engine,
with the shard it has open, journaled for an index build as its own writes are, and only for generations it has
open (a re-embed's target generation, which it does not serve, is still written by the workers themselves).

Nothing here changes what a call does, only the process it runs in: every call is idempotent (upserts by point id,
deletes by filter), so a call whose answer was lost (the owner died) runs again locally. A process that holds the
generation's lock itself (an index build's claim, a writer that took it before the server started) never asks: the
owner would wait for that lock. Both ends check that the other runs as this uid (``SO_PEERCRED``: the calls and
answers are pickles); the socket is abstract (Linux), so nothing is left on disk by a killed owner.
``DPR_EDGE__SERVE_WRITES=false`` turns it off.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.core.errors import StoreUnavailable

log = logging.getLogger(__name__)

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]  # a ``Store`` method and its arguments
Answer = Callable[[str, str, Call], tuple[bool, Any]]  # (alias, generation, call) -> (ran here, its answer)
_HEADER = struct.Struct("!I")
_ABSENT_S = 2.0  # after a failed connect, seconds before asking the socket again
_EXTRA_S = 30.0  # a call's answer may take the owner's lock wait (lock_timeout) and this much more
_OWNED_HERE: set[str] = set()  # the addresses this process owns: its own engines never ask themselves


def address(store_dir: Path) -> str:
    """The abstract socket of a store directory (one owner per directory)."""
    digest = hashlib.sha256(str(Path(store_dir).resolve()).encode()).hexdigest()[:24]
    return f"\0dpr-edge-owner-{digest}"


def supported() -> bool:
    return sys.platform == "linux"


def _send(conn: socket.socket, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    conn.sendall(_HEADER.pack(len(data)) + data)


def _receive(conn: socket.socket) -> Any:
    (size,) = _HEADER.unpack(_read(conn, _HEADER.size))
    return pickle.loads(_read(conn, size))  # noqa: S301 - a peer of this uid only (``_trusted``, both ends)


def _read(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the owner closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class Owner:
    """Answers other processes' calls through ``answer`` (``services.store.Answers``: (False, None) for a generation
    this process does not have open). ``start`` returns False where another process owns the directory."""

    def __init__(self, store_dir: Path, answer: Answer) -> None:
        self.address = address(store_dir)
        self._answer = answer
        self._socket: socket.socket | None = None
        self.calls = 0

    def start(self) -> bool:
        if not supported():
            return False
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.address)
        except OSError:  # EADDRINUSE: another server process of this directory owns it
            listener.close()
            return False
        listener.listen(64)
        self._socket = listener
        _OWNED_HERE.add(self.address)
        log.info("answering the store calls of writers in other processes", extra={"socket": self.address[1:]})
        threading.Thread(target=self._accept, name="dpr-edge-owner", daemon=True).start()
        return True

    def close(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_RDWR)
            self._socket.close()
            self._socket = None
            _OWNED_HERE.discard(self.address)

    def _accept(self) -> None:
        while (listener := self._socket) is not None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if not _trusted(conn):
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), name="dpr-edge-owner-call", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    alias, generation, call = _receive(conn)
                except (ConnectionError, OSError, EOFError, struct.error, pickle.UnpicklingError, ValueError,
                        AttributeError, ImportError):  # AttributeError, ImportError: a call this code does not have
                    return
                try:
                    ran, value = self._answer(alias, generation, call)
                    self.calls += ran
                    answer = ("ok", value) if ran else ("absent", None)
                except Exception as e:  # the caller raises it as its own call would have
                    answer = ("error", _portable(e, _name(call)))
                try:
                    _send(conn, answer)
                except OSError:
                    return

def _name(call: Any) -> str:
    return str(getattr(call[0], "__name__", call[0])) if isinstance(call, tuple) and call else repr(call)


def _portable(error: Exception, method: str) -> Exception:
    """``error`` if it survives a pickle round trip (the caller re-raises it), else a ``StoreUnavailable`` naming it."""
    try:
        pickle.loads(pickle.dumps(error))  # noqa: S301 - our own object
        return error
    except Exception:
        return StoreUnavailable(f"{method} in the serving process failed: {type(error).__name__}: {error}")


def _trusted(conn: socket.socket) -> bool:
    """Only a process of this uid may call (an abstract socket has no file mode to keep others out)."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.getuid()


class OwnerClient:
    """One process's way to the owner of a store directory: a connection per thread, asked only while it answers."""

    def __init__(self, store_dir: Path, timeout_s: float) -> None:
        self.address = address(store_dir)
        self.timeout_s = timeout_s + _EXTRA_S
        self._local = threading.local()
        self._absent_until = 0.0

    def call(self, alias: str, generation: str, call: Call) -> tuple[bool, Any]:
        """``(True, answer)`` where the owner has ``generation`` open and ran the call (its error raised here);
        ``(False, None)``: run it here (no owner, it does not have the generation open, or it went away before
        answering)."""
        if self.address in _OWNED_HERE or not supported() or time.monotonic() < self._absent_until:
            return False, None
        try:
            conn = self._connection()
            _send(conn, (alias, generation, call))
            status, value = _receive(conn)
        except TimeoutError as e:
            self._drop()
            raise StoreUnavailable(f"the serving process did not answer {_name(call)} within {self.timeout_s:.0f} s; "
                                   "retry, or check `dpr serve`") from e
        except (ConnectionError, OSError, EOFError, struct.error, pickle.UnpicklingError):
            self._drop()
            self._absent_until = time.monotonic() + _ABSENT_S
            return False, None
        if status == "error":
            raise value
        return status == "ok", value

    def _connection(self) -> socket.socket:
        conn: socket.socket | None = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid != os.getpid():  # inherited through fork: the parent's, not ours
            conn.close()
            conn = None
        if conn is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(self.timeout_s)
            try:
                conn.connect(self.address)
                if not _trusted(conn):  # a name squatted by another user: its answers would be unpickled here
                    raise ConnectionRefusedError(f"the owner socket of {self.address[1:]} is not this uid's")
            except OSError:
                conn.close()
                raise
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()
