"""The in-process pipeline end to end: real base towers, real embedded Qdrant engine, real BM25 sparse vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.documents import write_folder
from kit.fakes import CountingTowers, ingest_items
from typer.testing import CliRunner

from entrypoints.cli.main import app
from services.core.errors import ModelMismatch
from services.core.settings import Settings
from services.ingest.pipeline import IngestPipeline, chunk_document
from services.query import QueryOptions, search
from services.readers import Document, iter_documents
from services.store import open_store
from services.store.points import point_id
from services.store.sparse import default_embedder

pytestmark = pytest.mark.integration

DOCS = {
    "cats.md": "# Cats\n\nCats are small domesticated carnivores. They purr when content and hunt mice at night.",
    "rivers.md": "# Rivers\n\nThe Nile is the longest river in Africa and flows north into the Mediterranean Sea.",
    "python.md": "# Python\n\nPython is a programming language. Use `with open(path) as f: for line in f:` to read "
    "a file line by line.",
}


def _ingest(settings: Settings, towers: Any, folder: Path) -> Any:
    store = open_store(settings)
    try:
        pipeline = IngestPipeline(store=store, towers=towers, chunking=settings.chunk, sparse=default_embedder())
        return ingest_items(pipeline, iter_documents([folder]))
    finally:
        store.close()


def test_ingest_reingest_change_and_query(tmp_path: Path, base_towers: Any) -> None:
    settings = Settings(data_dir=tmp_path / "data", collection="t1")
    folder = write_folder(tmp_path / "corpus", DOCS)
    towers = CountingTowers(base_towers)

    first = _ingest(settings, towers, folder)
    assert (first.documents, first.unchanged, first.failed) == (3, 0, [])
    assert first.chunks == towers.encoded == 3

    again = _ingest(settings, towers, folder)
    assert (again.documents, again.unchanged, again.chunks) == (0, 3, 0)
    assert towers.encoded == 3, "unchanged documents must cost no encoder work"

    # a changed document: long enough for several chunks first, then short: its stale chunks must go
    (folder / "rivers.md").write_text("# Rivers\n\n" + " ".join(f"river{i} flows" for i in range(600)))
    grown = _ingest(settings, towers, folder)
    store = open_store(settings)
    try:
        n_long = store.doc_states(["corpus/rivers.md"])["corpus/rivers.md"].chunks
        assert grown.documents == 1 and n_long > 2
        (folder / "rivers.md").write_text(DOCS["rivers.md"])
    finally:
        store.close()
    _ingest(settings, towers, folder)
    store = open_store(settings)
    try:
        assert store.count() == 3
        expected = {point_id(f"corpus/{name}", 0) for name in DOCS}
        assert {p.id for batch in store.scroll() for p in batch} == expected
        hits = search("How can I read a file one line at a time?", store=store, towers=base_towers,
                      sparse=default_embedder())
        assert hits[0].passage.doc_id == "corpus/python.md"
        assert hits[0].passage.model == base_towers.fingerprint
        sparse_hits = search("longest river Africa", store=store, towers=base_towers, sparse=default_embedder(),
                             options=QueryOptions(mode="sparse"))
        assert sparse_hits[0].passage.doc_id == "corpus/rivers.md"
        filtered = search("animals", store=store, towers=base_towers, sparse=default_embedder(),
                          options=QueryOptions(filters={"doc_id": "corpus/rivers.md"}))
        assert {h.passage.doc_id for h in filtered} == {"corpus/rivers.md"}
    finally:
        store.close()


def test_query_with_a_foreign_model_is_refused(tmp_path: Path, base_towers: Any) -> None:
    settings = Settings(data_dir=tmp_path / "data", collection="t2")
    folder = write_folder(tmp_path / "corpus", {"a.md": "alpha"})
    _ingest(settings, base_towers, folder)

    class OtherModel(CountingTowers):
        @property
        def fingerprint(self) -> str:
            return "someothermodel00"

    store = open_store(settings)
    try:
        with pytest.raises(ModelMismatch, match="someothermodel00"):
            search("alpha", store=store, towers=OtherModel(base_towers))
        with pytest.raises(ModelMismatch):
            ingest_items(IngestPipeline(store=store, towers=OtherModel(base_towers), chunking=settings.chunk),
                         [Document(doc_id="b", text="beta")])
    finally:
        store.close()


def test_real_tokenizer_never_truncates(base_towers: Any) -> None:
    text = " ".join(["Internationalization-oriented supercalifragilistic tokenization, (with) punctuation!"] * 400)
    doc = Document(doc_id="long", text=text, title="A title that is a little long " * 3)
    chunks, _ = chunk_document(doc, base_towers, Settings().chunk)
    limit = base_towers.model.max_seq_length
    assert len(chunks) > 5
    for c in chunks:
        n = len(base_towers.tokenizer(c.encoder_text, add_special_tokens=True)["input_ids"])
        assert n <= limit


def test_cli_ingest_query_status_delete_json(tmp_path: Path, base_towers: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = write_folder(tmp_path / "corpus", {**DOCS, "bad.txt": "caf\xe9"})
    (folder / "bad.txt").write_bytes("caf\xe9".encode("latin-1"))
    monkeypatch.setenv("DPR_DATA_DIR", str(tmp_path / "cli"))
    runner = CliRunner()
    res = runner.invoke(app, ["ingest", str(folder), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["documents"] == 3 and summary["chunks"] == 3
    assert [f["reason"] for f in summary["failed"]] == ["encoding"]

    res = runner.invoke(app, ["query", "Which river is the longest in Africa?", "-k", "2", "--json"])
    assert res.exit_code == 0, res.output
    hits = json.loads(res.stdout)
    assert hits[0]["doc_id"] == "corpus/rivers.md"
    assert set(hits[0]) >= {"doc_id", "chunk_index", "score", "title", "text", "model"}

    res = runner.invoke(app, ["status", "--json"])
    status = json.loads(res.stdout)
    assert status["points"] == 3 and status["model"] == base_towers.fingerprint and status["model_matches"]

    res = runner.invoke(app, ["delete", "corpus/rivers.md", "--json"])
    assert json.loads(res.stdout)["points_deleted"] == 1

    res = runner.invoke(app, ["query", "x", "--collection", "nope", "--json"])
    assert res.exit_code != 0 and "ingest something first" in res.stderr
