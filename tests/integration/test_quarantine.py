"""The crash quarantine outlives the process (real parser child, real crashes): bytes that crashed the parser
once are refused at once by another process using the same data dir, whatever the file is called; changed bytes
are parsed again; deleting the record (the refusal names it) retries the same bytes on purpose."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kit.documents import make_pdf

from services.core.settings import DocumentSettings
from services.readers import DocumentFailure, iter_documents
from services.readers.quarantine import forget_all_in_process
from services.readers.sandbox import ParserSandbox

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
DPR = str(Path(sys.executable).with_name("dpr"))
HOSTILE = {"pdf": "kit.hostile_readers:by_name"}

# Another process: a fresh sandbox on the same quarantine directory reads one file; prints what became of it and
# how many parser children it started.
_OTHER = """
import json, sys
from pathlib import Path
from services.readers import DocumentFailure, iter_documents
from services.readers.quarantine import forget_all_in_process
from services.readers.sandbox import ParserSandbox
from services.core.settings import DocumentSettings
limits = DocumentSettings(quarantine_dir=Path(sys.argv[1]))
with ParserSandbox(limits, readers={"pdf": "kit.hostile_readers:by_name"}) as sandbox:
    items = list(iter_documents([Path(sys.argv[2])], limits=limits, sandbox=sandbox))
    out = [{"reason": i.reason, "error": i.error} if isinstance(i, DocumentFailure) else {"doc": i.doc_id}
           for i in items]
    print(json.dumps({"items": out, "started": sandbox.started}))
"""


def _in_another_process(quarantine: Path, path: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": f"{TESTS}:{REPO}"}
    done = subprocess.run([sys.executable, "-c", _OTHER, str(quarantine), str(path)], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    return dict(json.loads(done.stdout))


def test_a_crash_is_remembered_by_the_bytes_across_processes(tmp_path: Path) -> None:
    quarantine = tmp_path / "data" / "quarantine"
    folder = tmp_path / "docs"
    folder.mkdir()
    poison = make_pdf(folder / "b-crash.pdf", ["This file kills the parser process."])
    limits = DocumentSettings(quarantine_dir=quarantine)
    with ParserSandbox(limits, readers=HOSTILE) as sandbox:
        items = list(iter_documents([poison], limits=limits, sandbox=sandbox))
    assert [(type(i).__name__, getattr(i, "reason", "")) for i in items] == [("DocumentFailure", "parser_crashed")]
    records = list(quarantine.glob("*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["name"] == "b-crash.pdf"

    again = tmp_path / "again"
    again.mkdir()
    shutil.copy(poison, again / "b-crash.pdf")  # the same bytes, in a new process: refused without a parser
    other = _in_another_process(quarantine, again / "b-crash.pdf")
    assert other["started"] == 0, other
    [failure] = other["items"]  # type: ignore[misc]
    assert failure["reason"] == "parser_crashed" and "is quarantined: the same bytes" in failure["error"]
    assert str(records[0]) in failure["error"]  # the record to delete to retry on purpose

    with (again / "b-crash.pdf").open("ab") as f:  # changed bytes: parsed (and here crash) again
        f.write(b"\n% edited\n")
    changed = _in_another_process(quarantine, again / "b-crash.pdf")
    assert changed["started"] == 1 and "SIGSEGV" in changed["items"][0]["error"], changed  # type: ignore

    records[0].unlink()  # the same first bytes, retried on purpose: they reach a parser again
    retried = _in_another_process(quarantine, poison)
    assert retried["started"] == 1 and "SIGSEGV" in retried["items"][0]["error"], retried  # type: ignore


def _ingest(env: dict[str, str], folder: Path, cwd: Path) -> dict[str, object]:
    done = subprocess.run([DPR, "ingest", str(folder), "--json"], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return dict(json.loads(done.stdout))


def test_dpr_ingest_refuses_a_copy_of_a_poison_file_in_a_later_run(tmp_path: Path) -> None:
    """Two `dpr ingest` processes on one data dir: the second meets the same bytes under a name the test reader
    would parse happily, and reports them quarantined (so it was the record, not the name, that refused them)."""
    env = {**os.environ, "DPR_DATA_DIR": str(tmp_path / "data"), "DPR_TEST_HOSTILE_READERS": "1",
           "PYTHONPATH": f"{TESTS / 'integration' / 'hostile_site'}:{TESTS}:{REPO}"}
    first_folder = tmp_path / "first"
    first_folder.mkdir()
    make_pdf(first_folder / "b-crash.pdf", ["This file kills the parser process."])
    make_pdf(first_folder / "a-fine.pdf", ["The boiler is serviced once a year."])
    first = _ingest(env, first_folder, tmp_path)
    assert [(Path(str(f["source"])).name, f["reason"]) for f in first["failed"]] == [  # type: ignore[attr-defined]
        ("b-crash.pdf", "parser_crashed")]
    assert "SIGSEGV" in first["failed"][0]["error"]  # type: ignore[index]

    second_folder = tmp_path / "second"
    second_folder.mkdir()
    shutil.copy(first_folder / "b-crash.pdf", second_folder / "renamed-copy.pdf")
    second = _ingest(env, second_folder, tmp_path)
    failures = second["failed"]
    assert [f["reason"] for f in failures] == ["parser_crashed"], second  # type: ignore[attr-defined]
    assert "is quarantined: the same bytes" in failures[0]["error"]  # type: ignore[index]
    assert "b-crash.pdf" in failures[0]["error"]  # type: ignore[index]
    assert second["documents"] == 0


def test_without_a_directory_the_quarantine_is_this_process_only(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    poison = make_pdf(folder / "b-crash.pdf", ["This file kills the parser process."])
    forget_all_in_process()
    with ParserSandbox(DocumentSettings(), readers=HOSTILE) as sandbox:
        first = list(iter_documents([poison], sandbox=sandbox))
        second = list(iter_documents([poison], sandbox=sandbox))
        assert sandbox.started == 1
    assert isinstance(first[0], DocumentFailure) and "SIGSEGV" in first[0].error
    assert isinstance(second[0], DocumentFailure) and "is quarantined: the same bytes" in second[0].error
