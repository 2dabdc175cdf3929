"""A real full disk: the embedded store on a small tmpfs (root only: skipped where `mount` is not allowed).

The writes run in a child process, so that a SIGBUS (what the engine's memory maps do on a full disk without the
check) fails this test instead of killing pytest. With DPR_MIN_FREE_MB-style checking the child stops with
``DiskFull`` between batches, every batch written before is intact, and after the filesystem grows the writes go
on from there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

WRITER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from services.core.errors import DiskFull
    from services.store import Store
    from services.store.edge.engine import EdgeEngine
    from services.store.points import CollectionSpec, Passage, PassagePoint

    root, min_free, batches, prefix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    store = Store(EdgeEngine(root, "c", idle_release=0, min_free_mb=min_free))
    rng = np.random.default_rng(0)
    written, error = 0, None
    try:
        store.ensure_collection(CollectionSpec(dim=384, distance="cosine", model="m@1", sparse=False))
        for b in range(batches):
            vectors = rng.normal(size=(500, 384))  # (batch, dim)
            text = "x" * 2000
            store.upsert([PassagePoint(Passage(doc_id=f"{prefix}{b}-{i}", chunk_index=0, text=text),
                                       dense=list(map(float, v))) for i, v in enumerate(vectors)])
            written += 500
    except DiskFull as e:
        error = str(e)
    print(json.dumps({"written": written, "count": store.count(), "error": error}))
    store.close()
""")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=320m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _write(root: Path, min_free_mb: int, batches: int, prefix: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", WRITER, str(root), str(min_free_mb), str(batches), prefix],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the writer died (exit {done.returncode}): {done.stderr[-600:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_full_disk_stops_writes_between_batches_and_nothing_is_lost(small_disk: Path) -> None:
    first = _write(small_disk / "store", 256, 400, "a")  # the default DPR_MIN_FREE_MB; 400 x 500 points do not fit
    assert first["error"] is not None and "disk full" in str(first["error"]), first
    assert str(small_disk) in str(first["error"]) and "MB free of 320 MB" in str(first["error"])
    assert first["count"] == first["written"] and int(first["written"]) > 0, "every batch before the stop is intact"
    subprocess.run(["mount", "-o", "remount,size=700m", str(small_disk)], check=True)
    again = _write(small_disk / "store", 256, 2, "b")
    assert again["error"] is None and again["count"] == int(first["written"]) + 1000, again
