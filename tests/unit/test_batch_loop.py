"""The one batch loop in this process (``LocalExecutor`` over ``job_batches`` and ``run_batch``, the same
``run_batch`` the Celery task calls: tests/unit/test_worker_tasks.py): a failing batch is recorded against its
documents with the reason and the next batch still runs; a full disk is recorded, then stops the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.core.errors import DiskFull, StoreUnavailable
from services.ingest import executor as local
from services.ingest.pipeline import IngestReport
from services.jobs import FileHashes, JobStore
from services.readers import Document

pytestmark = pytest.mark.unit

DOCS = [Document(doc_id=f"d{i}", text=f"text {i}", source=f"d{i}.txt") for i in range(3)]


class StubPipeline:
    """One document per batch; ``fail`` maps a document id to what its batch raises."""

    batch_documents, batch_bytes = 1, 10**6

    def __init__(self, fail: dict[str, Exception]) -> None:
        self.fail, self.ran = fail, []
        self.store = self

    def maybe_optimize(self) -> None:
        return None

    def ingest_batch(self, items: list[Document], job: str = "") -> IngestReport:
        self.ran.append(items[0].doc_id)
        if items[0].doc_id in self.fail:
            raise self.fail[items[0].doc_id]
        return IngestReport(job=job, documents=1, chunks=2)


@pytest.fixture
def jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> JobStore:
    monkeypatch.setattr(local, "new_job_id", lambda: "j1")
    return JobStore(FileHashes(tmp_path / "jobs"))


def run(jobs: JobStore, fail: dict[str, Exception]) -> tuple[StubPipeline, list[IngestReport]]:
    pipeline, seen = StubPipeline(fail), []
    executor = local.LocalExecutor(jobs, lambda _c: pipeline, on_batch=seen.append)  # type: ignore[arg-type,return-value]
    try:
        executor.submit(DOCS, collection="c")
    finally:
        executor.close()
    return pipeline, seen


def test_a_failed_batch_is_recorded_with_its_reason_and_the_next_batch_runs(jobs: JobStore) -> None:
    pipeline, seen = run(jobs, {"d0": StoreUnavailable("store at /data is locked"),
                                "d1": ValueError("tensor shape mismatch")})
    assert pipeline.ran == ["d0", "d1", "d2"]
    status = jobs.status("j1")
    assert (status["state"], status["documents"], status["chunks"]) == ("failed", 1, 2)
    reasons = {f["source"]: (f["reason"], f["error"]) for f in status["failed"]}
    assert reasons == {"d0.txt": ("StoreUnavailable", "d0.txt: store at /data is locked"),
                       "d1.txt": ("batch_error", "d1.txt: ValueError: tensor shape mismatch")}
    assert [r.documents for r in seen] == [1]  # the progress hook hears the batch that ran


def test_a_full_disk_is_recorded_and_stops_the_job(jobs: JobStore) -> None:
    with pytest.raises(DiskFull):
        run(jobs, {"d1": DiskFull("no space left on /data")})
    status = jobs.status("j1")
    assert [(f["source"], f["reason"]) for f in status["failed"]] == [("d1.txt", "DiskFull")]
    assert status["state"] != "done" and status["documents"] == 1  # d2 never ran: the job was not sealed
