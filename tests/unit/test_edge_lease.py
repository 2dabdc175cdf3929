"""The embedded engine's own behaviour, in one process: the lease, the files on disk, what ``optimize`` does.

The multi-process lease is in ``tests/integration/test_edge_locking.py``; the behaviour every engine shares is the
contract suite (``tests/contract/``).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from services.store import Store
from services.store.edge.engine import EdgeEngine
from services.store.points import CollectionSpec, Passage, PassagePoint, SearchRequest

pytestmark = pytest.mark.unit

SPEC = CollectionSpec(dim=4, distance="cosine", model="m@1", sparse=False)


def edge_store(root: Path, *, lock_timeout: float = 120.0, idle_release: float = 0.5) -> Store:
    return Store(EdgeEngine(root, "c", lock_timeout=lock_timeout, idle_release=idle_release))


def points(prefix: str, n: int, seed: int = 0) -> list[PassagePoint]:
    rng = np.random.default_rng(seed)
    return [
        PassagePoint(Passage(doc_id=f"{prefix}{i}", chunk_index=0, text=f"{prefix} {i}"), dense=list(map(float, v)))
        for i, v in enumerate(rng.normal(size=(n, SPEC.dim)))  # (n, dim)
    ]


def _lock_is_free(lock_file: Path) -> bool:
    fd = os.open(lock_file, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the descriptor drops our probe lock too
    return True


def test_keeps_the_shard_while_busy_and_releases_when_idle(tmp_path: Path) -> None:
    store = edge_store(tmp_path, lock_timeout=5, idle_release=0.2)
    gen = store.ensure_collection(SPEC)
    lock_file = tmp_path / "c" / "locks" / f"{gen}.lock"  # the generation's lock
    store.upsert(points("d", 6))
    assert not _lock_is_free(lock_file)  # held for idle_release after the last call
    assert f"pid {os.getpid()}" in lock_file.read_text()
    deadline = time.monotonic() + 5
    while not _lock_is_free(lock_file) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _lock_is_free(lock_file)
    assert store.count() == 6  # reopens transparently; writes were flushed before the release
    store.close()
    assert _lock_is_free(lock_file)  # close() releases at once


def test_threads_and_sibling_stores_share_one_lease(tmp_path: Path) -> None:
    first = edge_store(tmp_path, lock_timeout=2, idle_release=5)
    second = edge_store(tmp_path, lock_timeout=2, idle_release=5)  # same directory, same process
    first.ensure_collection(SPEC)

    def write(worker: int) -> None:
        store = first if worker % 2 else second
        for p in points(f"t{worker}-", 5, seed=worker):
            store.upsert([p])
            store.search(SearchRequest(dense=p.dense, k=2))

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(write, range(4)))
    assert first.count() == second.count() == 20
    first.close()
    second.close()


def test_pointer_and_spec_files(tmp_path: Path) -> None:
    store = edge_store(tmp_path, idle_release=0)
    gen = store.ensure_collection(SPEC)
    root = tmp_path / "c"
    assert (root / "CURRENT").read_text().strip() == gen
    assert CollectionSpec.from_json(json.loads((root / "generations" / gen / "spec.json").read_text())) == SPEC
    assert (root / "generations" / gen / "shard").is_dir()
    assert not list(root.glob(".*.tmp"))  # atomic writes leave no temp files behind


def test_looking_at_a_missing_collection_creates_nothing(tmp_path: Path) -> None:
    store = edge_store(tmp_path, idle_release=0)
    assert store.active() is None and store.info().generations == []
    assert not (tmp_path / "c").exists()


def test_a_half_made_generation_is_skipped_not_reused(tmp_path: Path) -> None:
    store = edge_store(tmp_path, idle_release=0)
    g1 = store.ensure_collection(SPEC)
    (tmp_path / "c" / "generations" / "c__g0002").mkdir()  # a crash after mkdir, before spec.json
    assert [g.name for g in store.info().generations] == [g1]
    assert store.create_generation(SPEC) == "c__g0003"


def test_optimize_vacuums_deleted_points_once(tmp_path: Path) -> None:
    """Qdrant's vacuum runs on a segment of >= 1000 vectors with >= 20 % deleted: optimize does it now, once."""
    store = edge_store(tmp_path, idle_release=5)
    store.ensure_collection(SPEC)
    kept = points("d", 1500)
    for start in range(0, len(kept), 250):
        store.upsert(kept[start : start + 250])
    assert store.optimize() is False  # nothing deleted, too small to index: already optimal
    assert store.delete_documents([f"d{i}" for i in range(900)]) == 900
    assert store.optimize() is True  # the vacuum ran
    assert store.optimize() is False  # and left nothing to do
    assert store.count() == 600
    probe = kept[1200]
    assert store.search(SearchRequest(dense=probe.dense, k=1))[0].passage.doc_id == "d1200"
    store.close()
