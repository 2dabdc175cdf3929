"""Feedback and BM25 statistics through the real pipeline: real base towers, the embedded store in a data dir,
real BM25 vectors. The ingest leaves the generation's own average passage length in its stats record; a
judgement names a real passage, shows in `dpr status`, survives a re-ingest of its document, and
`dpr feedback export` writes it as a labelled pair read from the store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.documents import THREE_TOPICS
from kit.fakes import ingest_items
from typer.testing import CliRunner

from entrypoints.cli.main import app
from services import feedback
from services.core.settings import Settings
from services.ingest.pipeline import IngestPipeline
from services.readers import Document
from services.store import open_store
from services.store.sparse import default_embedder

pytestmark = pytest.mark.integration


def _ingest(settings: Settings, towers: Any, docs: list[Document]) -> None:
    store = open_store(settings)
    try:
        pipeline = IngestPipeline(store=store, towers=towers, chunking=settings.chunk, sparse=default_embedder())
        ingest_items(pipeline, docs)
        store.maybe_optimize()
    finally:
        store.close()


def test_stats_judgements_status_and_export(tmp_path: Path, base_towers: Any) -> None:
    settings = Settings(data_dir=tmp_path / "data", collection="fb")
    _ingest(settings, base_towers, THREE_TOPICS)
    store = open_store(settings)
    try:
        passages = [p for batch in store.scroll() for p in batch]
        enc = default_embedder()
        lengths = [sum(enc.term_counts(f"{p.title}\n{p.text}").values()) for p in passages]
        stats = store.bm25_stats()
        assert stats.passages == len(passages) == 3 and stats.avg_len == pytest.approx(sum(lengths) / 3)
        with feedback.FeedbackStore.in_data_dir(settings.data_dir) as judgements:
            judgements.record("fb", "Which river flows north?", *feedback.resolve(store, doc_id="nile", chunk=0), True)
            judgements.record("fb", "Which river flows north?", *feedback.resolve(store, doc_id="cats", chunk=0),
                              False)
    finally:
        store.close()
    _ingest(settings, base_towers, [Document(doc_id="nile", title="Rivers", source="t",
                                             text="The Nile flows north through Egypt into the Mediterranean.")])
    env = {"DPR_DATA_DIR": str(settings.data_dir), "DPR_COLLECTION": "fb"}
    runner = CliRunner()
    status = runner.invoke(app, ["status", "--json"], env=env)
    assert status.exit_code == 0, status.output
    assert json.loads(status.output)["feedback"] == {"judgements": 2, "relevant": 1, "not_relevant": 1,
                                                     "questions": 1}
    out = tmp_path / "pairs.jsonl"
    done = runner.invoke(app, ["feedback", "export", "--out", str(out), "--json"], env=env)
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["questions"] == 1
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows[0]["question"] == "Which river flows north?"
    assert [p["id"] for p in rows[0]["positives"]] == ["nile#0"] and "Egypt" in rows[0]["positives"][0]["text"]
    assert [n["id"] for n in rows[0]["negatives"]] == ["cats#0"]
