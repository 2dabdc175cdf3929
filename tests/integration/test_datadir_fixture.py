"""A data dir written by the release before format versions (tests/fixtures/datadir-v1, see its SOURCE.md) opens
in this release as format 1 and answers exactly what it answered then; its first write stamps FORMAT."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from kit.fakes import ingest_items

from services.core import datadir
from services.core.settings import Settings
from services.query import QueryOptions
from services.runtime import Runtime

pytestmark = pytest.mark.integration

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "datadir-v1"


def _extract(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURE / "datadir.tar.xz") as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "data"


def test_the_v1_fixture_opens_and_answers_as_recorded(tmp_path: Path, base_towers: Any) -> None:
    expected = json.loads((FIXTURE / "expected.json").read_text())
    data = _extract(tmp_path)
    state = datadir.check(data)
    assert (state.format, state.recorded) == (1, False)

    settings = Settings(data_dir=data, encoder={"backend": "torch"})
    with Runtime(settings, towers=base_towers) as runtime:
        info = runtime.store.info()
        assert info.active is not None
        assert (info.active.name, info.active.count, info.active.spec.model) == (
            expected["generation"], expected["points"], expected["model"])
        passages = sorted([p.doc_id, p.chunk_index, p.doc_hash] for b in runtime.store.scroll() for p in b)
        assert passages == expected["passages"]
        for mode, questions in expected["questions"].items():
            for question, hits in questions.items():
                fusion = "rrf" if mode == "hybrid" else None  # recorded with the fusion hybrid had by default then
                got = runtime.search(question, QueryOptions(k=3, mode=mode, fusion=fusion))
                assert [h.passage.doc_id for h in got] == [doc for doc, _ in hits], (mode, question)
                scores, recorded = [round(h.score, 4) for h in got], [s for _, s in hits]
                if mode == "sparse" and _repeats_a_word(question):  # counted once then, as often as said since
                    assert all(a > b for a, b in zip(scores, recorded, strict=True)), (question, scores, recorded)
                    continue
                assert scores == pytest.approx(recorded, abs=2e-4)
        assert not (data / "FORMAT").exists(), "opening and reading must not write the data dir"
        ingest_items(runtime.pipeline, [_doc("new", "A brand new document about lighthouses and their keepers.")])
        assert runtime.store.count() == expected["points"] + 1
    assert json.loads((data / "FORMAT").read_text())["format"] == datadir.CURRENT


def _repeats_a_word(question: str) -> bool:
    """Since ec31651 a question's repeated words count as often as they are said (BM25 as Lucene and bm25s define
    it); this release's BM25 scores such a question higher than the recorded release did, other questions the same."""
    from services.store.sparse import default_embedder

    return any(count > 1 for count in default_embedder().term_counts(question).values())


def _doc(doc_id: str, text: str) -> Any:
    from services.readers import Document

    return Document(doc_id=doc_id, text=text)
