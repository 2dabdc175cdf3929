"""Helpers for the API integration tests: the real app under a real uvicorn on a free loopback port.

- ``LiveServer``: uvicorn in a thread of the test process (so a session-loaded model can be shared);
- ``serve_subprocess``: ``dpr serve`` as its own process, the way a deployment runs it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

DPR = str(Path(sys.executable).with_name("dpr"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)


def wait_ready(url: str, timeout: float, process: subprocess.Popen[bytes] | None = None,
               log: Path | None = None) -> dict[str, Any]:
    """Poll /readyz until 200; returns its body."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log.read_text() if log else ''}")
        try:
            r = httpx.get(f"{url}/readyz", timeout=5)
            last = r.json()
            if r.status_code == 200:
                return dict(last)
        except httpx.TransportError as e:
            last = repr(e)
        time.sleep(0.1)
    raise RuntimeError(f"{url} not ready after {timeout} s; last answer: {last}\n{log.read_text() if log else ''}")


def wait_job(client: httpx.Client, job: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(f"/v1/jobs/{job}")
        r.raise_for_status()
        body = dict(r.json())
        if body["state"] in ("done", "failed"):
            return body
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job} still {body['state']} after {timeout} s: {body}")
        time.sleep(0.1)


class ServeProcess:
    """``dpr serve`` in its own process group; ``stop`` sends SIGTERM (graceful shutdown), then SIGKILL."""

    def __init__(self, env: dict[str, str], root: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / f"serve-{self.port}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [DPR, "serve", "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning",
                 *extra_args],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=root,
            )

    def stop(self) -> int | None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode
