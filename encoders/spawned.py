"""One call in a fresh (spawned) child process, its result or exception sent back (``call_in_child``). Used for
the ONNX export (``encoders.registry.export_model``), so a process that serves ONNX towers never imports torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def call_in_child(function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``function(*args)`` (the export) in a fresh (spawned) child process, so that a process which serves ONNX towers
    (``dpr serve``, a worker, ``dpr query``) never loads torch itself: torch stays resident for a process's life once
    imported (``dpr serve`` on a fresh data dir: 924 MB exporting in-process, 267 MB with the child). The child's
    exception, if any, is raised here. The child exits when its one call is done, whether or not this process is
    still there to hear the answer: a server killed mid-export leaves no process behind (a process pool's worker
    waited for the next call for ever, holding ~1 GB)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child_side, args=(send, function, args), name="dpr-onnx-export")
    child.start()
    send.close()  # the child holds the only write end: its exit is the end of the pipe
    try:
        ok, value = receive.recv()
    except EOFError:
        child.join()
        raise RuntimeError(f"the export child exited with code {child.exitcode} without an answer") from None
    finally:
        receive.close()
    child.join()
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _child_side(send: Any, function: Callable[..., dict[str, Any]], args: tuple[Any, ...]) -> None:
    """The child's side of ``call_in_child``: one call, its result or its exception sent back, then exit."""
    import pickle

    try:
        answer: tuple[bool, Any] = (True, function(*args))
    except Exception as e:
        try:
            pickle.dumps(e)
            answer = (False, e)
        except Exception:
            answer = (False, RuntimeError(f"{type(e).__name__}: {e}"))
    try:
        send.send(answer)
    except OSError:  # the parent is gone (killed mid-export): the export is made and cached all the same
        pass
    finally:
        send.close()
