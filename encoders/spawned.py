"""One call in a fresh child process, its result or exception sent back (``call_in_child``). Used for
the ONNX export (``encoders.registry.export_model``), so a process that serves ONNX towers never imports torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def call_in_child(function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``function(*args)`` (the export) in a fresh child process, so that a process which serves ONNX towers
    (``dpr serve``, a worker, ``dpr query``) never loads torch itself: torch stays resident for a process's life once
    imported (``dpr serve`` on a fresh data dir: 924 MB exporting in-process, 267 MB with the child). The child's
    exception, if any, is raised here. The child exits when its one call is done, whether or not this process is
    still there to hear the answer: a server killed mid-export leaves no process behind (a process pool's worker
    waited for the next call for ever, holding ~1 GB).

    The child is a plain ``python -c`` process (``subprocess``), not a ``multiprocessing`` one: a Celery worker's
    pool process is daemonic, and a daemonic process may not start ``multiprocessing`` children, so every worker
    failed its export and encoded a new model with torch (3-5x slower). The call, with this process's
    ``sys.path`` so the child imports what this one can, goes in on the child's stdin; the answer comes back
    on a pipe of its own (the export's own output stays on the shared stdout / stderr)."""
    import os
    import pickle
    import subprocess
    import sys

    receive, send = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-c", _BOOT, str(send)], stdin=subprocess.PIPE, pass_fds=(send,))
    except BaseException:
        os.close(receive)
        raise
    finally:
        os.close(send)  # the child holds the only write end: its exit is the end of the pipe
    with os.fdopen(receive, "rb") as answers:
        try:
            assert child.stdin is not None
            child.stdin.write(pickle.dumps((list(sys.path), pickle.dumps((function, args)))))
            child.stdin.close()
        except BrokenPipeError:
            pass  # it died at once: the answer below is missing and says so
        data = answers.read()
    code = child.wait()
    if not data:
        raise RuntimeError(f"the export child exited with code {code} without an answer")
    ok, value = pickle.loads(data)
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


# The child's first lines: this process's import path, then the call (its function imported by reference).
_BOOT = (
    "import pickle, sys\n"
    "path, call = pickle.load(sys.stdin.buffer)\n"
    "sys.path[:] = path\n"
    "from encoders.spawned import _child_side\n"
    "_child_side(int(sys.argv[1]), call)\n"
)


def _child_side(fd: int, call: bytes) -> None:
    """The child's side of ``call_in_child``: one call, its result or its exception sent back, then exit."""
    import os
    import pickle

    try:
        function, args = pickle.loads(call)
        answer: tuple[bool, Any] = (True, function(*args))
    except Exception as e:
        try:
            pickle.dumps(e)
            answer = (False, e)
        except Exception:
            answer = (False, RuntimeError(f"{type(e).__name__}: {e}"))
    try:
        with os.fdopen(fd, "wb") as send:
            send.write(pickle.dumps(answer))
    except OSError:  # the parent is gone (killed mid-export): the export is made and cached all the same
        pass
