"""The parser sandbox with a real child process: a parser that segfaults, aborts or hangs costs its document
(``parser_crashed`` / ``timeout``), the rest of the folder is read, and crashed bytes are never parsed twice."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kit.documents import make_pdf

from services.core.settings import DocumentSettings
from services.readers import Document, DocumentFailure, iter_documents
from services.readers.sandbox import ParserSandbox

pytestmark = pytest.mark.integration
HOSTILE = {"pdf": "kit.hostile_readers:by_name"}


def _run(folder: Path, sandbox: ParserSandbox) -> tuple[list[str], dict[str, DocumentFailure]]:
    items = list(iter_documents([folder], limits=sandbox.limits, sandbox=sandbox))
    docs = [Path(i.source).name for i in items if isinstance(i, Document)]
    failures = {Path(i.source).name: i for i in items if isinstance(i, DocumentFailure)}
    return docs, failures


def test_a_crashing_parser_costs_one_document_and_is_quarantined(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in ("a.pdf", "b-crash.pdf", "c-abort.pdf", "d.pdf"):
        make_pdf(folder / name, [f"words of {name}"])
    with ParserSandbox(DocumentSettings(), readers=HOSTILE) as sandbox:
        docs, failures = _run(folder, sandbox)
        assert docs == ["a.pdf", "d.pdf"]
        assert failures["b-crash.pdf"].reason == "parser_crashed" and "SIGSEGV" in failures["b-crash.pdf"].error
        assert failures["c-abort.pdf"].reason == "parser_crashed" and "SIGABRT" in failures["c-abort.pdf"].error
        started = sandbox.started
        again = tmp_path / "again"
        again.mkdir()
        shutil.copy(folder / "b-crash.pdf", again / "b-crash.pdf")  # the same bytes, read a second time
        docs, failures = _run(again, sandbox)
        assert docs == [] and "quarantined" in failures["b-crash.pdf"].error
        assert sandbox.started == started  # no parser was started for it: it never reached one


def test_a_hanging_parser_is_cut_at_the_time_limit(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in ("a-hang.pdf", "b.pdf"):
        make_pdf(folder / name, [f"words of {name}"])
    with ParserSandbox(DocumentSettings(parse_timeout_s=3), readers=HOSTILE) as sandbox:
        docs, failures = _run(folder, sandbox)
    assert docs == ["b.pdf"]
    assert failures["a-hang.pdf"].reason == "timeout"
    assert "DPR_DOCUMENTS__PARSE_TIMEOUT_S" in failures["a-hang.pdf"].error
