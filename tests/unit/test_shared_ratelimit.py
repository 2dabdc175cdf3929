"""One rate per key across a server's processes and restarts: the SQLite buckets under DATA_DIR are shared by every
limiter that opens the file, outlive the process, forget buckets that are full again, and a shared store that fails
leaves the limiting to the process's own buckets for a while. (Processes and Redis: tests/integration/
test_shared_ratelimit.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from services.access import AccessGate
from services.access.ratelimit import RATE_FILE, RateLimiter, SqliteBuckets
from services.core.settings import ApiSettings, Settings

pytestmark = pytest.mark.unit


def test_two_limiters_on_one_file_share_a_key_s_bucket_and_a_restart_keeps_it(tmp_path: Path) -> None:
    now = [1000.0]
    a = RateLimiter(2.0, 4, buckets=SqliteBuckets(tmp_path / RATE_FILE, clock=lambda: now[0]))
    b = RateLimiter(2.0, 4, buckets=SqliteBuckets(tmp_path / RATE_FILE, clock=lambda: now[0]))
    assert [a.take("key:k1"), b.take("key:k1"), a.take("key:k1"), b.take("key:k1")] == [0.0] * 4  # the burst, once
    assert a.take("key:k1") == pytest.approx(0.5) and b.take("key:k1") == pytest.approx(0.5)
    assert b.take("key:k2") == 0.0  # another key, its own bucket
    restarted = RateLimiter(2.0, 4, buckets=SqliteBuckets(tmp_path / RATE_FILE, clock=lambda: now[0]))
    assert restarted.take("key:k1") > 0  # still empty after a restart within the window
    now[0] += 1.0  # two tokens come back
    assert [restarted.take("key:k1"), a.take("key:k1"), b.take("key:k1")][:2] == [0.0, 0.0]


def test_buckets_full_again_are_pruned(tmp_path: Path) -> None:
    now = [0.0]
    buckets = SqliteBuckets(tmp_path / RATE_FILE, clock=lambda: now[0])
    buckets.PRUNE_EVERY = 3
    limiter = RateLimiter(10.0, 1, buckets=buckets)
    limiter.take("client:a")
    limiter.take("client:b")
    now[0] += 1.0  # both full again
    limiter.take("client:c")  # the third take prunes
    assert buckets._open().execute("SELECT key FROM buckets").fetchall() == [("client:c",)]


class Broken:
    def __init__(self) -> None:
        self.calls = 0

    def take(self, key: str, rate: float, burst: float) -> float:
        self.calls += 1
        raise ConnectionError("broker down")


def test_a_failing_shared_store_leaves_limiting_to_the_process(caplog: pytest.LogCaptureFixture) -> None:
    broken = Broken()
    limiter = RateLimiter(1.0, 2, buckets=broken)
    assert [limiter.take("key:k"), limiter.take("key:k")] == [0.0, 0.0]
    assert limiter.take("key:k") > 0  # the process's own bucket still limits
    assert broken.calls == 1  # tried once, then left alone for a while
    assert "limiting this process alone" in caplog.text


def test_the_api_gate_keeps_its_buckets_in_the_data_dir(tmp_path: Path) -> None:
    gate = AccessGate.from_settings(Settings(data_dir=tmp_path, api=ApiSettings(api_key="s3cret", rate_limit=1.0,
                                                                                 rate_burst=1)))
    assert gate.decide(b"s3cret", "read", None, "127.0.0.1").status == 0
    assert (tmp_path / RATE_FILE).is_file()
    again = AccessGate.from_settings(Settings(data_dir=tmp_path, api=ApiSettings(api_key="s3cret", rate_limit=1.0,
                                                                                  rate_burst=1)))
    refused = again.decide(b"s3cret", "read", None, "127.0.0.1")  # a restarted server: the same bucket, empty
    assert refused.status == 429 and refused.retry_after > 0
