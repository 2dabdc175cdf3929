"""``dpr serve`` as its own process for the HTTP benchmarks (bench_api.py, bench_load.py): started on a free
loopback port as a session leader (so the whole tree stops together), ready when ``/readyz`` answers 200.

Scripts run as ``python benchmarks/X.py`` (the benchmarks folder is then ``sys.path[0]``) and import it as
``from serve_process import ...``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

DPR = str(Path(sys.executable).with_name("dpr"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# `dpr` run from another checkout of the project (``code``): the venv's editable install of this checkout would
# answer every import otherwise, so its finder is dropped and the checkout goes first on the path.
OTHER_CODE = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
code = sys.argv.pop(1)
sys.path.insert(0, code)
import entrypoints
assert entrypoints.__file__.startswith(code), (entrypoints.__file__, code)  # that checkout's code answers
from entrypoints.cli.main import main
sys.argv[0] = "dpr"
sys.exit(main())
"""


def dpr_command(code: Path | None = None) -> list[str]:
    """The argv that runs `dpr`: this checkout's, or that of the checkout at ``code`` (a git worktree)."""
    return [DPR] if code is None else [sys.executable, "-c", OTHER_CODE, str(code)]


class ServeProcess:
    """``dpr serve --host 127.0.0.1 --port PORT`` with ``env``, its output in ``log``; ``code``: another checkout's
    `dpr` (``dpr_command``)."""

    def __init__(self, env: dict[str, str], log: Path, code: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [*dpr_command(code), "serve", "--host", "127.0.0.1", "--port", str(self.port), "--log-level",
                 "warning"],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def _log_tail(self) -> str:
        return self.log.read_text()[-3000:]

    def wait_ready(self, timeout: float = 300) -> float:
        """Seconds until ``/readyz`` answered 200; raises with the log's tail if the server exits or times out."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"dpr serve exited ({self.process.returncode}):\n{self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"dpr serve not ready after {timeout} s:\n{self._log_tail()}")

    def stop(self) -> None:
        """SIGTERM to the process group; SIGKILL if it has not exited within 60 s."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
