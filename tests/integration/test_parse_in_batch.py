"""Binary files parsed inside the batch, in-process (the real edge store, base towers, parser sandbox): the
walk hands over unparsed references, the batch parses them (the next batch's files on a thread while this one
encodes), a re-ingest of unchanged files parses nothing, and a changed file's removed pages leave the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kit.documents import make_pdf

from services.core.settings import Settings
from services.ingest.executor import LocalExecutor
from services.readers import iter_documents
from services.runtime import Runtime
from services.store.sparse import default_embedder

pytestmark = pytest.mark.integration

PAGES = [
    "The boiler must be serviced once a year by a licensed engineer.",
    "To reset the boiler, hold the red button for ten seconds until the light blinks.",
    "Warranty claims need the receipt and the serial number printed on the label.",
]


def _ingest(runtime: Runtime, folder: Path) -> dict[str, Any]:
    executor = LocalExecutor(runtime.jobs, lambda _: runtime.pipeline)
    items = iter_documents([folder], limits=runtime.settings.documents, defer_binary=True)
    return runtime.jobs.status(executor.submit(items, collection=runtime.settings.collection).job)


def _parses(log: Path) -> list[str]:
    return [line.split("\t")[1] for line in log.read_text().splitlines()] if log.exists() else []


def test_unchanged_files_are_not_parsed_and_removed_pages_leave(tmp_path: Path, base_towers: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    make_pdf(folder / "boiler.pdf", PAGES)
    for i in range(4):  # several batches, so the next batch parses while one encodes
        make_pdf(folder / f"other-{i}.pdf", [f"Leaflet {i} about garden tool number {i}."])
    (folder / "notes.md").write_text("# Notes\n\nThe heat pump is quiet at night.\n", encoding="utf-8")
    log = tmp_path / "parse.log"
    monkeypatch.setenv("DPR_PARSE_LOG", str(log))
    settings = Settings(data_dir=tmp_path / "data", collection="inbatch", celery={"batch_documents": 2})
    with Runtime(settings, towers=base_towers, sparse=default_embedder()) as runtime:
        first = _ingest(runtime, folder)
        assert first["state"] == "done" and first["failed"] == []
        assert (first["documents"], first["parsed"]) == (6, 5)
        assert sorted(_parses(log)) == sorted(f"docs/{n}.pdf" for n in ["boiler", *(f"other-{i}" for i in range(4))])
        boiler = [p for batch in runtime.store.scroll() for p in batch if p.doc_id == "docs/boiler.pdf"]
        assert min(p.page or 0 for p in boiler) == 1 and max(p.page_end or p.page or 0 for p in boiler) == 3
        assert any("red button" in p.text for p in boiler)

        log.unlink()
        again = _ingest(runtime, folder)
        assert (again["documents"], again["unchanged"], again["parsed"], again["chunks"]) == (0, 6, 0, 0)
        assert _parses(log) == []  # no parser ran for any of them

        (folder / "other-0.pdf").touch()  # a new mtime, the same bytes: still not parsed
        make_pdf(folder / "boiler.pdf", PAGES[:1])  # the boiler manual loses its last two pages
        third = _ingest(runtime, folder)
        assert (third["documents"], third["unchanged"], third["parsed"]) == (1, 5, 1)
        assert _parses(log) == ["docs/boiler.pdf"]
        boiler = [p for batch in runtime.store.scroll() for p in batch if p.doc_id == "docs/boiler.pdf"]
        assert {(p.page, p.page_end or p.page) for p in boiler} == {(1, 1)}
        assert all("red button" not in p.text for p in boiler)
        assert all(p.metadata.get("file_sig") for p in boiler)
