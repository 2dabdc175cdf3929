"""`dpr ingest` on a folder of real binary documents (written by their own libraries) and hostile ones, through the
real store and the base towers: every readable one written with its place, every hostile one a failure with its
reason, and a run that reads nothing at all exits 1 saying so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kit.documents import make_docx, make_pdf, make_pptx
from typer.testing import CliRunner

from entrypoints.cli.main import app

pytestmark = pytest.mark.integration


def test_a_folder_of_documents_and_hostile_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    make_pdf(folder / "boiler.pdf", ["Contents", "To reset the boiler, hold the red button for ten seconds."],
             outline=[("Maintenance", 1)])
    make_docx(folder / "guide.docx")
    make_pptx(folder / "deck.pptx")
    make_pdf(folder / "locked.pdf", ["secret plans"], password="pw")
    make_pdf(folder / "scan.pdf", [""])
    (folder / "page.pdf").write_text("not a pdf at all")
    monkeypatch.setenv("DPR_DATA_DIR", str(tmp_path / "data"))
    runner = CliRunner()
    res = runner.invoke(app, ["ingest", str(folder), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["documents"] == 3
    assert {Path(f["source"]).name: f["reason"] for f in report["failed"]} == {
        "locked.pdf": "encrypted", "scan.pdf": "no_text_layer", "page.pdf": "mislabelled"}

    res = runner.invoke(app, ["query", "how do I reset the boiler", "-k", "1", "--json"])
    assert res.exit_code == 0, res.output
    hit = json.loads(res.stdout)[0]
    assert hit["doc_id"] == "docs/boiler.pdf" and hit.get("page") == 2


def test_a_run_that_reads_nothing_is_not_a_success(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "sheets"
    folder.mkdir()
    (folder / "a.csv").write_text("a,b\n1,2\n")
    monkeypatch.setenv("DPR_DATA_DIR", str(tmp_path / "data"))
    res = CliRunner().invoke(app, ["ingest", str(folder)])
    assert res.exit_code == 1
    assert "nothing was read" in res.stderr and ".pdf" in res.output
