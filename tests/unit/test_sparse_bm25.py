"""BM25 length normalisation from the collection's own statistics (services.store.bm25 through the real store):
the stats record follows upserts, overwrites, replaces and deletes; the stored weights use the generation's
average length; the store's sparse ranking equals bm25s' on a small generated corpus with the same tokens."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from services.store import Store
from services.store import bm25 as store_bm25
from services.store.edge.engine import EdgeEngine
from services.store.points import CollectionSpec, Passage, PassagePoint, SearchRequest, SparseVector
from services.store.sparse import Bm25Embedder, default_embedder, embedder_for

pytestmark = pytest.mark.unit

WORDS = ("retrieval passage question tower dense sparse index vector corpus query model train score rank "
         "document length average token stem river school engine aircraft wing flow pressure library").split()


def new_store(root: Path, enc: Bm25Embedder | None = None, engine: str = "edge") -> Store:
    if engine == "edge":
        store = Store(EdgeEngine(root, "c", idle_release=0.05))
    else:
        from qdrant_client import QdrantClient

        from services.store.server.engine import ServerEngine

        store = Store(ServerEngine(QdrantClient(location=":memory:"), "c", owns_client=True))
    store.ensure_collection(CollectionSpec(dim=2, distance="cosine", model="m", sparse=True,
                                           settings={"bm25": (enc or default_embedder()).config()}))
    return store


def point(doc_id: str, text: str, chunk: int = 0, doc_hash: str = "h", enc: Bm25Embedder | None = None) -> PassagePoint:
    vector = (enc or default_embedder()).embed_document(text)
    return PassagePoint(Passage(doc_id=doc_id, chunk_index=chunk, text=text, doc_hash=doc_hash, model="m"),
                        dense=[1.0, 0.0], sparse=vector)


def test_document_vectors_carry_counts_and_weights_follow_the_formula() -> None:
    enc = default_embedder()
    v = enc.embed_document("the fox jumps over the fox and the foxes; dog dog dog")
    assert v.counts is not None and sorted(v.counts) == [1.0, 3.0, 3.0]  # fox x3 (stemmed), dog x3, jump
    assert list(enc.term_counts("the fox and the foxes").values()) == [2]  # stopwords out, stems merged
    assert v.values == pytest.approx(store_bm25.weights(v.counts, 256.0, 1.2, 0.75))
    again = store_bm25.renormalized(v, 7.0, 1.2, 0.75)
    length = sum(v.counts)
    assert again.values == pytest.approx([tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / 7.0)) for tf in v.counts])
    assert again == SparseVector(v.indices, again.values)  # counts and avg_len do not change equality
    assert embedder_for("ko").embed_document("학생들은 학교에서 공부한다 학교").counts is not None


def test_stats_follow_upserts_overwrites_replaces_and_deletes(tmp_path: Path) -> None:
    enc = default_embedder()
    store = new_store(tmp_path)
    texts = {"a": "dense retrieval towers", "b": "sparse index of the corpus with many tokens in it here",
             "c": "question"}
    store.upsert([point(d, t) for d, t in texts.items()])
    lengths = {d: sum(enc.term_counts(t).values()) for d, t in texts.items()}
    stats = store.bm25_stats()
    assert (stats.tokens, stats.passages) == (sum(lengths.values()), 3)
    # the stored weights are those of the generation's own average length, not the 256-token prior
    hits = store.search(SearchRequest(k=3, mode="sparse", sparse=enc.embed_query("question")))
    assert [h.passage.doc_id for h in hits] == ["c"] and "bm25_len" not in hits[0].passage.metadata
    # an overwrite of the same point replaces its length, it is not counted twice
    store.upsert([point("a", "dense retrieval towers train models")])
    lengths["a"] = 5
    assert (store.bm25_stats().tokens, store.bm25_stats().passages) == (sum(lengths.values()), 3)
    # a new version with fewer chunks: the stale chunks leave the stats
    store.upsert([point("b", "one two", chunk=0, doc_hash="h1"), point("b", "three four five", chunk=1, doc_hash="h1")],
                 replace=True)
    store.upsert([point("b", "river", chunk=0, doc_hash="h2")], replace=True)
    lengths["b"] = 1
    assert (store.bm25_stats().tokens, store.bm25_stats().passages) == (sum(lengths.values()), 3)
    assert store.delete_documents(["a"]) == 1
    assert (store.bm25_stats().tokens, store.bm25_stats().passages) == (lengths["b"] + lengths["c"], 2)
    store.upsert([point("c", "question question", chunk=1)])
    store.delete_stale("c", "h", 1)
    assert store.bm25_stats().passages == 2
    # another generation starts from nothing, even when its spec was copied with the record in it
    spec = store.active().spec  # type: ignore[union-attr]
    assert spec.settings[store_bm25.STATS_KEY]["passages"] == 2
    other = store.create_generation(spec)
    assert store.bm25_stats(other).passages == 0
    store.close()
    reopened = Store(EdgeEngine(tmp_path, "c", idle_release=0.05))
    assert reopened.bm25_stats().passages == 2  # the record lives with the generation
    reopened.close()


def test_vectors_without_counts_are_stored_as_given(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    bare = SparseVector([1, 2], [0.5, 0.25])
    store.upsert([PassagePoint(Passage(doc_id="x", chunk_index=0, text="t", doc_hash="h", model="m"), dense=[1.0, 0.0],
                               sparse=bare)])
    assert store.bm25_stats().passages == 0
    store.close()


def generated() -> tuple[dict[str, str], list[str]]:
    """120 documents; 25 questions of 3 distinct words and 10 that repeat one word 2-4 times (a long question)."""
    rng = random.Random(7)
    docs = {f"d{i:03d}": " ".join(rng.choice(WORDS) for _ in range(rng.choice((3, 5, 8, 20, 40)))) for i in range(120)}
    repeated = [" ".join([w] * rng.randint(2, 4) + rng.sample(WORDS, 2)) for w in rng.sample(WORDS, 10)]
    return docs, [" ".join(rng.sample(WORDS, 3)) for _ in range(25)] + repeated


def test_a_question_weighs_a_word_by_how_often_it_has_it() -> None:
    enc = default_embedder()
    v = enc.embed_query("wing pressure wing flow wing")
    assert sorted(v.values) == [1.0, 1.0, 3.0] and v.counts is None  # "wing" three times
    assert enc.embed_query("the of and").indices == []  # stopwords only: nothing to search


def assert_bm25s_scores(store: Store, docs: dict[str, str], queries: list[str]) -> None:
    """The store's sparse scores equal bm25s' (lucene, k1 1.2, b 0.75) on the same tokens, times (k + 1)."""
    import bm25s

    enc = default_embedder()
    ids = sorted(docs)
    counts = [enc.term_counts(docs[d]) for d in ids]
    assert store.bm25_stats().avg_len == pytest.approx(sum(sum(c.values()) for c in counts) / len(ids))
    index = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    index.index([[str(t) for t, c in cs.items() for _ in range(c)] for cs in counts], show_progress=False)
    for q in queries:
        terms = [str(t) for t, c in enc.term_counts(q).items() for _ in range(c)]  # repeats count, as in bm25s
        ref = index.get_scores([t for t in terms if t in index.vocab_dict])
        hits = store.search(SearchRequest(k=len(ids), mode="sparse", sparse=enc.embed_query(q)))
        ours = {h.passage.doc_id: h.score for h in hits}
        for i, d in enumerate(ids):
            # bm25s' lucene BM25 leaves out the constant (k + 1) factor of the term-frequency part
            assert ours.get(d, 0.0) == pytest.approx(2.2 * float(ref[i]), rel=1e-3, abs=1e-4), (q, d)


@pytest.mark.parametrize("engine", ["edge", "server"])
def test_store_ranking_matches_bm25s_after_the_drift_is_reweighted(tmp_path: Path, engine: str) -> None:
    docs, queries = generated()
    store = new_store(tmp_path, engine=engine)
    ids = sorted(docs, key=lambda d: (len(docs[d]), d))  # shortest first: the average grows batch after batch
    for start in range(0, len(ids), 40):
        store.upsert([point(d, docs[d]) for d in ids[start : start + 40]])
    stats = store.bm25_stats()
    assert stats.low is not None and stats.avg_len is not None and stats.low < 0.9 * stats.avg_len
    assert stats.drifted()
    first_scores = [h.score for h in store.search(SearchRequest(k=5, mode="sparse",
                                                               sparse=default_embedder().embed_query(queries[0])))]
    if engine == "edge":  # the end of an ingest job re-weights (under the lease)
        assert store.maybe_optimize() is True
    else:  # a server leaves it to `dpr optimize` (a concurrent writer could be undone)
        assert store.maybe_optimize() is False and store.bm25_stats().drifted()
        rewritten = store.bm25_renormalize()
        assert 0 < rewritten < len(ids)  # the last batch was weighted with (nearly) the final average already
    assert_bm25s_scores(store, docs, queries)
    assert first_scores != [h.score for h in store.search(SearchRequest(
        k=5, mode="sparse", sparse=default_embedder().embed_query(queries[0])))]
    assert not store.bm25_stats().drifted() and store.bm25_renormalize() == 0  # nothing left to do, nothing read
    store.close()


@pytest.mark.parametrize("only_old", [False, True])
def test_points_from_before_the_stats_record_are_counted_and_reweighted_by_optimize(tmp_path: Path,
                                                                                     only_old: bool) -> None:
    docs, queries = generated()
    store = new_store(tmp_path)
    ids = sorted(docs)
    old = []
    for d in ids[:100]:  # as the product wrote them before: weighted with the 256-token prior, no counts
        p = point(d, docs[d])
        old.append(dataclasses.replace(p, sparse=SparseVector(p.sparse.indices, p.sparse.values)))  # type: ignore[union-attr]
    store.upsert(old)
    assert store.bm25_stats().passages == 0
    if only_old:
        assert store.optimize() is True  # a collection from before the record: counted and re-weighted
        assert store.bm25_stats().passages == 100 and store.bm25_stats().complete
        store.close()
        return
    store.upsert([point(d, docs[d]) for d in ids[100:]])  # new points into the old collection
    assert store.bm25_stats().passages == 20 and not store.bm25_stats().complete
    assert store.optimize() is True
    assert store.bm25_stats().passages == 120 and store.bm25_stats().complete
    assert_bm25s_scores(store, docs, queries)
    store.close()
