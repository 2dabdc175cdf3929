"""HNSW in the embedded engine: built off the lease on a copy, equal to the exact scan on the top 10 at high ef,
built once enough points arrived (``maybe_optimize``), swapped in with the writes made during the build replayed
(or dropped when the journal cannot be trusted), recovered after a cut swap."""

from __future__ import annotations

import mmap
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qdrant_edge import Query, QueryRequest, SearchParams

from services.core import fsutil
from services.store import Store
from services.store.edge import index as edge_index
from services.store.edge import journal as edge_journal
from services.store.edge.config import indexed_points
from services.store.edge.engine import EdgeEngine
from services.store.points import DENSE, CollectionSpec, Passage, PassagePoint, SearchRequest

pytestmark = pytest.mark.unit

DIM = 32
SPEC = CollectionSpec(dim=DIM, distance="cosine", model="m@1", sparse=False)


def unit_vectors(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)  # (n, dim)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def store_with(root: Path, vectors: np.ndarray, threshold: int, idle_release: float = 5) -> Store:
    store = Store(EdgeEngine(root, "c", idle_release=idle_release, index_threshold=threshold))
    store.ensure_collection(SPEC)
    add(store, vectors, start=0)
    return store


def add(store: Store, vectors: np.ndarray, start: int) -> None:
    store.upsert([
        PassagePoint(Passage(doc_id=f"d{start + i}", chunk_index=0, text=f"passage {start + i}"), dense=v.tolist())
        for i, v in enumerate(vectors)
    ])


def shard_dir(root: Path) -> Path:
    return root / "c" / "generations" / "c__g0001" / "shard"


def engine_top(store: Store, query: np.ndarray, params: SearchParams) -> list[int]:
    engine = store.engine
    assert isinstance(engine, EdgeEngine)
    with engine.session():
        shard = engine.shard("c__g0001")
        points = shard.query(QueryRequest(limit=10, query=Query.Nearest(query.tolist(), using=DENSE), params=params,
                                          with_payload=True))
    return [int(str(p.payload["doc_id"])[1:]) for p in points]


def test_hnsw_after_optimize_matches_the_exact_scan(tmp_path: Path) -> None:
    corpus, queries = unit_vectors(3000, seed=1), unit_vectors(20, seed=2)
    store = store_with(tmp_path, corpus, threshold=1000)
    assert edge_index.segment_kinds(shard_dir(tmp_path)) == ["plain"]
    assert store.optimize() is True
    assert "hnsw" in edge_index.segment_kinds(shard_dir(tmp_path))  # a graph now answers, not a scan
    assert store.count() == 3000
    brute = np.argsort(-(queries @ corpus.T), axis=1)[:, :10]  # (queries, 10)
    found = 0
    for q, truth in zip(queries, brute, strict=True):
        assert engine_top(store, q, SearchParams(hnsw_ef=512)) == engine_top(store, q, SearchParams(exact=True))
        assert engine_top(store, q, SearchParams(exact=True)) == truth.tolist()
        hits = store.search(SearchRequest(dense=q.tolist(), k=10))  # the product path, default ef
        found += len({int(h.passage.doc_id[1:]) for h in hits} & set(truth.tolist()))
    assert found / brute.size >= 0.95
    assert store.optimize() is False  # nothing left to do
    store.close()


def test_maybe_optimize_builds_once_per_threshold_of_new_points(tmp_path: Path) -> None:
    store = store_with(tmp_path, unit_vectors(800, seed=3), threshold=1000)
    assert store.maybe_optimize() is False  # below the threshold: an exact scan is fine
    add(store, unit_vectors(400, seed=4), start=800)
    assert store.maybe_optimize() is True
    assert store.maybe_optimize() is False  # built for these points already
    add(store, unit_vectors(1000, seed=5), start=1200)
    assert store.maybe_optimize() is True
    info = store.index_info()
    assert info["points"] == 2200 and info["hnsw_segments"] >= 1
    store.close()


def test_maybe_optimize_without_a_collection_does_nothing(tmp_path: Path) -> None:
    assert Store(EdgeEngine(tmp_path, "c", index_threshold=10)).maybe_optimize() is False


def gen_dir(root: Path) -> Path:
    return shard_dir(root).parent


def during_the_build(monkeypatch: pytest.MonkeyPatch, act: Any) -> None:
    """Run ``act()`` once the build's child has started (the lease is free while it builds)."""
    real_built = edge_index.BuildChild.built

    def built(child: edge_index.BuildChild) -> bool:
        act()
        return real_built(child)

    monkeypatch.setattr(edge_index.BuildChild, "built", built)


def doc_ids(store: Store) -> set[str]:
    return set(store.documents())


