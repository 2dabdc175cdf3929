"""Hybrid tuning without a real model: grid, selection, dev-split refusals, the full tune over a real embedded store
with hashing towers, and the stored choice picked up by ``services.query.resolve_request``."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit.fakes import HashTowers, ingest_items

from encoders import data as d
from services import readers
from services.core.errors import CollectionNotFound, ConfigError
from services.core.settings import Settings
from services.ingest.pipeline import IngestPipeline, collection_spec
from services.lab.evaluation.store_retriever import dataset_documents
from services.lab.hybrid.tuning import FusionChoice, fusion_grid, select_best, tune_hybrid, tuning_metrics
from services.query import QueryOptions, resolve_request
from services.store import Store, open_store
from services.store.sparse import default_embedder

pytestmark = pytest.mark.unit


TOPICS = ["volcano lava eruption", "honey bees pollen", "glacier ice melt", "tidal ocean waves", "desert sand dunes",
          "rainforest canopy birds", "copper wire current", "bread yeast dough", "chess opening gambit",
          "violin string bow", "comet tail orbit", "coral reef fish"]  # fmt: skip


def write_beir(root: Path) -> Path:
    folder = root / "beir"
    (folder / "qrels").mkdir(parents=True)
    with gzip.open(folder / "corpus.jsonl.gz", "wt", encoding="utf-8") as f:
        for i, topic in enumerate(TOPICS):
            f.write(json.dumps({"_id": f"d{i}", "title": topic.split()[0], "text": f"A note about {topic}."}) + "\n")
    queries, train, test = [], [], []
    for i, topic in enumerate(TOPICS):
        for j, word in enumerate(topic.split()):
            qid = f"q{i}-{j}"
            queries.append({"_id": qid, "text": f"what about {word}?"})
            (test if j == 2 else train).append(f"{qid}\td{i}\t1")
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for name, rows in (("train", train), ("test", test)):
        (folder / "qrels" / f"{name}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return folder


def write_squad(root: Path) -> Path:
    articles = []
    for i, topic in enumerate(TOPICS):
        qas = [{"id": f"s{i}", "question": f"Which {topic.split()[1]}?", "answers": [{"text": topic.split()[0]}]}]
        articles.append({"title": f"Article_{i}", "paragraphs": [{"context": f"The {topic} story.", "qas": qas}]})
    path = root / "squad.json"
    path.write_text(json.dumps({"data": articles}))
    return path


# --- grid and selection --------------------------------------------------------------------------------------------


def test_grid_is_rrf_then_linear_weights() -> None:
    grid = fusion_grid()
    assert [c.rrf_k for c in grid if c.fusion == "rrf"] == [10, 30, 60, 100]
    assert [c.linear_weight for c in grid if c.fusion == "linear"] == [i / 10 for i in range(11)]
    assert all(c.candidates == 100 for c in grid) and len(grid) == 15
    assert len(fusion_grid(rrf_ks=[60], weights=[0.5], candidates=[50, 200])) == 4
    with pytest.raises(ConfigError):
        fusion_grid(rrf_ks=[], weights=[])


def test_select_best_metric_then_tie_breaker_then_grid_order() -> None:
    a, b, c = FusionChoice("rrf", rrf_k=60), FusionChoice("linear", linear_weight=0.3), FusionChoice("linear")
    assert (
        select_best([(a, {"m": 0.5, "t": 0.1}), (b, {"m": 0.7, "t": 0.0}), (c, {"m": 0.6, "t": 0.9})], "m", "t")[0] == b
    )
    assert select_best([(a, {"m": 0.7, "t": 0.1}), (b, {"m": 0.7, "t": 0.2})], "m", "t")[0] == b
    assert select_best([(a, {"m": 0.7, "t": 0.2}), (b, {"m": 0.7, "t": 0.2})], "m", "t")[0] == a
    with pytest.raises(ConfigError):
        select_best([], "m", "t")


def test_tuning_metric_is_answer_accuracy_for_squad(tmp_path: Path) -> None:
    assert tuning_metrics(readers.load_squad(write_squad(tmp_path), "train")) == ("answer@20", "ndcg@10")
    assert tuning_metrics(readers.load_beir(write_beir(tmp_path), "train")) == ("ndcg@10", "recall@100")


# --- dev split -----------------------------------------------------------------------------------------------------


def test_dev_split_refuses_test(tmp_path: Path) -> None:
    beir, squad = write_beir(tmp_path), write_squad(tmp_path)
    with pytest.raises(ConfigError, match="refusing to choose on the test split"):
        readers.load_dev_split(beir, "test", "beir")
    with pytest.raises(ConfigError, match="refusing to choose on the test split"):
        readers.load_dev_split(squad, "test", "squad")
    with pytest.raises(ConfigError, match="train side of the article split"):
        readers.load_dev_split(squad, "all", "squad")


def test_dev_split_is_a_seeded_subset_of_training_questions(tmp_path: Path) -> None:
    beir = write_beir(tmp_path)
    dev = readers.load_dev_split(beir, "train", "beir", dev_queries=5)
    train = readers.load_beir(beir, "train")
    test = readers.load_beir(beir, "test")
    assert len(dev.queries) == 5 and set(dev.queries) <= set(train.queries)
    assert not set(dev.queries) & set(test.queries)
    assert dev.queries == readers.load_dev_split(beir, "train", "beir", dev_queries=5).queries  # deterministic
    # the same held-out questions `dpr train` keeps out of training (seed 13)
    assert sorted(dev.queries) == d.split_dev_queries(sorted(train.queries), 5, seed=13)[1]

    squad = write_squad(tmp_path)
    sdev = readers.load_dev_split(squad, "train", "squad", dev_queries=3)
    assert set(sdev.corpus) == set(readers.load_squad(squad, "train").corpus)  # train-side paragraphs only
    assert not set(sdev.corpus) & set(readers.load_squad(squad, "test").corpus)


def test_training_holds_out_the_same_dev_split(tmp_path: Path) -> None:
    """`dpr train`'s dev questions are the ones `dpr tune-hybrid` and `dpr eval --dev-queries` read, and never
    become training pairs."""
    from services.lab.towers.recipe import TrainingData, build_training_set

    beir = write_beir(tmp_path)
    training = build_training_set(_settings(tmp_path), TrainingData(data=beir, fmt="beir", dev_queries=5))
    dev = readers.load_dev_split(beir, "train", "beir", dev_queries=5)
    assert training.dev is not None and training.dev.queries == dev.queries and training.dev.name == dev.name
    assert not {p.question for p in training.pairs} & set(dev.queries.values())
    rest, held = readers.load_beir(beir, "train").held_out(5)
    assert held.queries == dev.queries and set(rest.queries) | set(held.queries) == set(readers.load_beir(
        beir, "train").queries) and not set(rest.queries) & set(held.queries)
    assert readers.load_beir(beir, "train").held_out(0)[1].queries == {}


def test_cli_eval_on_the_dev_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from entrypoints.cli.main import app

    beir = write_beir(tmp_path)
    monkeypatch.setenv("DPR_DATA_DIR", str(tmp_path / "cli"))
    runner = CliRunner()
    res = runner.invoke(app, ["eval", str(beir), "--bm25", "--in-memory", "--dev-queries", "5", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    dev = readers.load_dev_split(beir, "train", "beir", dev_queries=5)
    assert out["dataset"] == dev.name and out["queries"] == 5
    res = runner.invoke(app, ["eval", str(beir), "--bm25", "--in-memory", "--json"])  # no flag: the test split
    assert res.exit_code == 0 and json.loads(res.stdout)["queries"] == len(readers.load_beir(beir, "test").queries)
    res = runner.invoke(app, ["eval", str(beir), "--bm25", "--split", "test", "--dev-queries", "5"])
    assert res.exit_code == 2 and "refusing to choose on the test split" in res.output


# --- the whole tune over a real embedded store ----------------------------------------------------------------------


def _settings(tmp_path: Path, collection: str = "mine") -> Settings:
    return Settings(data_dir=tmp_path / "data", collection=collection)


Tuning = tuple[Path, Settings, Store]


@pytest.fixture
def tuning(tmp_path: Path) -> Iterator[Tuning]:
    """A tune's BEIR folder, settings and real embedded store (closed at the end)."""
    settings = _settings(tmp_path)
    target = open_store(settings)
    yield write_beir(tmp_path), settings, target
    target.close()


