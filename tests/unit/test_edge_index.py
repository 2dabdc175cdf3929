"""HNSW in the embedded engine: built off the lease on a copy, equal to the exact scan on the top 10 at high ef,
built once enough points arrived (``maybe_optimize``), never swapped over a write, recovered after a cut swap."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qdrant_edge import Query, QueryRequest, SearchParams

from services.store import Store
from services.store.engines import edge_index
from services.store.engines.edge import EdgeEngine
from services.store.points import DENSE, CollectionSpec, Passage, PassagePoint, SearchRequest

pytestmark = pytest.mark.unit

DIM = 32
SPEC = CollectionSpec(dim=DIM, distance="cosine", model="m@1", sparse=False)


def unit_vectors(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)  # (n, dim)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def store_with(root: Path, vectors: np.ndarray, threshold: int) -> Store:
    store = Store(EdgeEngine(root, "c", idle_release=5, index_threshold=threshold))
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
        shard = engine._shard("c__g0001")
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


def test_a_write_during_the_build_keeps_the_shard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_with(tmp_path, unit_vectors(1200, seed=6), threshold=1000)
    real_build = edge_index.build

    def build_while_writing(*args: Any) -> bool:
        add(store, unit_vectors(1, seed=7), start=5000)  # the lease is free while the graph is built
        return real_build(*args)

    monkeypatch.setattr(edge_index, "build", build_while_writing)
    assert store.optimize() is False  # the copy missed the write: dropped
    assert edge_index.segment_kinds(shard_dir(tmp_path)) == ["plain"]
    assert store.count() == 1201
    assert not (shard_dir(tmp_path).parent / edge_index.BUILD).exists()
    monkeypatch.setattr(edge_index, "build", real_build)
    assert store.optimize() is True
    assert store.count() == 1201
    store.close()


def test_a_swap_cut_between_its_renames_is_finished(tmp_path: Path) -> None:
    store = store_with(tmp_path, unit_vectors(50, seed=8), threshold=1000)
    store.close()
    gen = shard_dir(tmp_path).parent
    shutil.move(gen / edge_index.SHARD, gen / edge_index.NEXT)  # the crash: after "shard -> shard.old"
    reopened = Store(EdgeEngine(tmp_path, "c", idle_release=0))
    assert reopened.count() == 50
    assert (gen / edge_index.SHARD).is_dir() and not (gen / edge_index.NEXT).exists()
