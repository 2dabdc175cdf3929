"""Every passage carries where it came from (page, page range, heading path, format) in its payload and its hits,
and filters find it; a document without structure is stored exactly as before (same payload keys, same ids)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from kit.fakes import FakeRuntime, HashTowers, ingest_items

from entrypoints.api.app import create_app
from services.core.settings import Settings
from services.ingest.chunking import Chunk
from services.lifecycle.copy import embed_passages
from services.query import QueryOptions
from services.readers.records import Document, Section
from services.store.points import Passage, place_label, point_id

pytestmark = pytest.mark.unit

MANUAL = Document.from_sections(
    "docs/manual.pdf",
    [
        Section("Run the installer as administrator and follow the wizard.", heading=("Installing", "On Windows"),
                page=12),
        Section("Install the package with apt and start the service daemon.", heading=("Installing", "On Linux"),
                page=13, page_end=14),
    ],
    title="Manual",
    source="/data/docs/manual.pdf",
    format="pdf",
)
PLAIN = Document(doc_id="notes", text="Tides follow the moon; rivers run to the sea.", title="Notes")


def test_hits_carry_their_place_and_filters_find_it() -> None:
    with FakeRuntime() as runtime:
        report = ingest_items(runtime.pipeline, [MANUAL, PLAIN])
        assert (report.documents, report.chunks) == (2, 3)
        hits = [h.to_json() for h in runtime.search("installer wizard administrator", QueryOptions(k=3))]
        top = hits[0]
        assert (top["doc_id"], top["page"], top["heading"], top["format"]) == (
            "docs/manual.pdf", 12, ["Installing", "On Windows"], "pdf")
        assert "page_end" not in top and top["place"] == "manual.pdf p. 12 › Installing › On Windows"
        plain = next(h for h in hits if h["doc_id"] == "notes")
        assert not {"page", "page_end", "heading", "format", "place"} & set(plain)

        def found(**filters: object) -> list[tuple[str, int]]:
            got = runtime.search("install", QueryOptions(k=10, filters=dict(filters)))
            return sorted((h.passage.doc_id, h.passage.page or 0) for h in got)

        assert found(page=13) == [("docs/manual.pdf", 13)]
        assert found(page_end=14) == [("docs/manual.pdf", 13)]
        assert found(format="pdf") == [("docs/manual.pdf", 12), ("docs/manual.pdf", 13)]
        assert found(heading="On Linux") == [("docs/manual.pdf", 13)]  # any heading of the path matches
        assert found(heading="Installing", page=12) == [("docs/manual.pdf", 12)]
        assert found(format="docx") == []
        # unchanged on a second ingest: no encoder work, the places stay
        towers = runtime.towers
        assert isinstance(towers, HashTowers)
        before = towers.encoded
        again = ingest_items(runtime.pipeline, [MANUAL, PLAIN])
        assert (again.unchanged, towers.encoded) == (2, before)


def test_a_document_without_structure_stores_what_it_always_did() -> None:
    passage = Passage(doc_id="notes", chunk_index=0, text="t", title="T", metadata={"lang": "en"})
    assert set(passage.to_payload()) == {"lang", "doc_id", "chunk_index", "title", "text", "text_hash", "doc_hash",
                                         "source", "ingested_at", "model"}
    assert passage.id == point_id("notes", 0) and passage.place == ""
    # a record's own metadata named like a place field stays its metadata when it is not of the place's type
    odd = Passage.from_payload({**passage.to_payload(), "page": "iv", "heading": "Intro"})
    assert (odd.page, odd.heading, odd.metadata["page"], odd.metadata["heading"]) == (None, (), "iv", "Intro")
    placed = Passage(doc_id="a/g.docx", chunk_index=1, text="t", heading=("A", "B"), format="docx", page=3,
                     page_end=4)
    assert Passage.from_payload(placed.to_payload()) == placed


def test_place_labels() -> None:
    assert place_label("docs/manual.pdf", 112, None, ()) == "manual.pdf p. 112"
    assert place_label("docs/manual.pdf", 12, 13, ("Setup",)) == "manual.pdf pp. 12-13 › Setup"
    assert place_label("guide.docx", None, None, ("Installing", "On Windows")) == "guide.docx › Installing › On Windows"
    assert place_label("x", None, None, ()) == ""


def test_reembed_reads_what_ingest_read() -> None:
    towers = HashTowers()
    passage = Passage(doc_id="d", chunk_index=0, text="body text", title="Guide", heading=("Guide", "Setup"))
    chunk = Chunk(index=0, text="body text", title="Guide", heading=("Guide", "Setup"))
    assert chunk.encoder_text == "Guide › Setup\nbody text"
    [point] = embed_passages([passage], towers, None)
    assert list(point.dense) == towers.encode_documents([chunk.encoder_text])[0].tolist()


def test_the_api_search_response_carries_the_place(tmp_path: Path) -> None:
    runtime = FakeRuntime()
    ingest_items(runtime.pipeline, [MANUAL, PLAIN])
    app = create_app(Settings(data_dir=tmp_path / "dpr"), runtime=runtime, warm_model=False)
    with TestClient(app) as client:
        body = {"question": "package apt daemon", "k": 2, "filters": {"page": 13, "format": "pdf"}}
        hits = client.post("/v1/search", json=body).json()["hits"]
        assert [(h["page"], h["page_end"], h["heading"], h["format"], h["place"]) for h in hits] == [
            (13, 14, ["Installing", "On Linux"], "pdf", "manual.pdf pp. 13-14 › Installing › On Linux")]
        plain = client.post("/v1/search", json={"question": "tides moon", "k": 1}).json()["hits"][0]
        assert plain["doc_id"] == "notes" and not {"page", "page_end", "heading", "format", "place"} & set(plain)