def test_tune_writes_settings_that_queries_pick_up(tmp_path: Path, tuning: Tuning) -> None:
    (beir, settings, target), towers = tuning, HashTowers()
    dev = readers.load_dev_split(beir, "train", "beir", dev_queries=8)
    with pytest.raises(CollectionNotFound, match="ingest your documents first"):
        tune_hybrid(dev, towers=towers, settings=settings, target=target)
    # the user's collection holds other documents: tuning ingests the dev corpus into a temporary collection
    target.ensure_collection(collection_spec(towers, sparse=True))
    points: list[str] = []
    result = tune_hybrid(
        dev,
        towers=towers,
        settings=settings,
        target=target,
        workdir=tmp_path,
        on_point=lambda n, m: points.append(n),
    )
    assert not result.reused_collection and result.tuned_on["corpus"] == "temporary collection"
    assert points[:2] == ["dense", "bm25 (sparse)"] and len(points) == 17
    assert result.dev_score == max(m["ndcg@10"] for _, m in result.grid)
    assert list(tmp_path.glob("dpr-eval-*")) == []  # the temporary collection is gone

    spec = target.info().active.spec  # type: ignore[union-attr]
    assert spec.settings["mode"] == "hybrid"
    tuned = spec.settings["hybrid"]
    assert tuned["tuned_on"]["dataset"] == dev.name and tuned["tuned_on"]["queries"] == 8
    assert {"dev_score", "dense_score", "sparse_score", "metric"} <= set(tuned)

    request = resolve_request(spec, QueryOptions(k=5), target.alias)
    choice = result.choice
    assert (request.mode, request.fusion, request.candidates) == ("hybrid", choice.fusion, choice.candidates)
    assert (request.rrf_k, request.linear_weight) == (choice.rrf_k, choice.linear_weight)
    # explicit options still win over the tuned ones
    forced = resolve_request(spec, QueryOptions(k=5, mode="dense", fusion="linear", linear_weight=0.2), "x")
    assert (forced.mode, forced.fusion, forced.linear_weight) == ("dense", "linear", 0.2)


