"""Memory levers at scale (docs/capacity.md): int8 scalar quantization with rescoring, vectors and payloads on disk,
HNSW m / ef. On a small random collection, for both engines: a quantized search with rescoring returns the exact
scan's top 10, the levers reach the engine (and survive the embedded engine's index build), and an on-disk
collection reopens and answers the same.

qdrant-client's in-process engine (the server adapter's stand-in here) searches exactly and ignores quantization,
so on it the tests check that the options are sent and accepted and that a persisted collection reopens; with
``QDRANT_URL`` set, a real server is asked too.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from qdrant_client import QdrantClient

from services.core.settings import Settings
from services.core.store_settings import EdgeSettings, QdrantSettings
from services.store import Store
from services.store.edge import index as edge_index
from services.store.edge.config import LEVERS_FILE, EdgeLevers, levers_from, search_params_from
from services.store.edge.engine import EdgeEngine
from services.store.edge.search import DenseSearch
from services.store.points import CollectionSpec, Passage, PassagePoint, SearchRequest
from services.store.server.engine import ServerEngine

DIM = 32
SPEC = CollectionSpec(dim=DIM, distance="cosine", model="m@1", sparse=False)
GEN = "c__g0001"
LEVERS = EdgeSettings(quantization="int8", vectors_on_disk=True, payload_on_disk=True, hnsw_m=16,
                      hnsw_ef_construct=100, hnsw_ef=512, rescore=True, oversampling=2.0)


def unit_vectors(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)  # (n, dim)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def points(vectors: np.ndarray) -> list[PassagePoint]:
    return [PassagePoint(Passage(doc_id=f"d{i}", chunk_index=0, text=f"passage {i}"), dense=v.tolist())
            for i, v in enumerate(vectors)]


def top10(store: Store, queries: np.ndarray) -> list[list[int]]:
    return [[int(h.passage.doc_id[1:]) for h in store.search(SearchRequest(dense=q.tolist(), k=10))] for q in queries]


def exact_top10(corpus: np.ndarray, queries: np.ndarray) -> list[list[int]]:
    return [row.tolist() for row in np.argsort(-(queries @ corpus.T), axis=1)[:, :10]]  # (queries, 10)


def edge_store(root: Path, settings: EdgeSettings, threshold: int = 1000) -> Store:
    return Store(EdgeEngine(root, "c", idle_release=5, index_threshold=threshold, levers=levers_from(settings),
                            search_params=search_params_from(settings)))


def built_edge_store(root: Path, settings: EdgeSettings, corpus: np.ndarray) -> Store:
    """An embedded collection of ``corpus`` with its HNSW graph built."""
    store = edge_store(root, settings)
    store.ensure_collection(SPEC)
    store.upsert(points(corpus))
    assert store.optimize() is True
    return store


def dense_segments(root: Path) -> list[dict[str, Any]]:
    shard = root / "c" / "generations" / GEN / edge_index.SHARD
    found = []
    for path in sorted((shard / "segments").glob("*/segment.json")):
        config = json.loads(path.read_text(encoding="utf-8"))["config"]
        found.append({**config["vector_data"]["dense"], "payload": config.get("payload_storage_type")})
    return found


# -- embedded engine ----------------------------------------------------------------------------------------------


@pytest.mark.unit
def test_edge_int8_with_rescoring_equals_the_exact_scan_after_the_index_build(tmp_path: Path) -> None:
    corpus, queries = unit_vectors(3000, seed=1), unit_vectors(20, seed=2)
    store = built_edge_store(tmp_path, LEVERS, corpus)
    segments = dense_segments(tmp_path)
    hnsw = [s for s in segments if s["index"]["type"] == "hnsw"]
    assert hnsw, segments  # a graph answers, not a scan
    for segment in hnsw:
        assert segment["quantization_config"]["scalar"]["type"] == "int8"
        assert "InRam" not in segment["storage_type"]  # the fp32 originals stayed on disk through the build
        assert segment["index"]["options"]["m"] == 16
    assert top10(store, queries) == exact_top10(corpus, queries)
    store.close()


@pytest.mark.unit
def test_edge_int8_without_rescoring_scores_from_the_quantized_copy(tmp_path: Path) -> None:
    """The lever is live: without rescoring the scores are int8 approximations, with it the fp32 cosines."""
    corpus, queries = unit_vectors(3000, seed=3), unit_vectors(10, seed=4)
    rough = built_edge_store(tmp_path, LEVERS.model_copy(update={"rescore": False, "oversampling": None}), corpus)
    errors = score_errors(rough, corpus, queries)
    rough.close()
    assert max(errors) > 1e-4  # quantized scores
    rescored = edge_store(tmp_path, LEVERS)
    assert max(score_errors(rescored, corpus, queries)) <= 1e-4  # fp32 scores
    rescored.close()


def score_errors(store: Store, corpus: np.ndarray, queries: np.ndarray) -> list[float]:
    """How far each top-10 hit's score is from its exact fp32 dot product."""
    exact = corpus @ queries.T  # (n, queries)
    return [abs(hit.score - float(exact[int(hit.passage.doc_id[1:]), j]))
            for j, q in enumerate(queries) for hit in store.search(SearchRequest(dense=q.tolist(), k=10))]


