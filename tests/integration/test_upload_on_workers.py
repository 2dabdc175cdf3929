"""An API upload of a binary file is parsed by the worker, not by `dpr serve`, when the service runs Celery workers
(real `dpr serve`, real `dpr worker`, Valkey, parser sandbox): a small file travels inline, a larger one is kept
under DATA_DIR/uploads for the worker to read by path and removed once its batch is recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from api_server import ServeProcess, wait_job, wait_ready
from kit.documents import make_pdf
from worker_cluster import Cluster

from services.core.settings import Settings
from services.store import open_store

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def _parses(log: Path) -> list[tuple[int, str]]:
    if not log.exists():
        return []
    return [(int(pid), doc) for pid, doc in (line.split("\t") for line in log.read_text().splitlines())]


def test_an_uploaded_pdf_is_parsed_by_the_worker_inline_or_by_path(make_cluster: Any, tmp_path: Path) -> None:
    cluster: Cluster = make_cluster()
    log = tmp_path / "parse.log"
    cluster.env.update({
        "PYTHONPATH": f"{TESTS}:{REPO}",
        "DPR_PARSE_LOG": str(log),
        "DPR_CELERY__INLINE_FILE_BYTES": "4000",  # the small PDF travels inline, the manual by path
        "DPR_CELERY__TASK_TIME_LIMIT": "240",
        "DPR_CELERY__VISIBILITY_TIMEOUT": "300",
    })
    worker = cluster.start_worker()
    small = make_pdf(tmp_path / "boiler.pdf", ["The boiler must be serviced once a year by a licensed engineer."])
    manual = make_pdf(tmp_path / "manual.pdf", [f"Chapter {i}: the garden pump needs oil number {i}."
                                                for i in range(40)])
    assert small.stat().st_size < 4000 < manual.stat().st_size
    server = ServeProcess(cluster.env, cluster.root)
    try:
        wait_ready(server.url, 180, server.process, server.log)
        jobs = {}
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for path in (small, manual):
                r = client.post("/v1/documents", files={"file": (path.name, path.read_bytes(), "application/pdf")})
                assert r.status_code == 202, r.text
                jobs[path.name] = wait_job(client, r.json()["job"], timeout=240)
        serve_pid = server.process.pid
    finally:
        server.stop()

    for name, status in jobs.items():
        why = (name, status.get("failed"), status.get("errors"))
        assert status["state"] == "done" and status["documents"] == 1 and status["parsed"] == 1, why
    parses = _parses(log)
    assert sorted(doc for _, doc in parses) == ["boiler.pdf", "manual.pdf"]
    assert serve_pid not in {pid for pid, _ in parses}  # the API process parsed nothing...
    assert all(by.split(":")[1] in {str(pid) for pid, _ in parses}  # ...the worker's pool process did
               for status in jobs.values() for by in status["parsed_by"])
    assert worker.alive()
    store = open_store(Settings(data_dir=cluster.data_dir))
    try:
        passages = [p for batch in store.scroll() for p in batch]
    finally:
        store.close()
    assert {p.source for p in passages} == {"upload:boiler.pdf", "upload:manual.pdf"}
    assert max(p.page_end or p.page or 0 for p in passages if p.doc_id == "manual.pdf") == 40  # every page, by path
    spool = cluster.data_dir / "uploads"
    assert spool.is_dir() and list(spool.rglob("*")) == []  # the manual's copy went once its batch was recorded
