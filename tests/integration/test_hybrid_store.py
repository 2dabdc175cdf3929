"""Hybrid retrieval end to end: real base towers, real embedded Qdrant engine, real BM25 sparse vectors.

A tiny constructed corpus where each branch has a blind spot: an exact error code (lexical; BM25 finds it) and a
paraphrase without shared words (semantic; the towers find it). Fusion must do at least as well as the worse
branch; payload filters must hold in every mode; a dense-only collection says so and refuses sparse/hybrid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.fakes import ingest_items
from typer.testing import CliRunner

from entrypoints.cli.main import app
from services.core.errors import ConfigError
from services.core.settings import Settings
from services.ingest.pipeline import IngestPipeline
from services.query import QueryOptions, search, search_many
from services.readers import Document
from services.store import open_store
from services.store.sparse import default_embedder

pytestmark = pytest.mark.integration

DOCS = [
    ("router-e4471", "kb", "network", "If the display shows E4471, hold the power button for ten seconds to reset."),
    ("router-errors", "blog", "network", "Common router error messages and what they mean for your home network."),
    ("wifi-slow", "blog", "network", "Why is my wifi slow? Interference, distance and old hardware explained."),
    ("kitten-post", "kb", "pets", "Give kittens a sisal post so they leave the couch alone."),
    ("furniture-sale", "blog", "home", "Furniture shops stop selling old stock in spring; stop overpaying."),
    ("dog-walk", "kb", "pets", "Dogs need a daily walk; puppies need shorter, more frequent outings."),
    ("bread", "blog", "food", "Knead the dough, let the yeast work for an hour, then bake until golden."),
    ("tides", "kb", "science", "Tides follow the moon: two high waters a day on most coasts."),
]  # fmt: skip
QUERIES = {
    "router error code E4471": "router-e4471",  # lexical: the code is the only signal
    "How can I stop my cat from scratching furniture?": "kitten-post",  # semantic: no shared content word
}
MODES = {
    "dense": QueryOptions(k=5, mode="dense"),
    "sparse": QueryOptions(k=5, mode="sparse"),
    "rrf": QueryOptions(k=5, mode="hybrid", fusion="rrf", rrf_k=60),
    "linear": QueryOptions(k=5, mode="hybrid", fusion="linear", linear_weight=0.5),
}


def _documents() -> list[Document]:
    return [Document(doc_id=i, text=t, title="", source=s, metadata={"topic": topic}) for i, s, topic, t in DOCS]


@pytest.fixture(scope="module")
def hybrid_store(tmp_path_factory: pytest.TempPathFactory, base_towers: Any) -> Any:
    settings = Settings(data_dir=tmp_path_factory.mktemp("hybrid"), collection="hyb")
    store = open_store(settings)
    pipeline = IngestPipeline(store=store, towers=base_towers, chunking=settings.chunk, sparse=default_embedder())
    report = ingest_items(pipeline, _documents())
    assert report.documents == len(DOCS) and not report.failed
    yield store
    store.close()


def _reciprocal_rank(hits: list[Any], doc_id: str) -> float:
    ranks = [i for i, h in enumerate(hits, start=1) if h.passage.doc_id == doc_id]
    return 1.0 / ranks[0] if ranks else 0.0


def test_hybrid_beats_or_ties_the_worse_branch(hybrid_store: Any, base_towers: Any) -> None:
    questions = list(QUERIES)
    mrr = {}
    for name, options in MODES.items():
        hits = search_many(
            questions, store=hybrid_store, towers=base_towers, options=options, sparse=default_embedder()
        )
        mrr[name] = sum(_reciprocal_rank(h, QUERIES[q]) for q, h in zip(questions, hits, strict=True)) / len(questions)
    worse = min(mrr["dense"], mrr["sparse"])
    assert mrr["rrf"] >= worse and mrr["linear"] >= worse, mrr
    # each branch has its blind spot here, and the fusion finds both targets in its top 3
    for name in ("rrf", "linear"):
        for q, target in QUERIES.items():
            top = search(q, store=hybrid_store, towers=base_towers, options=MODES[name], sparse=default_embedder())
            assert target in [h.passage.doc_id for h in top[:3]], (name, q, [h.passage.doc_id for h in top])


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(
    "filters",
    [{"source": "kb"}, {"doc_id": ["router-errors", "wifi-slow", "bread"]}, {"topic": "pets"}],
    ids=["source", "doc_id-any", "metadata"],
)
def test_filters_hold_in_every_mode(hybrid_store: Any, base_towers: Any, mode: str, filters: dict[str, Any]) -> None:
    options = QueryOptions(**{**MODES[mode].__dict__, "filters": filters})
    hits = search(
        "router error cat scratching dough wifi puppies",
        store=hybrid_store, towers=base_towers, options=options, sparse=default_embedder(),
    )  # fmt: skip
    assert hits, (mode, filters)
    for h in hits:
        payload = {"doc_id": h.passage.doc_id, "source": h.passage.source, **h.passage.metadata}
        for key, value in filters.items():
            assert payload[key] in (value if isinstance(value, list) else [value]), (mode, key, payload)


def test_dense_only_collection_says_so_and_refuses(
    tmp_path: Path, base_towers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    settings = Settings(data_dir=data_dir, collection="plain")
    store = open_store(settings)
    try:
        ingest_items(IngestPipeline(store=store, towers=base_towers, chunking=settings.chunk), _documents()[:3])
        assert search("router", store=store, towers=base_towers)  # dense still works
        for mode in ("sparse", "hybrid"):
            with pytest.raises(ConfigError, match="dense-only"):
                search(
                    "router",
                    store=store,
                    towers=base_towers,
                    options=QueryOptions(mode=mode),
                    sparse=default_embedder(),
                )  # type: ignore[arg-type]
    finally:
        store.close()

    monkeypatch.setenv("DPR_DATA_DIR", str(data_dir))
    runner = CliRunner()
    res = runner.invoke(app, ["status", "--collection", "plain", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["sparse"] is False
    res = runner.invoke(app, ["status", "--collection", "plain"])
    assert all(s in res.stdout for s in ("only (no sparse)", "default mode dense", "no BM25")), res.stdout
    res = runner.invoke(app, ["query", "router", "--collection", "plain", "--mode", "hybrid"])
    assert res.exit_code != 0 and "dense-only" in res.stderr
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(json.dumps({"_id": "a", "title": "", "text": "router reset"}) + "\n")
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": "reset?"}) + "\n" for q in "qr"))
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq\ta\t1\nr\ta\t1\n")
    res = runner.invoke(app, ["tune-hybrid", str(beir), "--collection", "plain", "--dev-queries", "1"])
    assert res.exit_code != 0 and "dense-only" in res.stderr
