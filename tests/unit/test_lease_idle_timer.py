"""The lease's idle timer (services/store/edge/lease_lifetime.IdleTimer): its thread wakes at deadlines, not at
every use of the lease (a wake-up per use took the GIL and the lease's mutex between two questions: 0.1-0.15 ms of a
3 ms `dpr query`), and it still fires once the uses stop."""

from __future__ import annotations

import threading
import time

import pytest

from services.store.edge.lease_lifetime import IdleTimer

pytestmark = pytest.mark.unit


class _CountingCondition(threading.Condition):
    def __init__(self, lock: threading.RLock) -> None:
        super().__init__(lock)
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def _timer(expired: list[float]) -> tuple[IdleTimer, threading.RLock, _CountingCondition]:
    mutex = threading.RLock()

    def look() -> bool:
        expired.append(time.monotonic())
        return False  # nothing kept: the timer disarms

    timer = IdleTimer(mutex, look)
    wake = _CountingCondition(mutex)
    timer._wake = wake  # the thread waits on this one (it is made before the first start)
    return timer, mutex, wake


def _use(timer: IdleTimer, mutex: threading.RLock, idle_release: float) -> None:
    """What ``ShardLease.held`` does around a run of calls: disarm at the start, re-arm at the end."""
    with mutex:
        timer.cancel()
    with mutex:
        timer.used(idle_release)
        timer.start()


def test_back_to_back_uses_do_not_wake_the_thread_each_time() -> None:
    expired: list[float] = []
    timer, mutex, wake = _timer(expired)
    for _ in range(200):  # a use every ~1 ms, as questions come: each re-arms the deadline (WAITER_GRACE, 10 ms)
        _use(timer, mutex, 0.5)
        time.sleep(0.001)
    # each gap over the deadline (a loaded machine) may cost one wake-up; every use did before
    assert wake.notified <= 50, f"the timer's thread was woken {wake.notified} times for 200 uses"


def test_the_timer_still_fires_after_the_last_use() -> None:
    expired: list[float] = []
    timer, mutex, _ = _timer(expired)
    for _ in range(50):
        _use(timer, mutex, 0.05)
    last = time.monotonic()
    deadline = last + 5
    while not any(t > last for t in expired) and time.monotonic() < deadline:
        time.sleep(0.01)
    after = [t for t in expired if t > last]  # a gap in the loop on a loaded machine may have run one before
    assert after, "the idle look never ran after the uses stopped"
    assert after[0] - last >= 0.009  # not before WAITER_GRACE (0.01 s) after the last use


def test_an_earlier_deadline_wakes_a_thread_sleeping_towards_a_later_one() -> None:
    expired: list[float] = []
    timer, mutex, wake = _timer(expired)
    with mutex:
        timer._arm(10.0)  # the thread sleeps towards 10 s from now
    time.sleep(0.05)
    start = time.monotonic()
    with mutex:
        timer._arm(0.02)  # sooner: it must be woken to re-time its sleep
    while not expired and time.monotonic() < start + 5:
        time.sleep(0.01)
    assert expired and expired[0] - start < 2, "the sooner deadline waited for the later one"
    assert wake.notified >= 1
