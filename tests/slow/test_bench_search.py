"""The search benchmark itself (benchmarks/bench_search.py) on a tiny collection: it runs to the end and its index
build lands while its writer thread writes, with every passage written kept. Speeds are not asserted (the
benchmark's job); this guards the script against the store's internals it times (the build's log line)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_bench_search_builds_under_writes_and_reports(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_search.py"), "--passages", "3000", "--queries", "5",
         "--threshold", "1000", "--writes-per-s", "400"],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("optimize:"))
    assert "swapped in: yes" in line, line
    written = int(re.search(r"(\d+) passages written", line).group(1))  # type: ignore[union-attr]
    assert written > 0 and f"{written} passages written (none lost)" in line, line
    assert re.search(r"\| dense \| HNSW \| [\d.]+ \|", done.stdout)