def assert_no_leftovers(root: Path) -> None:
    assert not (gen_dir(root) / edge_index.BUILD).exists()
    assert not (gen_dir(root) / edge_journal.JOURNAL).exists()


def test_writes_during_the_build_are_replayed_onto_the_built_copy(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_with(tmp_path, unit_vectors(1200, seed=6), threshold=1000)

    def write() -> None:
        add(store, unit_vectors(3, seed=7), start=5000)
        store.delete_documents(["d5"])
        add(store, unit_vectors(1, seed=8), start=6000)

    during_the_build(monkeypatch, write)
    assert store.optimize() is True  # swapped in, not dropped for the writes
    assert "hnsw" in edge_index.segment_kinds(shard_dir(tmp_path))
    ids = doc_ids(store)
    assert len(ids) == 1203 and "d5" not in ids and {"d5000", "d5001", "d5002", "d6000"} <= ids
    hit = store.search(SearchRequest(dense=unit_vectors(1, seed=8)[0].tolist(), k=1))[0]
    assert hit.passage.doc_id == "d6000" and hit.score == pytest.approx(1.0, abs=1e-4)  # its vector came through
    assert_no_leftovers(tmp_path)
    assert indexed_points(gen_dir(tmp_path)) == 1200  # the replayed points are not in the graph yet
    store.close()


def test_a_broken_journal_drops_the_copy_and_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_with(tmp_path, unit_vectors(1200, seed=9), threshold=1000)

    def write_then_break() -> None:
        add(store, unit_vectors(2, seed=10), start=5000)
        with (gen_dir(tmp_path) / edge_journal.JOURNAL).open("r+b") as f:
            f.seek(20)
            f.write(b"garbage")

    during_the_build(monkeypatch, write_then_break)
    assert store.optimize() is False
    assert edge_index.segment_kinds(shard_dir(tmp_path)) == ["plain"] and store.count() == 1202
    assert_no_leftovers(tmp_path)
    monkeypatch.undo()
    assert store.optimize() is True and store.count() == 1202
    store.close()


def test_a_write_the_journal_missed_drops_the_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the shard stays open in this process however long the build takes (the count is checked where it is open;
    # with a 5 s idle release a slow build closed it first and the copy was trusted)
    store = store_with(tmp_path, unit_vectors(1200, seed=11), threshold=1000, idle_release=3600)
    monkeypatch.setattr(edge_journal, "record", lambda *a: None)  # a writer that journals nothing

    during_the_build(monkeypatch, lambda: add(store, unit_vectors(1, seed=12), start=5000))
    assert store.optimize() is False  # the copy would have lost d5000
    assert store.count() == 1201 and "d5000" in doc_ids(store)
    assert_no_leftovers(tmp_path)
    store.close()


def test_a_journal_its_builder_left_is_removed_by_the_next_write(tmp_path: Path) -> None:
    store = store_with(tmp_path, unit_vectors(10, seed=13), threshold=1000)
    with edge_journal.opened(gen_dir(tmp_path)):
        add(store, unit_vectors(1, seed=14), start=100)
        assert (gen_dir(tmp_path) / edge_journal.JOURNAL).stat().st_size > 0  # journaled while a builder lives
        shutil.copy(gen_dir(tmp_path) / edge_journal.JOURNAL, tmp_path / "left")
    shutil.copy(tmp_path / "left", gen_dir(tmp_path) / edge_journal.JOURNAL)  # as a killed builder leaves it
    add(store, unit_vectors(1, seed=15), start=200)
    assert not (gen_dir(tmp_path) / edge_journal.JOURNAL).exists()  # stale: removed, not grown
    assert store.count() == 12
    store.close()


def test_a_build_lands_under_writes_that_never_pause(tmp_path: Path) -> None:
    store = store_with(tmp_path, unit_vectors(3000, seed=16), threshold=1000)
    done, written = threading.Event(), []

    def writer() -> None:
        while not done.is_set():
            add(store, unit_vectors(1, seed=100 + len(written)), start=10_000 + len(written))
            written.append(1)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        swapped = store.optimize()
    finally:
        done.set()
        thread.join()
    assert swapped is True
    assert len(written) > 0 and store.count() == 3000 + len(written)
    assert "hnsw" in edge_index.segment_kinds(shard_dir(tmp_path))
    assert_no_leftovers(tmp_path)
    store.close()


def test_a_swap_cut_between_its_renames_is_finished(tmp_path: Path) -> None:
    store = store_with(tmp_path, unit_vectors(50, seed=8), threshold=1000)
    store.close()
    gen = shard_dir(tmp_path).parent
    shutil.move(gen / edge_index.SHARD, gen / edge_index.NEXT)  # the crash: after "shard -> shard.old"
    reopened = Store(EdgeEngine(tmp_path, "c", idle_release=0))
    assert reopened.count() == 50
    assert (gen / edge_index.SHARD).is_dir() and not (gen / edge_index.NEXT).exists()


def test_the_copy_under_the_lease_takes_only_what_changed_since_the_copy_before_it(tmp_path: Path) -> None:
    src, dst = tmp_path / "shard", tmp_path / "shard.build"
    (src / "segments" / "sealed").mkdir(parents=True)
    (src / "wal").mkdir()
    files = {"segments/sealed/vectors": b"v" * 5000, "segments/sealed/tracker": b"t" * 4096, "wal/open-1": b"w",
             "gone": b"g", "fresh": b"f"}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    with (src / "segments/sealed/tracker").open("r+b") as f, mmap.mmap(f.fileno(), 0) as mapped:
        mapped[0:1] = b"1"  # a store through a map, its page not written back when the copy looks at it
        for rel in set(files) - {"fresh"}:  # a minute old; "fresh" was written just now
            os.utime(src / rel, (time.time() - 60, time.time() - 60))
        noted = fsutil.copy_tree_changed(src, dst, settle=True)  # off the lease, the shard in use
        assert (dst / "segments/sealed/tracker").read_bytes() == b"1" + b"t" * 4095
        mapped[1:2] = b"2"  # the same page again, after the copy read it
    for rel in ("segments/sealed/vectors", "fresh"):
        (dst / rel).write_bytes(b"copied before")  # stays if not copied again
    (src / "wal/open-1").write_bytes(b"w2")
    (src / "gone").unlink()
    (src / "segments/new").mkdir()
    (src / "segments/new/x").write_bytes(b"x")

    fsutil.copy_tree_changed(src, dst, noted)  # under the lease: the files changed since
    assert (dst / "segments/sealed/vectors").read_bytes() == b"copied before"  # sealed: not copied again
    assert (dst / "wal/open-1").read_bytes() == b"w2" and (dst / "segments/new/x").read_bytes() == b"x"
    assert (dst / "fresh").read_bytes() == b"f"  # its mtime too near the look to trust: copied again
    assert not (dst / "gone").exists()
    if fsutil.tracks_mapped_writes(tmp_path):  # disk file systems: the store after the write-back moved its mtime
        assert (dst / "segments/sealed/tracker").read_bytes() == b"12" + b"t" * 4094


def test_a_first_build_makes_one_graph_per_segment_and_a_later_one_adds_without_merging(tmp_path: Path) -> None:
    """``DPR_EDGE__SEGMENTS=3`` (one per core where unset), each part at least 10 x the index threshold: the first
    build writes the copy anew into three graphs (qdrant-edge never splits its one appendable segment), every point,
    payload and payload index kept; the next build indexes its new points beside them instead of merging all into one
    graph built again (what the engine's own optimizer defaults did: ``edge_config``)."""
    from services.store.edge.config import EdgeLevers
    from services.store.points import INDEXED_INTEGERS, INDEXED_KEYWORDS

    corpus, queries = unit_vectors(3000, seed=11), unit_vectors(20, seed=12)
    store = Store(EdgeEngine(tmp_path, "c", index_threshold=100, levers=EdgeLevers(segments=3)))
    store.ensure_collection(SPEC)
    add(store, corpus, start=0)
    assert store.optimize() is True
    assert edge_index.segment_kinds(shard_dir(tmp_path)).count("hnsw") == 3
    assert not (gen_dir(tmp_path) / edge_index.PARTS).exists()
    assert store.search_ef("c__g0001")["graphs"] == 3  # `dpr status`: "3 graphs searched side by side"
    assert store.count() == 3000 and len(doc_ids(store)) == 3000
    brute = np.argsort(-(queries @ corpus.T), axis=1)[:, :10]  # (queries, 10)
    for q, truth in zip(queries, brute, strict=True):
        assert engine_top(store, q, SearchParams(hnsw_ef=512)) == truth.tolist()  # the three graphs, merged
    hits = store.search(SearchRequest(dense=queries[0].tolist(), k=10, filters={"doc_id": "d17"}))
    assert [h.passage.text for h in hits] == ["passage 17"]
    with store.engine.session():  # type: ignore[attr-defined]
        schema = store.engine.shard("c__g0001").info().payload_schema  # type: ignore[attr-defined]
    assert {*INDEXED_KEYWORDS, *INDEXED_INTEGERS} <= set(schema)  # the payload indexes, made anew
    add(store, unit_vectors(1500, seed=13), start=3000)
    assert store.optimize() is True
    assert edge_index.segment_kinds(shard_dir(tmp_path)).count("hnsw") == 4  # the new points' own graph
    assert store.count() == 4500
    store.close()