@pytest.mark.unit
def test_edge_on_disk_collection_reopens_and_answers_the_same(tmp_path: Path) -> None:
    corpus, queries = unit_vectors(2000, seed=5), unit_vectors(10, seed=6)
    store = built_edge_store(tmp_path, LEVERS, corpus)
    before = top10(store, queries)
    store.close()
    recorded = json.loads((tmp_path / "c" / "generations" / GEN / LEVERS_FILE).read_text(encoding="utf-8"))
    assert EdgeLevers.from_json(recorded) == levers_from(LEVERS)
    reopened = edge_store(tmp_path, LEVERS)
    assert reopened.count() == 2000
    assert top10(reopened, queries) == before == exact_top10(corpus, queries)
    assert all("InRam" not in s["storage_type"] for s in dense_segments(tmp_path))
    reopened.close()
    # a process whose settings name no quantization lever (none at all, or an ef only) still rescores the int8
    # generation: fp32 scores, not int8 ones
    for settings in (EdgeSettings(), EdgeSettings(hnsw_ef=256, hybrid_ef=128)):
        plain = edge_store(tmp_path, settings)
        assert max(score_errors(plain, corpus, queries)) <= 1e-4
        plain.close()


@pytest.mark.unit
def test_edge_levers_come_from_the_settings(tmp_path: Path) -> None:
    engine = EdgeEngine.from_settings(Settings(data_dir=tmp_path, edge=LEVERS))
    assert engine.levers == EdgeLevers("int8", True, True, 16, 100)
    params = engine.dense.search_params
    assert params is not None and params.hnsw_ef == 512
    assert params.quantization is not None and params.quantization.rescore is True
    assert params.quantization.oversampling == 2.0
    fused = engine.dense.fused_search_params
    assert fused is not None and fused.hnsw_ef == 512  # hybrid_ef unset
    plain = EdgeEngine.from_settings(Settings(data_dir=tmp_path))
    assert plain.levers == EdgeLevers() and plain.dense.search_params is None  # defaults: requests as before
    assert plain.dense.fused_search_params is None


