"""API uploads kept for a worker (``filesig.spool``): the reference says so across the task's JSON, and the worker
removes only such a copy, only in its own ``uploads/upload-*`` folder, once its batch ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.readers.filesig import FileRef, release_spooled, spool

pytestmark = pytest.mark.unit


def test_a_spooled_upload_travels_marked_and_is_removed_once(tmp_path: Path) -> None:
    upload = tmp_path / "private" / "manual.pdf"
    upload.parent.mkdir()
    upload.write_bytes(b"%PDF-1.7 not really")
    kept = spool(upload, tmp_path / "data")
    assert not upload.exists() and kept.read_bytes() == b"%PDF-1.7 not really"
    assert kept.parent.parent == tmp_path / "data" / "uploads" and kept.name == "manual.pdf"
    ref = FileRef(doc_id="manual.pdf", text="", source="upload:manual.pdf", format="pdf", path=str(kept), kind="pdf",
                  size=19, spooled=True)
    back = FileRef.from_json(ref.to_json())
    assert back.spooled and back.path == str(kept)
    assert not FileRef.from_json({"file": {**ref.to_json()["file"], "spooled": False}}).spooled

    assert release_spooled([back, back]) == 1
    assert not kept.exists() and not kept.parent.exists()  # its folder went too


def test_nothing_but_a_spooled_copy_in_an_upload_folder_is_removed(tmp_path: Path) -> None:
    mine = tmp_path / "docs" / "manual.pdf"
    mine.parent.mkdir()
    mine.write_bytes(b"%PDF-1.7")
    by_path = FileRef(doc_id="manual.pdf", text="", source=str(mine), format="pdf", path=str(mine), kind="pdf")
    claimed = FileRef(doc_id="manual.pdf", text="", source=str(mine), format="pdf", path=str(mine), kind="pdf",
                      spooled=True)  # a task claiming a user's file was spooled: not in uploads/upload-*, kept
    assert release_spooled([by_path, claimed]) == 0
    assert mine.exists()
