"""Parsers run in a child process, so a hang or a crash costs one document, never the run.

``ParserSandbox`` keeps one child (``python -m services.readers.sandbox``) and sends it one document at a time
over a pipe; the child streams the reader's parts back as it reads (a page at a time), so neither process holds
more than the document's text. What can go wrong, and what the document becomes:
- the reader raises ``ParseFailure``: that failure (``encrypted``, ``corrupt``, ``no_text_layer``, ``zip_bomb``...);
- it takes longer than ``parse_timeout_s``: the child is killed (``timeout``) and a fresh one starts;
- the child dies (a segfault in native code, an abort, the OOM killer): ``parser_crashed``, a fresh child starts,
  and the document's bytes (sha256) are quarantined (``services.readers.quarantine``: in ``limits.quarantine_dir``,
  shared by every process using it, else in this process): the same bytes are never parsed again (a second
  path, a re-read of the input, another run or worker), they fail at once naming the first crash;
- it asks for more memory than ``max_parser_memory_mb`` (RLIMIT_AS in the child): ``too_large``.
The child holds no state between documents but the imported parser modules.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from services.core.fsutil import sha256_of
from services.core.settings import DocumentSettings
from services.readers.protocol import Info, ParseFailure
from services.readers.quarantine import Quarantine
from services.readers.records import Section

# Which function reads each kind (``module:function``, imported in the child only).
READERS: dict[str, str] = {
    "pdf": "services.readers.pdf:read",
    "docx": "services.readers.docx:read",
    "pptx": "services.readers.pptx:read",
    "odt": "services.readers.odt:read",
    "epub": "services.readers.epub:read",
}


@dataclass
class Parsed:
    """The outcome of one document: its sections and info, or a failure (reason, message)."""

    sections: list[Section] = field(default_factory=list)
    info: Info = field(default_factory=Info)
    reason: str = ""
    message: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return bool(self.reason)


class ParserSandbox:
    """One parser child process, started on first use and replaced after a crash or a timeout."""

    def __init__(self, limits: DocumentSettings | None = None, readers: dict[str, str] | None = None) -> None:
        self.limits = limits or DocumentSettings()
        self.readers = dict(READERS if readers is None else readers)
        self._proc: subprocess.Popen[bytes] | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None
        self.started = 0  # children started (a crash or timeout starts another)
        self._lock = threading.Lock()  # one document at a time through the pipe (API threads share a sandbox)
        self._pid = os.getpid()  # a forked copy (a prefork worker) starts its own child, never shares the pipe

    # --- the child's lifetime -----------------------------------------------------------------------------------

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # what the parent can import, the child can
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "services.readers.sandbox"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, close_fds=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None  # noqa: S101 - Popen(PIPE) contract
        self._send = Connection(os.dup(self._proc.stdin.fileno()), readable=False)
        self._recv = Connection(os.dup(self._proc.stdout.fileno()), writable=False)
        self._proc.stdin.close()
        self._proc.stdout.close()
        self._send.send(self.limits.model_dump())
        self.started += 1

    def _stop(self, kill: bool = False) -> int | None:
        proc, self._proc = self._proc, None
        for conn in (self._send, self._recv):
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        self._send = self._recv = None
        if proc is None:
            return None
        if kill:
            proc.kill()
        try:
            return proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def close(self) -> None:
        if self._proc is not None and self._send is not None:
            with contextlib.suppress(OSError):
                self._send.send(None)  # the child's loop ends
        self._stop()

    def __enter__(self) -> ParserSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- one document -------------------------------------------------------------------------------------------

    def parse(self, kind: str, path: Path) -> Parsed:
        """Read ``path`` as ``kind`` in the child; never raises for the document's sake."""
        started = time.monotonic()
        digest = _digest(path)
        quarantine = Quarantine(self.limits.quarantine_dir)
        crashed = quarantine.get(digest)
        if crashed is not None:
            return Parsed(reason="parser_crashed", message=quarantine.refusal(digest, crashed))
        spec = self.readers.get(kind)
        if spec is None:
            return Parsed(reason="unsupported", message=f"no reader for {kind!r}")
        with self._lock:
            if self._pid != os.getpid():
                self._proc, self._send, self._recv, self._pid = None, None, None, os.getpid()
            result = self._run(spec, path, started)
        if result.reason == "parser_crashed":
            quarantine.add(digest, result.message.split(";")[0], path.name)
        result.seconds = time.monotonic() - started
        return result

    def _run(self, spec: str, path: Path, started: float) -> Parsed:
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            self._start()
        assert self._send is not None and self._recv is not None  # noqa: S101 - set by _start
        deadline = started + self.limits.parse_timeout_s
        out = Parsed()
        try:
            self._send.send((spec, str(path)))
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._recv.poll(remaining):
                    self._stop(kill=True)
                    return Parsed(reason="timeout", message=(
                        f"took longer than {self.limits.parse_timeout_s:g} s to parse (stopped after "
                        f"{len(out.sections)} sections); raise DPR_DOCUMENTS__PARSE_TIMEOUT_S if it is genuine, "
                        "or split or re-create the file"))
                msg = self._recv.recv()
                tag = msg[0]
                if tag == "part":
                    part = msg[1]
                    if isinstance(part, Info):
                        out.info = part
                    else:
                        out.sections.append(part)
                elif tag == "done":
                    return out
                elif tag == "fail":
                    return Parsed(reason=msg[1], message=msg[2])
        except (EOFError, OSError, BrokenPipeError):
            code = self._stop(kill=True)
            return Parsed(reason="parser_crashed", message=(
                f"crashed the parser ({_exit_text(code)}); the document is quarantined and the others go on; "
                "repair or re-create it (e.g. `qpdf in.pdf out.pdf` for a PDF), or report it with the file"))


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _digest(path: Path) -> str:
    try:
        return sha256_of(path)
    except OSError:
        return ""