@pytest.mark.unit
def test_the_dense_branch_of_a_hybrid_query_searches_with_hybrid_ef(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``hybrid_ef`` reaches the dense branch of hybrid queries (RRF in the engine, linear fusion here) and nothing
    else: a dense query keeps ``hnsw_ef``; the sparse branch has no params."""
    from services.store.points import SparseVector

    settings = EdgeSettings(hnsw_ef=512, hybrid_ef=128)
    engine = EdgeEngine.from_settings(Settings(data_dir=tmp_path, edge=settings))
    asked: list[tuple[str, bool, int | None]] = []
    params_of = DenseSearch.params

    def recording(self: DenseSearch, generation: str, branch: Any, fused: bool = False) -> Any:
        params = params_of(self, generation, branch, fused)
        asked.append((branch[0], fused, None if params is None else params.hnsw_ef))
        return params

    monkeypatch.setattr(DenseSearch, "params", recording)
    store = Store(engine)
    store.ensure_collection(CollectionSpec(dim=DIM, distance="cosine", model="m@1", sparse=True))
    vectors = unit_vectors(20, seed=15)
    store.upsert([PassagePoint(Passage(doc_id=f"d{i}", chunk_index=0, text=f"passage {i}"), dense=v.tolist(),
                               sparse=SparseVector(indices=[i % 3], values=[1.0])) for i, v in enumerate(vectors)])
    question = {"dense": vectors[0].tolist(), "sparse": SparseVector(indices=[0], values=[1.0]), "k": 3}
    for request in (SearchRequest(mode="dense", **question), SearchRequest(mode="hybrid", **question),
                    SearchRequest(mode="hybrid", fusion="linear", **question)):
        asked.clear()
        assert store.search(request)
        by_branch = {name: (fused, ef) for name, fused, ef in asked}
        if request.mode == "dense":
            assert by_branch == {"dense": (False, 512)}
        else:
            assert by_branch == {"dense": (True, 128), "bm25": (True, None)}, request.fusion
    store.close()
    assert search_params_from(settings, fused=True).hnsw_ef == 128  # type: ignore[union-attr]
    assert search_params_from(settings).hnsw_ef == 512  # type: ignore[union-attr]


# -- server adapter (qdrant-client) -------------------------------------------------------------------------------

SERVER_LEVERS = QdrantSettings(quantization="int8", on_disk_vectors=True, on_disk_payload=True, hnsw_ef=256,
                               rescore=True, oversampling=2.0)


# the in-process engine warns that it searches exactly whatever the params say; a server uses them
LOCAL_EXACT = pytest.mark.filterwarnings("ignore:Local mode performs exact")


class Recording:
    """The real client, with the arguments of collection creation and searches kept."""

    def __init__(self, client: QdrantClient) -> None:
        self._client = client
        self.created: list[dict[str, Any]] = []
        self.searched: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def create_collection(self, *args: Any, **kwargs: Any) -> Any:
        self.created.append(kwargs)
        return self._client.create_collection(*args, **kwargs)

    def query_points(self, *args: Any, **kwargs: Any) -> Any:
        self.searched.append(kwargs.get("search_params"))
        return self._client.query_points(*args, **kwargs)


@pytest.mark.unit
@LOCAL_EXACT
def test_server_levers_are_sent_and_answers_equal_the_exact_scan() -> None:
    corpus, queries = unit_vectors(500, seed=7), unit_vectors(10, seed=8)
    client = Recording(QdrantClient(":memory:"))
    store = Store(ServerEngine(client, "c", SERVER_LEVERS))  # type: ignore[arg-type]
    generation = store.ensure_collection(SPEC)
    store.upsert(points(corpus))
    [sent] = client.created
    assert sent["quantization_config"].scalar.type.value == "int8"
    assert sent["on_disk_payload"] is True
    vectors = client.get_collection(generation).config.params.vectors
    assert isinstance(vectors, dict) and vectors["dense"].on_disk is True
    assert top10(store, queries) == exact_top10(corpus, queries)
    params = client.searched[-1]
    assert params.hnsw_ef == 256 and params.quantization.rescore is True and params.quantization.oversampling == 2.0
    store.close()


@pytest.mark.unit
def test_server_hybrid_ef_is_the_dense_branch_of_hybrid_queries_only() -> None:
    from services.store.points import SparseVector

    engine = ServerEngine(QdrantClient(":memory:"), "c", SERVER_LEVERS.model_copy(update={"hybrid_ef": 128}))
    dense = [0.0] * DIM
    assert engine._search_params(dense).hnsw_ef == 256  # type: ignore[union-attr]
    assert engine._search_params(dense, fused=True).hnsw_ef == 128  # type: ignore[union-attr]
    assert engine._search_params(SparseVector(indices=[1], values=[1.0]), fused=True) is None
    unset = ServerEngine(QdrantClient(":memory:"), "c", SERVER_LEVERS)
    assert unset._search_params(dense, fused=True).hnsw_ef == 256  # type: ignore[union-attr]


@pytest.mark.unit
def test_server_defaults_send_no_search_params() -> None:
    client = Recording(QdrantClient(":memory:"))
    store = Store(ServerEngine(client, "c"))  # type: ignore[arg-type]
    store.ensure_collection(SPEC)
    store.upsert(points(unit_vectors(50, seed=9)))
    store.search(SearchRequest(dense=unit_vectors(1, seed=10)[0].tolist(), k=5))
    assert client.searched == [None] and "on_disk_payload" not in client.created[0]


@pytest.mark.unit
@LOCAL_EXACT
def test_server_on_disk_collection_reopens_and_answers_the_same(tmp_path: Path) -> None:
    """qdrant-client's persisted local mode stands in for a server restart (it keeps ``on_disk``)."""
    corpus, queries = unit_vectors(300, seed=11), unit_vectors(5, seed=12)
    store = Store(ServerEngine(QdrantClient(path=str(tmp_path)), "c", SERVER_LEVERS, owns_client=True))
    generation = store.ensure_collection(SPEC)
    store.upsert(points(corpus))
    before = top10(store, queries)
    store.close()
    client = QdrantClient(path=str(tmp_path))
    reopened = Store(ServerEngine(client, "c", SERVER_LEVERS, owns_client=True))
    vectors = client.get_collection(generation).config.params.vectors
    assert isinstance(vectors, dict) and vectors["dense"].on_disk is True
    assert top10(reopened, queries) == before == exact_top10(corpus, queries)
    reopened.close()


@pytest.mark.integration
@pytest.mark.skipif(not os.environ.get("QDRANT_URL"), reason="needs a real Qdrant server at $QDRANT_URL")
def test_real_server_int8_with_rescoring_equals_the_exact_scan() -> None:
    corpus, queries = unit_vectors(3000, seed=13), unit_vectors(20, seed=14)
    client = QdrantClient(url=os.environ["QDRANT_URL"])
    alias = f"dpr_test_{uuid.uuid4().hex[:8]}"
    store = Store(ServerEngine(client, alias, SERVER_LEVERS.model_copy(update={"hnsw_ef": 512})))
    generation = store.ensure_collection(SPEC)
    try:
        store.upsert(points(corpus))
        config = client.get_collection(generation).config
        assert config.quantization_config is not None and config.params.on_disk_payload is True
        assert top10(store, queries) == exact_top10(corpus, queries)
    finally:
        for name in store.engine.generations():
            client.delete_collection(name)
        client.close()


def payload_index_memory(root: Path) -> dict[str, Any]:
    """Each payload index's memory placement (``"Memory.Cold"``, ``"None"``: in RAM), from the closed shard of
    ``GEN``."""
    from qdrant_edge import EdgeShard

    shard = EdgeShard.load(str(root / "c" / "generations" / GEN / edge_index.SHARD))
    try:
        return {key: str(getattr(index.params, "memory", None)) for key, index in shard.info().payload_schema.items()}
    finally:
        shard.close()


@pytest.mark.unit
def test_edge_payload_indexes_are_memory_mapped_and_an_index_build_moves_old_ones(tmp_path: Path) -> None:
    """In RAM, payload indexes are rebuilt at every load of the shard (a serving process's stall at each swap);
    a generation made before they were memory-mapped gets them moved by its next index build."""
    from qdrant_edge import EdgeShard, Memory, PayloadSchemaType, UpdateOperation

    from services.store.points import INDEXED_INTEGERS, INDEXED_KEYWORDS

    corpus = unit_vectors(2000, seed=7)
    store = edge_store(tmp_path, EdgeSettings())
    store.ensure_collection(SPEC)
    store.upsert(points(corpus[:1000]))
    store.close()
    placed = payload_index_memory(tmp_path)
    assert set(placed) == {*INDEXED_KEYWORDS, *INDEXED_INTEGERS}
    assert set(placed.values()) == {str(Memory.Cold)}
    # the generation as it was made before: the engine's in-RAM indexes
    shard = EdgeShard.load(str(tmp_path / "c" / "generations" / GEN / edge_index.SHARD))
    for keys, kind in ((INDEXED_KEYWORDS, PayloadSchemaType.Keyword), (INDEXED_INTEGERS, PayloadSchemaType.Integer)):
        for key in keys:
            shard.update(UpdateOperation.delete_field_index(key))
            shard.update(UpdateOperation.create_field_index(key, kind))
    shard.close()
    assert str(Memory.Cold) not in set(payload_index_memory(tmp_path).values())
    store = edge_store(tmp_path, EdgeSettings())
    store.upsert(points(corpus))
    assert store.optimize() is True
    assert store.delete_documents(["d3", "d1500"]) == 2  # a filter by doc_id through the moved index
    assert store.count() == 1998
    store.close()
    assert set(payload_index_memory(tmp_path).values()) == {str(Memory.Cold)}
