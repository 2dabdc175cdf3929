"""The rerank step of the query path: the plan (collection default, off, N), the reordering, and a search through a
real Runtime over hashing towers with a reranker that prefers one word."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from kit.fakes import FakeRuntime

from encoders.rerank import fuse_scores
from services.core.errors import ConfigError
from services.query import RERANK_KEY, QueryOptions, RerankPlan, rerank_plan
from services.readers.records import Document
from services.store.points import CollectionSpec

pytestmark = pytest.mark.unit


class WordReranker:
    """Scores a passage by how often ``word`` occurs in it (a stand-in cross-encoder with a known order)."""

    name = "word"
    backend = "test"
    fingerprint = "word-reranker"

    def __init__(self, word: str) -> None:
        self.word = word
        self.calls: list[tuple[str, int]] = []
        self.batch_sizes: list[int] = []

    def score(self, question: str, passages: Sequence[str], batch_size: int = 32) -> np.ndarray:
        self.calls.append((question, len(passages)))
        self.batch_sizes.append(batch_size)
        return np.array([p.lower().split().count(self.word) for p in passages], dtype=np.float32)


def _spec(**rerank: object) -> CollectionSpec:
    return CollectionSpec(dim=8, distance="cosine", model="m", settings={RERANK_KEY: rerank} if rerank else {})


def test_the_plan_follows_the_collection_unless_asked() -> None:
    assert rerank_plan(_spec(), QueryOptions()) == RerankPlan(0, None, 1.0)
    assert rerank_plan(_spec(model="r1", candidates=30, enabled=False), QueryOptions()) == RerankPlan(0, "r1")
    assert rerank_plan(_spec(model="r1", candidates=30, enabled=True), QueryOptions()) == RerankPlan(30, "r1")
    assert rerank_plan(_spec(model="r1", candidates=30, enabled=True), QueryOptions(rerank=0)) == RerankPlan(0, "r1")
    assert rerank_plan(_spec(), QueryOptions(k=5, rerank=20)) == RerankPlan(20, None)
    stored = _spec(model="r1", candidates=30, enabled=True, weight=0.4)
    assert rerank_plan(stored, QueryOptions()) == RerankPlan(30, "r1", 0.4)  # the weight its dev split chose
    assert rerank_plan(stored, QueryOptions(rerank_weight=1.0)) == RerankPlan(30, "r1", 1.0)
    assert rerank_plan(_spec(), QueryOptions(k=10, rerank=5)) == RerankPlan(5, None)  # the top 5 of the 10
    with pytest.raises(ConfigError, match="weight 1.5 is out of range"):
        rerank_plan(_spec(), QueryOptions(rerank_weight=1.5))


def test_fused_scores_mix_the_two_orders_by_weight() -> None:
    first, rerank = [0.9, 0.8, 0.7, 0.1], [-3.0, 5.0, 1.0, 2.0]
    assert fuse_scores(first, rerank, 1.0) == rerank  # the reranker alone, raw
    assert np.argsort(fuse_scores(first, rerank, 0.0))[::-1].tolist() == [0, 1, 2, 3]  # the first stage's order
    mid = fuse_scores(first, rerank, 0.5)  # scaled: first [1, .875, .75, 0], rerank [0, 1, .5, .625]
    assert mid == pytest.approx([0.5, 0.9375, 0.625, 0.3125])
    assert fuse_scores([0.5, 0.5], [1.0, 1.0], 0.3) == [0.0, 0.0]  # nothing to scale: no order from either
    with pytest.raises(ValueError, match="out of range"):
        fuse_scores(first, rerank, -0.1)


def test_a_weighted_rerank_keeps_a_strong_first_stage_hit() -> None:
    runtime = _runtime_with_docs()
    reranker = WordReranker("ocean")
    runtime.reranker = lambda recorded=None: reranker  # type: ignore[method-assign]
    try:
        first = runtime.search("tides moon sea number 0", QueryOptions(k=6, rerank=0))
        alone = runtime.search("tides moon sea number 0", QueryOptions(k=6, rerank=6))
        mixed = runtime.search("tides moon sea number 0", QueryOptions(k=6, rerank=6, rerank_weight=0.0))
    finally:
        runtime.close()
    assert [h.passage.doc_id for h in alone][0] == "d5"
    assert [h.passage.doc_id for h in mixed] == [h.passage.doc_id for h in first]  # weight 0: the first stage
    assert [h.rerank_score for h in mixed] == [float(h.passage.doc_id[1]) for h in mixed]  # still the reranker's


def _runtime_with_docs() -> FakeRuntime:
    runtime = FakeRuntime()
    docs = [Document(doc_id=f"d{i}", text=f"tides moon {'ocean ' * i}sea number {i}")
            for i in range(6)]
    runtime.pipeline.ingest_batch(docs)
    return runtime


def test_rerank_reorders_the_first_stage_top_n_and_returns_k() -> None:
    runtime = _runtime_with_docs()
    reranker = WordReranker("ocean")
    try:
        first = runtime.search("tides moon sea", QueryOptions(k=6, rerank=0))
        assert all(h.rerank_score is None for h in first)
        runtime.reranker = lambda recorded=None: reranker  # type: ignore[method-assign]
        hits = runtime.search("tides moon sea", QueryOptions(k=3, rerank=6))
    finally:
        runtime.close()
    assert reranker.calls == [("tides moon sea", 6)]  # the first stage's top N, scored once
    assert [h.passage.doc_id for h in hits] == ["d5", "d4", "d3"]  # by the reranker's score, cut to k
    assert [h.rerank_score for h in hits] == [5.0, 4.0, 3.0]
    by_id = {h.passage.doc_id: h.score for h in first}
    assert [h.score for h in hits] == pytest.approx([by_id[h.passage.doc_id] for h in hits])  # first stage kept
    assert hits[0].to_json()["rerank_score"] == 5.0 and "rerank_score" not in first[0].to_json()


def test_the_runtime_scores_in_batches_of_the_rerank_setting() -> None:
    runtime = _runtime_with_docs()
    reranker = WordReranker("ocean")
    try:
        rerank = runtime.settings.rerank.model_copy(update={"batch_size": 5})
        runtime.settings = runtime.settings.model_copy(update={"rerank": rerank})  # DPR_RERANK__BATCH_SIZE=5
        runtime.reranker = lambda recorded=None: reranker  # type: ignore[method-assign]
        runtime.search("tides moon sea", QueryOptions(k=3, rerank=6))
    finally:
        runtime.close()
    assert reranker.batch_sizes == [5]


def test_the_collection_default_turns_reranking_on() -> None:
    runtime = _runtime_with_docs()
    reranker = WordReranker("ocean")
    asked: list[str | None] = []

    def reranker_for(recorded: str | None = None) -> WordReranker:
        asked.append(recorded)
        return reranker

    try:
        runtime.reranker = reranker_for  # type: ignore[method-assign]
        runtime.store.update_settings({RERANK_KEY: {"model": "rr-1", "candidates": 6, "enabled": True}})
        default = runtime.search("tides moon sea", QueryOptions(k=2))
        off = runtime.search("tides moon sea", QueryOptions(k=2, rerank=0))
    finally:
        runtime.close()
    assert [h.passage.doc_id for h in default] == ["d5", "d4"] and asked == ["rr-1"]
    assert all(h.rerank_score is None for h in off) and len(reranker.calls) == 1


def test_the_api_takes_a_rerank_field(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from entrypoints.api.app import create_app
    from services.core.settings import Settings

    runtime = _runtime_with_docs()
    runtime.reranker = lambda recorded=None: WordReranker("ocean")  # type: ignore[method-assign]
    app = create_app(Settings(data_dir=tmp_path), runtime=runtime, warm_model=False)
    with TestClient(app) as c:
        reranked = c.post("/v1/search", json={"question": "tides moon sea", "k": 2, "rerank": 6}).json()["hits"]
        plain = c.post("/v1/search", json={"question": "tides moon sea", "k": 2, "rerank": 0}).json()["hits"]
        below = c.post("/v1/search", json={"question": "tides moon sea", "k": 5, "rerank": 2})
        plain_k5 = c.post("/v1/search", json={"question": "tides moon sea", "k": 5, "rerank": 0}).json()["hits"]
    assert [h["doc_id"] for h in reranked] == ["d5", "d4"] and [h["rerank_score"] for h in reranked] == [5.0, 4.0]
    assert all("rerank_score" not in h for h in plain)
    # rerank=2 below k=5: the top 2 reordered, the other 3 after them in the first stage's order
    assert below.status_code == 200, below.text
    below_hits = below.json()["hits"]
    assert len(below_hits) == 5 and all("rerank_score" in h for h in below_hits[:2])
    assert all("rerank_score" not in h for h in below_hits[2:])
    assert [h["doc_id"] for h in below_hits[2:]] == [h["doc_id"] for h in plain_k5[2:]]


def test_pointwise_rows_label_each_positive_and_negative() -> None:
    from services.lab.reranker.trainer import RerankConfig, columns_to_rows

    columns = {"question": ["q1", "q2"], "positive": ["p1", "p2"], "negative_1": ["n1a", "n2a"],
               "negative_2": ["n1b", "n2b"]}
    rows = columns_to_rows(columns)
    assert list(zip(rows["question"], rows["passage"], rows["label"], strict=True)) == [
        ("q1", "p1", 1.0), ("q1", "n1a", 0.0), ("q1", "n1b", 0.0),
        ("q2", "p2", 1.0), ("q2", "n2a", 0.0), ("q2", "n2b", 0.0),
    ]
    with pytest.raises(ValueError, match="loss 'hinge' is not known"):
        RerankConfig(loss="hinge").validate()


def test_a_reranker_starts_from_a_towers_models_passage_tower(tmp_path: Path) -> None:
    import json

    from services.lab.reranker.trainer import encoder_to_start_from

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    assert encoder_to_start_from(plain) == plain
    towers = tmp_path / "towers"
    for module in ("query_0_Transformer", "document_0_Transformer"):
        (towers / module).mkdir(parents=True)
        (towers / module / "config.json").write_text("{}")
    (towers / "document_1_Pooling").mkdir()
    structure = {"query": ["query_0_Transformer", "query_1_Pooling"],
                 "document": ["document_0_Transformer", "document_1_Pooling"]}
    (towers / "router_config.json").write_text(json.dumps({"structure": structure}))
    assert encoder_to_start_from(towers) == towers / "document_0_Transformer"
    (towers / "document_0_Transformer" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="no passage-tower encoder"):
        encoder_to_start_from(towers)


def test_a_reranker_given_as_base_keeps_its_trained_head(tmp_path: Path) -> None:
    import json

    from services.lab.reranker.trainer import starting_head

    encoder, reranker = tmp_path / "encoder", tmp_path / "reranker"
    for path, architecture in ((encoder, "BertModel"), (reranker, "BertForSequenceClassification")):
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    assert starting_head(encoder) == "fresh 1-logit classifier"
    assert starting_head(reranker).startswith("continued")
    assert starting_head(tmp_path) == "fresh 1-logit classifier"  # no config.json: nothing to continue
