"""The store contract: one suite every engine meets through the ``Store`` front end (``StoreContract``).

Reusable: a test module subclasses ``StoreContract`` and provides an ``engine_factory`` fixture (a callable that
opens an ``Engine`` on the same collection each time it is called, so a second call "reopens" it); every test
then runs through ``Store(engine_factory())``. ``tests/contract/test_store_engines.py`` runs it against the
embedded engine, qdrant-client's in-process engine and, when ``QDRANT_URL`` is set, a real Qdrant server.

Vectors are fixed random numpy vectors (no model); sparse vectors come from the real BM25 embedder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from services.core.errors import CollectionNotFound, ConfigError, ModelMismatch
from services.store import Store, VectorStore
from services.store.points import CollectionSpec, Passage, PassagePoint, SearchRequest
from services.store.protocol import Engine
from services.store.sparse import default_embedder

DIM = 8
MODEL = "towers-a@1111"
OTHER_MODEL = "towers-b@2222"
SPEC = CollectionSpec(dim=DIM, distance="cosine", model=MODEL, sparse=True)

TEXTS = [
    "The quick brown fox jumps over the lazy dog",
    "Dense passage retrieval encodes questions and passages with two towers",
    "BM25 ranks documents by term frequency and inverse document frequency",
    "Qdrant stores vectors with payloads and supports filtering",
    "Reciprocal rank fusion combines several ranked lists",
    "Photosynthesis converts light energy into chemical energy in plants",
]

EngineFactory = Callable[[], Engine]
Factory = Callable[[], VectorStore]


def point_ids(store: VectorStore, generation: str | None = None) -> set[str]:
    """Every point id of a generation (the active one by default), read back through ``scroll``."""
    return {p.id for batch in store.scroll(generation=generation) for p in batch}


def passage(doc: str, chunk: int, text: str, doc_hash: str = "h1", model: str = MODEL, **meta: object) -> Passage:
    return Passage(
        doc_id=doc,
        chunk_index=chunk,
        text=text,
        title=doc.upper(),
        doc_hash=doc_hash,
        source=f"/data/{doc}.txt",
        ingested_at="2024-01-01T00:00:00Z",
        model=model,
        metadata=dict(meta),
    )


def point(p: Passage, vector: np.ndarray, sparse: bool = True) -> PassagePoint:
    return PassagePoint(
        passage=p,
        dense=[float(x) for x in vector],
        sparse=default_embedder().embed_document(p.text) if sparse else None,
    )


def corpus(vectors: np.ndarray) -> list[PassagePoint]:
    """Six docs, one chunk each (text i, vector i), language alternating en/de, doc d0..d5."""
    return [
        point(passage(f"d{i}", 0, text, lang="en" if i % 2 == 0 else "de"), vectors[i]) for i, text in enumerate(TEXTS)
    ]


def q(vectors: np.ndarray, i: int, noise: float = 0.05) -> list[float]:
    """A query vector close to ``vectors[i]``."""
    rng = np.random.default_rng(100 + i)
    return [float(x) for x in vectors[i] + noise * rng.normal(size=DIM)]


class StoreContract:
    """The behaviour every engine shows through the front end. Subclasses provide ``engine_factory``."""

    @pytest.fixture
    def open_again(self, engine_factory: EngineFactory) -> Iterator[Factory]:
        opened: list[VectorStore] = []

        def factory() -> VectorStore:
            store = Store(engine_factory())
            opened.append(store)
            return store

        yield factory
        for store in opened:
            store.close()

    @pytest.fixture
    def store(self, open_again: Factory) -> VectorStore:
        return open_again()

    @pytest.fixture
    def vectors(self) -> np.ndarray:
        return np.random.default_rng(7).normal(size=(64, DIM)).astype(np.float32)  # (64, dim)

    # --------------------------------------------------------------------------------------------------------
    # collection, generations
    # --------------------------------------------------------------------------------------------------------

    def test_missing_collection(self, store: VectorStore) -> None:
        info = store.info()
        assert info.active is None and info.generations == [] and info.alias == store.alias
        for op in (
            store.count,
            lambda: point_ids(store),
            lambda: list(store.scroll()),
            lambda: store.doc_states(["d0"]),
        ):
            with pytest.raises(CollectionNotFound, match="dpr ingest"):
                op()
        with pytest.raises(CollectionNotFound, match="dpr ingest"):
            store.search(SearchRequest(dense=[0.0] * DIM))

    def test_ensure_collection_and_model_mismatch(self, store: VectorStore) -> None:
        first = store.ensure_collection(SPEC)
        assert first == f"{store.alias}__g0001"
        assert store.ensure_collection(SPEC) == first  # idempotent
        info = store.info()
        assert info.active is not None and info.active.name == first and info.active.spec.model == MODEL
        assert info.backend == store.backend

        with pytest.raises(ModelMismatch) as err:
            store.ensure_collection(CollectionSpec(dim=DIM, distance="cosine", model=OTHER_MODEL))
        assert MODEL in str(err.value) and OTHER_MODEL in str(err.value) and "dpr reembed" in str(err.value)
        with pytest.raises(ModelMismatch, match="dim 16"):
            store.ensure_collection(CollectionSpec(dim=16, distance="cosine", model=MODEL))
        with pytest.raises(ModelMismatch, match="dot"):
            store.ensure_collection(CollectionSpec(dim=DIM, distance="dot", model=MODEL))

    def test_wrong_dimension_is_refused(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(SPEC)
        with pytest.raises(ModelMismatch, match="dimension 3"):
            store.search(SearchRequest(dense=[1.0, 0.0, 0.0]))
        with pytest.raises(ModelMismatch):
            store.upsert([PassagePoint(passage("d0", 0, "x"), dense=[1.0] * (DIM + 1))])

    def test_generations_alias_swap(self, open_again: Factory, vectors: np.ndarray) -> None:
        store = open_again()
        g1 = store.ensure_collection(SPEC)
        store.upsert(corpus(vectors))
        spec2 = CollectionSpec(dim=DIM, distance="cosine", model=OTHER_MODEL, sparse=True)
        g2 = store.create_generation(spec2)
        assert g2 == f"{store.alias}__g0002"
        assert store.info().active.name == g1  # type: ignore[union-attr]

        new_point = point(passage("new", 0, "fresh generation text", model=OTHER_MODEL), vectors[40])
        store.upsert([new_point], generation=g2)
        assert store.count(generation=g2) == 1
        assert store.count() == len(TEXTS)  # still the old generation

        store.activate(g2)
        info = store.info()
        assert info.active is not None and info.active.name == g2 and info.active.count == 1
        assert {(g.name, g.count, g.active) for g in info.generations} == {(g1, len(TEXTS), False), (g2, 1, True)}
        # data ops without generation= now hit the new generation, also through a freshly opened store
        for s in (store, open_again()):
            assert s.count() == 1
            assert point_ids(s) == {new_point.passage.id}
            hits = s.search(SearchRequest(dense=q(vectors, 40), k=3))
            assert [h.passage.doc_id for h in hits] == ["new"]
        # the model check now follows the active generation
        with pytest.raises(ModelMismatch):
            store.ensure_collection(SPEC)
        assert store.ensure_collection(spec2) == g2

        with pytest.raises(ConfigError, match="active"):
            store.drop_generation(g2)
        store.drop_generation(g1)
        assert [g.name for g in store.info().generations] == [g2]
        with pytest.raises(CollectionNotFound):
            store.count(generation=g1)
        with pytest.raises(CollectionNotFound):
            store.drop_generation(g1)
        with pytest.raises(CollectionNotFound):
            store.activate(f"{store.alias}__g0099")

    def test_update_settings_persists_across_reopen(self, open_again: Factory) -> None:
        store = open_again()
        gen = store.ensure_collection(SPEC)
        store.update_settings({"fusion": "linear", "linear_weight": 0.7})
        store.update_settings({"linear_weight": 0.6, "rrf_k": 30})
        store.close()
        reopened = open_again()
        spec = reopened.info().active.spec  # type: ignore[union-attr]
        assert spec.settings == {"fusion": "linear", "linear_weight": 0.6, "rrf_k": 30}
        assert (spec.dim, spec.distance, spec.model, spec.sparse) == (DIM, "cosine", MODEL, True)
        assert reopened.info().active.name == gen  # type: ignore[union-attr]

    # --------------------------------------------------------------------------------------------------------
    # data
    # --------------------------------------------------------------------------------------------------------

    def test_upsert_is_idempotent(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(SPEC)
        points = corpus(vectors)
        store.upsert(points)
        store.upsert(points)
        assert store.count() == len(points)
        assert point_ids(store) == {p.passage.id for p in points}
        store.upsert([])  # no-op

    def test_count_ids_scroll_complete_and_stable(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(SPEC)
        points = [point(passage(f"doc{i // 5}", i % 5, f"passage number {i}", topic=i), vectors[i]) for i in range(23)]
        store.upsert(points)
        assert store.count() == 23
        assert point_ids(store) == {p.passage.id for p in points}

        batches = list(store.scroll(batch_size=7))
        assert [len(b) for b in batches] == [7, 7, 7, 2]
        seen = [p for b in batches for p in b]
        assert sorted(seen, key=lambda p: p.id) == sorted((p.passage for p in points), key=lambda p: p.id)
        again = [p.id for b in store.scroll(batch_size=5) for p in b]
        assert again == [p.id for p in seen]  # stable order, whatever the batch size
        by_id = {p.passage.id: p.passage for p in points}
        assert all(p == by_id[p.id] for p in seen)  # payload round-trips, metadata included
        with pytest.raises(ConfigError):
            list(store.scroll(batch_size=0))

    def test_doc_states(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(SPEC)
        points = [point(passage("a", i, f"a text {i}", doc_hash="ha"), vectors[i]) for i in range(3)]
        points += [point(passage("b", 0, "b text", doc_hash="hb", model=OTHER_MODEL), vectors[3])]
        store.upsert(points)
        many = [f"absent{i}" for i in range(62)] + ["a", "b"]
        states = store.doc_states(many)
        assert set(states) == {"a", "b"}
        assert (states["a"].doc_hash, states["a"].model, states["a"].chunks) == ("ha", MODEL, 3)
        assert (states["b"].doc_hash, states["b"].model, states["b"].chunks) == ("hb", OTHER_MODEL, 1)
        assert store.doc_states([]) == {}

        # an interrupted re-ingest (two versions side by side) never looks unchanged
        newer = Passage(**{**passage("a", 0, "a v2", doc_hash="ha2").__dict__, "ingested_at": "2025-01-01T00:00:00Z"})
        store.upsert([point(newer, vectors[0])])
        mixed = store.doc_states(["a"])["a"]
        assert mixed.doc_hash == "" and mixed.chunks == 1

    def test_delete_stale(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(SPEC)
        old = [point(passage("doc", i, f"old chunk {i}", doc_hash="v1"), vectors[i]) for i in range(4)]
        other = [point(passage("other", i, f"other chunk {i}", doc_hash="v1"), vectors[10 + i]) for i in range(2)]
        store.upsert(old + other)
        new = [point(passage("doc", i, f"new chunk {i}", doc_hash="v2"), vectors[20 + i]) for i in range(2)]
        store.upsert(new)  # overwrites chunks 0 and 1; chunks 2 and 3 are stale
        store.delete_stale("doc", keep_doc_hash="v2", keep_chunks=2)
        states = store.doc_states(["doc", "other"])
        assert (states["doc"].doc_hash, states["doc"].chunks) == ("v2", 2)
        assert states["other"].chunks == 2
        assert store.count() == 4

        # same hash, fewer chunks: the tail goes
        store.delete_stale("doc", keep_doc_hash="v2", keep_chunks=1)
        assert store.doc_states(["doc"])["doc"].chunks == 1
        # a document that changed hash entirely loses everything not matching
        store.delete_stale("other", keep_doc_hash="v9", keep_chunks=5)
        assert "other" not in store.doc_states(["other"])
        assert store.count() == 1

    def test_upsert_replace_drops_each_documents_stale_chunks(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(SPEC)
        old = [point(passage("doc", i, f"old chunk {i}", doc_hash="v1"), vectors[i]) for i in range(4)]
        short = [point(passage("short", i, f"short chunk {i}", doc_hash="s1"), vectors[5 + i]) for i in range(3)]
        other = [point(passage("other", i, f"other chunk {i}", doc_hash="v1"), vectors[10 + i]) for i in range(2)]
        store.upsert(old + short + other)
        new = [point(passage("doc", i, f"new chunk {i}", doc_hash="v2"), vectors[20 + i]) for i in range(2)]
        same_hash_fewer = [point(passage("short", 0, "short chunk 0", doc_hash="s1"), vectors[5])]
        store.upsert(new + same_hash_fewer, replace=True)
        states = store.doc_states(["doc", "short", "other"])
        assert (states["doc"].doc_hash, states["doc"].chunks) == ("v2", 2)  # chunks 2 and 3 of v1 are gone
        assert (states["short"].doc_hash, states["short"].chunks) == ("s1", 1)  # the tail beyond the points went
        assert (states["other"].doc_hash, states["other"].chunks) == ("v1", 2)  # not among the points: untouched
        assert store.count() == 5
        # without replace, an upsert only overwrites
        store.upsert([point(passage("other", 0, "other chunk 0 again", doc_hash="v3"), vectors[10])])
        assert store.count() == 5
        two_versions = [point(passage("x", 0, "x", doc_hash="a"), vectors[30]),
                        point(passage("x", 1, "x", doc_hash="b"), vectors[31])]
        with pytest.raises(ConfigError, match="two versions of document 'x'"):
            store.upsert(two_versions, replace=True)
        assert "x" not in store.doc_states(["x"])  # refused before anything was written

    def test_delete_documents(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(SPEC)
        store.upsert(corpus(vectors) + [point(passage("d0", 1, "second chunk of d0"), vectors[30])])
        assert store.delete_documents(["d0", "d1", "missing"]) == 3
        assert store.count() == len(TEXTS) - 2
        assert store.delete_documents(["d0"]) == 0
        assert store.delete_documents([]) == 0
        assert set(store.doc_states([f"d{i}" for i in range(6)])) == {"d2", "d3", "d4", "d5"}

    # --------------------------------------------------------------------------------------------------------
    # search
    # --------------------------------------------------------------------------------------------------------

    def test_dense_search_ranks_nearest_first(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(SPEC)
        store.upsert(corpus(vectors))
        for i in range(len(TEXTS)):
            hits = store.search(SearchRequest(mode="dense", dense=q(vectors, i), k=3))
            assert len(hits) == 3
            assert hits[0].passage.doc_id == f"d{i}"
            assert hits[0].id == hits[0].passage.id
            assert hits[0].score > hits[1].score >= hits[2].score
            assert hits[0].passage.text == TEXTS[i] and hits[0].passage.model == MODEL

    def test_sparse_search_finds_word_overlap(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(SPEC)
        store.upsert(corpus(vectors))
        bm25 = default_embedder()
        hits = store.search(
            SearchRequest(mode="sparse", sparse=bm25.embed_query("how do plants use light energy?"), k=3)
        )
        assert hits and hits[0].passage.doc_id == "d5"
        hits = store.search(SearchRequest(mode="sparse", sparse=bm25.embed_query("jumping foxes"), k=3))
        assert [h.passage.doc_id for h in hits] == ["d0"]  # stemming: jumping -> jump, foxes -> fox
        assert store.search(SearchRequest(mode="sparse", sparse=bm25.embed_query("the of and"))) == []

    @pytest.mark.parametrize("fusion", ["rrf", "linear"])
    def test_hybrid_fuses_both_branches_and_respects_filters(
        self, store: VectorStore, vectors: np.ndarray, fusion: str
    ) -> None:
        store.ensure_collection(SPEC)
        store.upsert(corpus(vectors))
        bm25 = default_embedder()
        # the dense branch points at d1, the sparse branch at d4: both must come out of the fusion on top
        request = SearchRequest(
            mode="hybrid",
            dense=q(vectors, 1, noise=0.0),
            sparse=bm25.embed_query("reciprocal rank fusion of ranked lists"),
            fusion=fusion,  # type: ignore[arg-type]
            k=4,
            candidates=3,
            rrf_k=60,
            linear_weight=0.5,
        )
        hits = store.search(request)
        assert len(hits) == 4
        assert {h.passage.doc_id for h in hits[:2]} == {"d1", "d4"}
        assert hits[0].score >= hits[1].score >= hits[2].score
        if fusion == "linear":
            # w * dense_norm + (1 - w) * sparse_norm: each branch's best alone is worth 0.5
            assert hits[0].score >= 0.5 and all(0.0 <= h.score <= 1.0 for h in hits)

        filtered = store.search(
            SearchRequest(**{**request.__dict__, "filters": {"lang": "en"}})  # d0, d2, d4
        )
        assert filtered and {h.passage.doc_id for h in filtered} <= {"d0", "d2", "d4"}
        assert filtered[0].passage.doc_id == "d4"
        only = store.search(SearchRequest(**{**request.__dict__, "filters": {"doc_id": ["d2", "d3"]}}))
        assert {h.passage.doc_id for h in only} == {"d2", "d3"}

    def test_linear_weight_moves_the_ranking(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(SPEC)
        store.upsert(corpus(vectors))
        base = SearchRequest(
            mode="hybrid",
            dense=q(vectors, 1, noise=0.0),
            sparse=default_embedder().embed_query("reciprocal rank fusion of ranked lists"),
            fusion="linear",
            k=3,
        )
        dense_heavy = store.search(SearchRequest(**{**base.__dict__, "linear_weight": 1.0}))
        sparse_heavy = store.search(SearchRequest(**{**base.__dict__, "linear_weight": 0.0}))
        assert dense_heavy[0].passage.doc_id == "d1" and dense_heavy[0].score == pytest.approx(1.0)
        assert sparse_heavy[0].passage.doc_id == "d4" and sparse_heavy[0].score == pytest.approx(1.0)

    @pytest.mark.parametrize("mode", ["dense", "sparse"])
    def test_filters_by_doc_id_and_metadata(self, store: VectorStore, vectors: np.ndarray, mode: str) -> None:
        store.ensure_collection(SPEC)
        store.upsert(corpus(vectors))
        bm25 = default_embedder()
        request = SearchRequest(
            mode=mode,  # type: ignore[arg-type]
            dense=q(vectors, 0),
            sparse=bm25.embed_query("quick fox documents vectors fusion energy retrieval"),
            k=10,
        )
        assert {
            h.passage.doc_id for h in store.search(SearchRequest(**{**request.__dict__, "filters": {"doc_id": "d3"}}))
        } == {"d3"}
        de = store.search(SearchRequest(**{**request.__dict__, "filters": {"lang": "de"}}))
        assert de and {h.passage.doc_id for h in de} <= {"d1", "d3", "d5"}
        both = store.search(
            SearchRequest(**{**request.__dict__, "filters": {"lang": "en", "doc_id": ["d0", "d1", "d2"]}})
        )
        assert both and {h.passage.doc_id for h in both} <= {"d0", "d2"}
        assert store.search(SearchRequest(**{**request.__dict__, "filters": {"lang": "fr"}})) == []
        with pytest.raises(ConfigError):
            store.search(SearchRequest(**{**request.__dict__, "filters": {"lang": 1.5}}))

    def test_dense_only_collection_refuses_sparse_modes(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(CollectionSpec(dim=DIM, distance="cosine", model=MODEL, sparse=False))
        store.upsert(corpus(vectors))  # sparse vectors given are dropped: the generation has none
        assert store.search(SearchRequest(dense=q(vectors, 2), k=1))[0].passage.doc_id == "d2"
        sparse = default_embedder().embed_query("quick fox")
        for mode in ("sparse", "hybrid"):
            with pytest.raises(ConfigError, match="dense-only") as err:
                store.search(SearchRequest(mode=mode, dense=q(vectors, 2), sparse=sparse))  # type: ignore[arg-type]
            assert store.alias in str(err.value) and "reembed" in str(err.value)

    def test_bad_requests_are_config_errors(self, store: VectorStore, vectors: np.ndarray) -> None:
        store.ensure_collection(SPEC)
        for bad in (
            SearchRequest(mode="dense"),  # no vector
            SearchRequest(mode="sparse"),
            SearchRequest(dense=q(vectors, 0), k=0),
            SearchRequest(
                mode="hybrid",
                dense=q(vectors, 0),
                sparse=default_embedder().embed_query("x"),
                linear_weight=2.0,
                fusion="linear",
            ),
        ):
            with pytest.raises(ConfigError):
                store.search(bad)

    @pytest.mark.parametrize("distance", ["dot", "euclid"])
    def test_other_distances_rank_nearest_first(self, store: VectorStore, vectors: np.ndarray, distance: str) -> None:
        store.ensure_collection(CollectionSpec(dim=DIM, distance=distance, model=MODEL))  # type: ignore[arg-type]
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)  # (64, dim): dot ranks like cosine
        store.upsert([point(p.passage, unit[i]) for i, p in enumerate(corpus(vectors))])
        sparse = default_embedder().embed_query("photosynthesis")  # points at d5
        for i in (0, 3):
            query = [float(x) for x in unit[i]]
            assert store.search(SearchRequest(dense=query, k=2))[0].passage.doc_id == f"d{i}"
            linear = SearchRequest(mode="hybrid", fusion="linear", dense=query, sparse=sparse, linear_weight=1.0, k=2)
            assert store.search(linear)[0].passage.doc_id == f"d{i}"  # euclid: smaller distance normalises to 1

    def test_unknown_generation_names_are_not_found(self, store: VectorStore) -> None:
        store.ensure_collection(SPEC)
        for name in ("../../etc", "other__g0001", f"{store.alias}__g0042"):
            with pytest.raises(CollectionNotFound):
                store.count(generation=name)
            with pytest.raises(CollectionNotFound):
                store.activate(name)

    # --------------------------------------------------------------------------------------------------------
    # the cached active generation, optimize
    # --------------------------------------------------------------------------------------------------------

    def test_active_is_cached_and_follows_every_change(self, open_again: Factory) -> None:
        store, other = open_again(), open_again()  # two stores: "this process" and "another process"
        assert store.active() is None
        g1 = store.ensure_collection(SPEC)
        active = store.active()
        assert active is not None and (active.name, active.spec) == (g1, SPEC)
        assert store.active() == active
        g2 = other.create_generation(CollectionSpec(dim=DIM, distance="cosine", model=OTHER_MODEL))
        assert store.active() == active  # creating an inactive generation changes nothing
        other.activate(g2)  # another store swaps: this one sees it on its next call
        swapped = store.active()
        assert swapped is not None and (swapped.name, swapped.spec.model) == (g2, OTHER_MODEL)
        store.update_settings({"mode": "hybrid"})
        assert store.active().spec.settings == {"mode": "hybrid"}  # type: ignore[union-attr]
        store.activate(g1)
        assert store.active().name == g1 == other.active().name  # type: ignore[union-attr]

    def test_optimize_keeps_the_data_and_settles(self, store: VectorStore, vectors: np.ndarray) -> None:
        with pytest.raises(CollectionNotFound):
            store.optimize()
        store.ensure_collection(SPEC)
        store.upsert(corpus(vectors))
        before = [h.id for h in store.search(SearchRequest(dense=q(vectors, 2), k=6))]
        store.optimize()
        assert store.optimize() is False  # nothing left to do right after an optimize
        assert store.count() == len(TEXTS)
        assert [h.id for h in store.search(SearchRequest(dense=q(vectors, 2), k=6))] == before
        with pytest.raises(CollectionNotFound):
            store.optimize(generation=f"{store.alias}__g0042")