def test_tune_reuses_a_collection_holding_the_corpus(tmp_path: Path, tuning: Tuning) -> None:
    (beir, settings, target), towers = tuning, HashTowers()
    dev = readers.load_dev_split(beir, "train", "beir", dev_queries=6)
    pipeline = IngestPipeline(store=target, towers=towers, chunking=settings.chunk, sparse=default_embedder())
    report = ingest_items(pipeline, dataset_documents(dev))
    # where the ingest's time went, step by step (`dpr ingest --json` reports them)
    assert min(report.encode_seconds, report.upsert_seconds, report.chunk_seconds, report.sparse_seconds) > 0
    assert {"encode_seconds", "upsert_seconds", "chunk_seconds", "sparse_seconds"} <= set(report.to_json())
    result = tune_hybrid(dev, towers=towers, settings=settings, target=target, workdir=tmp_path)
    assert result.reused_collection and result.tuned_on["corpus"] == "collection mine"
    assert target.count() == len(TOPICS)  # nothing added, nothing deleted
    assert target.info().active.spec.settings["hybrid"]["fusion"] == result.choice.fusion  # type: ignore[union-attr]


def test_tune_refuses_a_dense_only_collection(tuning: Tuning) -> None:
    (beir, settings, target), towers = tuning, HashTowers()
    target.ensure_collection(collection_spec(towers, sparse=False))
    with pytest.raises(ConfigError, match="dense-only"):
        tune_hybrid(readers.load_dev_split(beir), towers=towers, settings=settings, target=target)
    spec = target.info().active.spec  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="dense-only"):
        resolve_request(spec, QueryOptions(mode="hybrid"), target.alias)
