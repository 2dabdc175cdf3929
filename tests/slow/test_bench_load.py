"""The load tool itself (benchmarks/bench_load.py) on a tiny collection: it starts `dpr serve` on a data dir, drives
it (wrk if installed, else its Python generator), and reports numbers that parse with 0 errors; a burst beyond a
tiny admission limit is shed with 503 + Retry-After. Speeds are not asserted (the benchmark's job)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "datadir-v1"


def test_bench_load_reports_zero_errors_and_a_shed_burst(tmp_path: Path, shared_data: Path) -> None:
    with tarfile.open(FIXTURE / "datadir.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")  # a real ingest's data dir (see its SOURCE.md)
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_load.py"), "--data-dir", str(tmp_path / "data"),
         "--clients", "2", "--duration", "2", "--batching", "on", "off", "--env", "DPR_SERVING__CACHE_SIZE=0",
         "--burst", "24", "--flood", "8", "--burst-seconds", "1", "--json",
         "--env", "DPR_API__MAX_IN_FLIGHT=1", "--env", "DPR_API__MAX_QUEUE=2", "--out", str(tmp_path / "load.md")],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    on, off = result["runs"]  # the same load against a server batching questions and one that does not
    for run in (on, off):
        assert run["errors"] == 0 and run["ok"] == run["requests"] > 0
        for key in ("qps", "p50_ms", "p99_ms", "peak_rss_mb"):
            assert float(run[key]) > 0, key
        assert run["p50_ms"] <= run["p99_ms"]
    assert on["batches"]["questions"] >= on["ok"] > 0  # every question went through the batcher (its own /metrics)
    assert off["batches"]["calls"] == 0
    for burst in result["bursts"]:  # batching on and off: overload is answered alike
        shed = burst["status"].get("503", 0) + burst["status"].get("429", 0)
        assert shed > 0 and burst["retry_after"] == shed  # every refusal says when to come back
        assert burst["status"].get("200", 0) > 0 and burst["socket_errors"]["failed"] == 0
    for flood in result["floods"]:  # the generator's clients resend at once: refusals all carry Retry-After too
        assert flood["retry_after"] == flood["status"].get("503", 0) + flood["status"].get("429", 0)
    table = (tmp_path / "load.md").read_text()
    assert "| burst," in table and "| flood," in table and "CPU:" in table
