"""Binary files parsed by the worker that runs their batch, not by `dpr ingest` (real `dpr worker`, Valkey, base
model, parser sandbox): the CLI sends references (small files inline, larger ones by path); the job records who
parsed; a file that crashes the parser fails once with its reason while the rest of its batch is written, and
is quarantined rather than redelivered; unchanged files are parsed by nobody on a re-ingest."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kit.documents import make_pdf
from worker_cluster import DPR, Cluster

from services.core.settings import Settings
from services.jobs import JobStore
from services.store import open_store

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def _run_cli(cluster: Cluster, folder: Path) -> tuple[int, dict[str, Any]]:
    """`dpr ingest FOLDER --wait --json` as a process of its own: (its pid, the job it reports)."""
    env = {**cluster.env, "DPR_TEST_HOSTILE_READERS": ""}  # the CLI parses nothing, hostile or not
    proc = subprocess.Popen([DPR, "ingest", str(folder), "--collection", "pw", "--wait", "--json"], env=env,
                            cwd=cluster.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode in (0, 1), f"{proc.returncode}\n{err}\n{cluster.logs()}"
    return proc.pid, json.loads(out)


def _parses(log: Path) -> list[tuple[int, str]]:
    if not log.exists():
        return []
    return [(int(pid), doc) for pid, doc in (line.split("\t") for line in log.read_text().splitlines())]


def _passages(cluster: Cluster) -> list[Any]:
    store = open_store(Settings(data_dir=cluster.data_dir, collection="pw"))
    try:
        return [p for batch in store.scroll() for p in batch]
    finally:
        store.close()


def test_the_worker_parses_and_a_crashing_file_costs_only_itself(make_cluster: Any, tmp_path: Path) -> None:
    cluster: Cluster = make_cluster()
    log = tmp_path / "parse.log"
    cluster.env.update({
        "PYTHONPATH": f"{TESTS / 'integration' / 'hostile_site'}:{TESTS}:{REPO}",
        "DPR_TEST_HOSTILE_READERS": "1",
        "DPR_PARSE_LOG": str(log),
        "DPR_CELERY__INLINE_FILE_BYTES": "4000",  # the small PDFs travel inline, the long one by path
        # no redelivery for a slow batch on a busy machine (the cluster's 25 s limit is for the kill tests)
        "DPR_CELERY__TASK_TIME_LIMIT": "240",
        "DPR_CELERY__VISIBILITY_TIMEOUT": "300",
    })
    worker = cluster.start_worker()
    folder = tmp_path / "docs"
    folder.mkdir()
    make_pdf(folder / "a-boiler.pdf", ["The boiler must be serviced once a year by a licensed engineer.",
                                       "To reset the boiler, hold the red button for ten seconds."])
    make_pdf(folder / "b-crash.pdf", ["This file kills the parser process."])
    (folder / "c-notes.md").write_text("# Notes\n\nThe heat pump is quiet at night.\n", encoding="utf-8")
    make_pdf(folder / "d-manual.pdf", [f"Chapter {i}: the garden pump needs oil number {i}." for i in range(40)])
    assert (folder / "a-boiler.pdf").stat().st_size < 4000 < (folder / "d-manual.pdf").stat().st_size

    cli_pid, first = _run_cli(cluster, folder)

    assert first["state"] == "done", cluster.logs()
    assert (first["documents"], first["parsed"]) == (3, 3), json.dumps(first)[:3000]  # a, c, d written; a, b, d parsed
    failed = [(Path(f["source"]).name, f["reason"]) for f in first["failed"]]
    assert failed == [("b-crash.pdf", "parser_crashed")], first["failed"]
    assert "SIGSEGV" in first["failed"][0]["error"]
    parses = _parses(log)
    assert sorted(doc for _, doc in parses) == ["docs/a-boiler.pdf", "docs/b-crash.pdf", "docs/d-manual.pdf"]
    assert cli_pid not in {pid for pid, _ in parses}  # the CLI parsed nothing
    assert {by.rsplit(":", 1)[1] for by in first["parsed_by"]} == {str(pid) for pid, _ in parses}
    jobs = JobStore.from_url(cluster.broker_url)
    started = jobs.started(first["job"])
    assert {s["worker"].split(":")[0] for s in started.values()} == {worker.name}
    assert all(int(n) == 1 for n in jobs.raw(first["job"])["deliveries"].values())  # nothing was redelivered
    passages = _passages(cluster)
    assert {p.doc_id for p in passages} == {"docs/a-boiler.pdf", "docs/c-notes.md", "docs/d-manual.pdf"}
    manual = [p for p in passages if p.doc_id == "docs/d-manual.pdf"]
    assert max(p.page_end or p.page or 0 for p in manual) == 40  # read by path, every page

    log.unlink()
    _, again = _run_cli(cluster, folder)

    assert again["state"] == "done", cluster.logs()
    assert (again["documents"], again["unchanged"], again["parsed"]) == (0, 3, 1)
    assert [doc for _, doc in _parses(log)] == ["docs/b-crash.pdf"]  # only the one never stored is tried...
    assert [f["reason"] for f in again["failed"]] == ["parser_crashed"]
    assert "quarantined" in again["failed"][0]["error"]  # ...and refused without reaching a parser
    assert worker.alive()
