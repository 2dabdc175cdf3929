"""The mode a query that names none gets (``services.store.common.serving_mode``): the label-free hybrid default on
a collection with BM25 vectors, the `dpr tune-hybrid` choice where one is recorded, dense where there are no BM25
vectors (and why, for `dpr status`); an explicit mode always wins."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.fakes import HashTowers
from kit.policy import make_settings

from services.core.errors import ConfigError
from services.query import QueryOptions, resolve_request, search
from services.store import open_store
from services.store.common import LABEL_FREE_FUSION, serving_mode
from services.store.points import CollectionSpec, Passage, PassagePoint
from services.store.sparse import default_embedder

pytestmark = pytest.mark.unit

TUNED = {"mode": "hybrid", "hybrid": {"fusion": "linear", "linear_weight": 0.7, "candidates": 50, "metric": "ndcg@10",
                                      "dev_score": 0.8, "tuned_on": {"dataset": "dev-set", "queries": 40}}}


def spec(sparse: bool = True, **settings: object) -> CollectionSpec:
    return CollectionSpec(dim=8, distance="cosine", model="m", sparse=sparse, settings=dict(settings))


def test_a_collection_with_bm25_and_no_tuning_serves_the_label_free_hybrid() -> None:
    serving = serving_mode(spec())
    assert (serving.mode, serving.source, serving.fusion) == ("hybrid", "label-free", LABEL_FREE_FUSION)
    assert serving.reason.startswith("label-free default: hybrid linear, dense weight 0.5, measured")
    request = resolve_request(spec(), QueryOptions(k=5), "c")
    assert (request.mode, request.fusion, request.linear_weight, request.candidates) == ("hybrid", "linear", 0.5, 100)


def test_a_tuned_choice_overrides_the_label_free_default_and_says_where_it_was_tuned() -> None:
    serving = serving_mode(spec(**TUNED))
    assert (serving.mode, serving.source) == ("hybrid", "tuned")
    assert serving.reason.startswith("tuned on dev-set (40 dev questions): linear, dense weight 0.7")
    request = resolve_request(spec(**TUNED), QueryOptions(k=5), "c")
    assert (request.fusion, request.linear_weight, request.candidates) == ("linear", 0.7, 50)


def test_an_explicit_mode_or_fusion_wins() -> None:
    dense = resolve_request(spec(), QueryOptions(k=5, mode="dense"), "c")
    assert dense.mode == "dense"
    rrf = resolve_request(spec(), QueryOptions(k=5, fusion="rrf"), "c")  # the label-free mode, the fusion asked
    assert (rrf.mode, rrf.fusion, rrf.rrf_k) == ("hybrid", "rrf", 60)
    linear = resolve_request(spec(**TUNED), QueryOptions(k=5, fusion="rrf", rrf_k=10), "c")
    assert (linear.mode, linear.fusion, linear.rrf_k) == ("hybrid", "rrf", 10)


def test_a_generation_without_bm25_vectors_falls_back_to_dense_and_says_why() -> None:
    serving = serving_mode(spec(sparse=False))
    assert (serving.mode, serving.source) == ("dense", "dense-only")
    assert "no BM25 sparse vectors" in serving.reason and "dpr reembed" in serving.reason
    assert resolve_request(spec(sparse=False), QueryOptions(k=5), "c").mode == "dense"
    with pytest.raises(ConfigError, match="dense-only"):
        resolve_request(spec(sparse=False), QueryOptions(k=5, mode="hybrid"), "c")


def test_a_default_search_through_the_store_ranks_as_the_explicit_label_free_hybrid(tmp_path: Path) -> None:
    towers, sparse = HashTowers(), default_embedder()
    texts = {"lava.txt": "volcano lava magma eruption", "ice.txt": "glacier ice snow melt",
             "bee.txt": "honey bees pollen hive", "sand.txt": "desert sand dunes wind"}
    with open_store(make_settings(data_dir=tmp_path)) as store:
        store.ensure_collection(CollectionSpec(dim=towers.dim, distance=towers.similarity, model=towers.fingerprint))
        store.upsert([PassagePoint(passage=Passage(doc_id=doc, chunk_index=0, text=text), dense=v.tolist(),
                                   sparse=sparse.embed_document(text))
                      for (doc, text), v in zip(texts.items(), towers.encode_documents(list(texts.values())),
                                                strict=True)])
        ask = {"store": store, "towers": towers, "sparse_for": lambda: sparse}
        default = search("glacier melt", options=QueryOptions(k=4), **ask)
        explicit = search("glacier melt", options=QueryOptions(k=4, mode="hybrid", fusion="linear", linear_weight=0.5),
                          **ask)
        dense = search("glacier melt", options=QueryOptions(k=4, mode="dense"), **ask)
        assert default[0].passage.doc_id == "ice.txt"
        assert [(h.passage.doc_id, h.score) for h in default] == [(h.passage.doc_id, h.score) for h in explicit]
        assert [h.score for h in default] != [h.score for h in dense]  # fused scores, not the cosine
