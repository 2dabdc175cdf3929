"""Documents with structure through the real store and the real base towers: a Markdown file ingested by the CLI
and a paged document (what the PDF reader yields) each find their place on the hit (``page``, ``heading``,
``format``, ``place``) in ``--json`` and the table, and ``--filter page=N`` / ``format=...`` / ``heading=...``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kit.fakes import ingest_items
from typer.testing import CliRunner

from entrypoints.cli.main import app
from services.core.settings import Settings
from services.ingest.pipeline import IngestPipeline
from services.readers import Document, Section
from services.store import open_store
from services.store.sparse import default_embedder

pytestmark = pytest.mark.integration

GUIDE = """\
# Guide

Welcome to the guide of the rocket garden.

## Installing

### On Windows

Run `setup.exe` as **administrator** and follow the wizard to install the rocket garden.

### On Linux

Install the package with apt and start the garden daemon with systemd.

## Watering

Water the tomatoes every morning; the cucumbers need water twice a day in summer.
"""

MANUAL = Document.from_sections(
    "manual.pdf",
    [
        Section("The boiler must be serviced once a year by a licensed engineer.", heading=("Maintenance",), page=11),
        Section("To reset the boiler, hold the red button for ten seconds until the light blinks.",
                heading=("Maintenance", "Reset"), page=12),
        Section("Warranty claims need the receipt and the serial number on the label.", heading=("Warranty",),
                page=30, page_end=31),
    ],
    title="Boiler manual",
    source="manual.pdf",
    format="pdf",
)


def test_hits_show_their_place_and_filters_find_it(tmp_path: Path, base_towers: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "guide.md").write_text(GUIDE, encoding="utf-8")
    monkeypatch.setenv("DPR_DATA_DIR", str(tmp_path / "data"))
    runner = CliRunner()
    res = runner.invoke(app, ["ingest", str(folder), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["chunks"] == 4  # one passage per section with text

    settings = Settings(data_dir=tmp_path / "data")
    store = open_store(settings)
    try:
        pipeline = IngestPipeline(store=store, towers=base_towers, chunking=settings.chunk, sparse=default_embedder())
        assert ingest_items(pipeline, [MANUAL]).chunks == 3
    finally:
        store.close()

    def query(question: str, *args: str) -> list[dict[str, Any]]:
        res = runner.invoke(app, ["query", question, "-k", "3", "--json", *args])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)  # type: ignore[no-any-return]

    top = query("How do I install it on Windows?")[0]
    assert (top["doc_id"], top["heading"], top["format"]) == ("docs/guide.md", ["Guide", "Installing", "On Windows"],
                                                              "md")
    assert top["place"] == "guide.md › Guide › Installing › On Windows" and "page" not in top
    assert "setup.exe" in top["text"] and "**" not in top["text"] and "`" not in top["text"]

    top = query("How do I reset the boiler?")[0]
    assert (top["doc_id"], top["page"], top["format"], top["place"]) == ("manual.pdf", 12, "pdf",
                                                                         "manual.pdf p. 12 › Maintenance › Reset")
    assert [h["page"] for h in query("boiler", "--filter", "page=30")] == [30]
    assert {h["page_end"] for h in query("receipt", "--filter", "format=pdf", "--filter", "page=30")} == {31}
    assert {h["doc_id"] for h in query("water", "--filter", "format=md")} == {"docs/guide.md"}
    assert {tuple(h["heading"]) for h in query("daemon", "--filter", "heading=Installing")} == {
        ("Guide", "Installing", "On Windows"), ("Guide", "Installing", "On Linux")}

    from entrypoints.cli.common import console

    # the table's document column wide enough to hold the place on one line: COLUMNS is read when the console is
    # made unless it was set then (an xdist worker's environment has it), so set the console's own width too
    monkeypatch.setenv("COLUMNS", "240")
    monkeypatch.setattr(console, "_width", 240)
    res = runner.invoke(app, ["query", "How do I reset the boiler?", "-k", "1"])
    assert res.exit_code == 0 and "manual.pdf p. 12 › Maintenance › Reset" in " ".join(res.stdout.split())