_SHARED: ParserSandbox | None = None
_SHARED_LOCK = threading.Lock()


def shared_sandbox(limits: DocumentSettings) -> ParserSandbox:
    """This process's sandbox for ``limits`` (one child, reused; closed at exit)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None or _SHARED.limits != limits:
            if _SHARED is not None:
                _SHARED.close()
            _SHARED = ParserSandbox(limits)
        return _SHARED


@atexit.register
def _close_shared() -> None:
    if _SHARED is not None:
        _SHARED.close()


# --- the child --------------------------------------------------------------------------------------------------


def _child() -> None:
    recv = Connection(os.dup(0), writable=False)
    send = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # anything a parser prints goes to stderr, never into the pipe
    limits = DocumentSettings(**recv.recv())
    with contextlib.suppress(ImportError, ValueError, OSError):  # not on this platform: the time limit still holds
        import resource

        cap = limits.max_parser_memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    while True:
        try:
            request = recv.recv()
        except EOFError:
            return
        if request is None:
            return
        spec, path = request
        try:
            module, _, name = spec.partition(":")
            reader: Any = getattr(importlib.import_module(module), name)
            for part in reader(Path(path), limits):
                send.send(("part", part))
            send.send(("done",))
        except ParseFailure as e:
            send.send(("fail", e.reason, e.message))
        except MemoryError:
            send.send(("fail", "too_large", f"needs more than DPR_DOCUMENTS__MAX_PARSER_MEMORY_MB="
                       f"{limits.max_parser_memory_mb} MiB to parse; raise it or split the file"))
        except RecursionError:
            send.send(("fail", "corrupt", "nests too deeply to parse (a damaged or hostile file); re-create it"))
        except Exception as e:  # noqa: BLE001 - any parser error fails this document, with what it said
            send.send(("fail", "corrupt", f"could not be parsed ({type(e).__name__}: {str(e)[:300]}); "
                       "re-save or re-create it"))


if __name__ == "__main__":
    _child()
