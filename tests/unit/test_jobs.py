"""Job tracking in Redis (services/jobs.py) over a dict-backed fake client: no sockets."""

from __future__ import annotations

from pathlib import Path

import pytest
from kit.fake_redis import FakeRedis

from services.core.errors import TransientError
from services.jobs import FileHashes, JobNotFound, JobStore, JobStoreUnavailable, RedisHashes, redact_url, summarize

pytestmark = pytest.mark.unit


def batch_result(documents: int = 0, unchanged: int = 0, chunks: int = 0, failed: list | None = None) -> dict:
    return {"job": "j1", "documents": documents, "unchanged": unchanged, "chunks": chunks, "title_truncated": 0,
            "skipped": [], "failed": failed or [], "seconds": 0.1}


@pytest.fixture(params=["redis", "files"])
def jobs(request: pytest.FixtureRequest, tmp_path: Path) -> JobStore:
    """The one job model over both places its state lives: Redis (a dict-backed fake) and the job folder."""
    if request.param == "files":
        return JobStore(FileHashes(tmp_path / "jobs"), ttl=3600)
    return JobStore(RedisHashes(FakeRedis(), url="redis://127.0.0.1:6399/0"), ttl=3600)


def test_job_goes_submitting_queued_running_done(jobs: JobStore) -> None:
    jobs.create("j1", collection="docs", created=100.0)
    assert jobs.status("j1")["state"] == "submitting"
    jobs.seal("j1", batches=2, documents=5, skipped=[{"source": "a.png", "reason": "type"}],
              failed=[{"source": "b.txt", "reason": "empty", "error": "b.txt: has no text"}])
    status = jobs.status("j1")
    assert (status["state"], status["batches_done"], status["batches_total"]) == ("queued", 0, 2)
    jobs.mark_started("j1", 0, worker="w1")
    assert jobs.status("j1")["state"] == "running"
    jobs.record_batch("j1", 0, {**batch_result(documents=3, chunks=7), "finished": 110.0})
    jobs.record_batch("j1", 1, {**batch_result(documents=1, unchanged=1, chunks=2), "finished": 112.5})
    status = jobs.status("j1")
    assert status["state"] == "done"
    assert (status["documents"], status["unchanged"], status["chunks"]) == (4, 1, 9)
    assert status["documents_total"] == 5
    assert [f["source"] for f in status["failed"]] == ["b.txt"]
    assert [s["source"] for s in status["skipped"]] == ["a.png"]
    assert status["seconds"] == pytest.approx(12.5)
    assert status["collection"] == "docs"


def test_redelivered_batch_overwrites_instead_of_double_counting(jobs: JobStore) -> None:
    jobs.create("j1")
    jobs.seal("j1", batches=1, documents=3, skipped=[], failed=[])
    assert jobs.mark_started("j1", 0, worker="w1") == 1
    jobs.record_batch("j1", 0, batch_result(documents=3, chunks=6))
    # the worker died before acking: the same batch runs again and finds everything stored
    assert jobs.mark_started("j1", 0, worker="w2", attempt=0) == 2
    jobs.record_batch("j1", 0, batch_result(unchanged=3))
    status = jobs.status("j1")
    assert (status["batches_done"], status["documents"], status["unchanged"], status["chunks"]) == (1, 0, 3, 0)
    assert jobs.started("j1")[0]["worker"] == "w2"


def test_batch_level_error_fails_the_job_but_keeps_other_batches(jobs: JobStore) -> None:
    jobs.create("j1")
    jobs.seal("j1", batches=2, documents=4, skipped=[], failed=[])
    jobs.record_batch("j1", 0, batch_result(documents=2, chunks=4))
    failed = [{"source": "c.txt", "reason": "unavailable", "error": "store down"}]
    jobs.record_batch("j1", 1, {**batch_result(failed=failed), "error": "unavailable: store down"})
    status = jobs.status("j1")
    assert status["state"] == "failed"
    assert status["documents"] == 2
    assert status["errors"] == [{"batch": 1, "error": "unavailable: store down"}]
    assert status["failed"] == failed


def test_job_without_documents_is_done_once_sealed(jobs: JobStore) -> None:
    jobs.create("j1")
    jobs.seal("j1", batches=0, documents=0, skipped=[], failed=[{"source": "x", "reason": "empty", "error": "x"}])
    assert jobs.status("j1")["state"] == "done"


def test_every_key_gets_the_ttl() -> None:
    client = FakeRedis()
    jobs = JobStore(RedisHashes(client, url="redis://127.0.0.1:6399/0"), ttl=3600)
    jobs.create("j1")
    jobs.mark_started("j1", 0)
    jobs.record_batch("j1", 0, batch_result())
    jobs.seal("j1", batches=1, documents=1, skipped=[], failed=[])
    assert set(client.hashes) <= set(client.ttls)
    assert set(client.ttls.values()) == {3600}


def test_unknown_job_is_a_clear_error(jobs: JobStore) -> None:
    with pytest.raises(JobNotFound, match="no job 'nope'.*expire"):
        jobs.status("nope")


def test_unreachable_redis_is_transient_and_names_the_url_and_fix() -> None:
    jobs = JobStore(RedisHashes(FakeRedis(down=True), url="redis://user:secret@10.0.0.9:6399/0"))
    with pytest.raises(JobStoreUnavailable) as info:
        jobs.create("j1")
    assert isinstance(info.value, TransientError)
    message = str(info.value)
    assert "10.0.0.9:6399" in message and "DPR_BROKER_URL" in message
    assert "secret" not in message


def test_redact_url_hides_only_the_password() -> None:
    assert redact_url("redis://:pw@host:6379/1") == "redis://:***@host:6379/1"
    assert redact_url("redis://localhost:6379/0") == "redis://localhost:6379/0"


def test_summarize_counts_running_with_unfinished_batches() -> None:
    meta = {"job": "j", "sealed": "1", "batches": "3", "created": "10"}
    status = summarize(meta, {0: batch_result(documents=1, chunks=2)}, {}, now=20.0)
    assert (status["state"], status["batches_done"], status["seconds"]) == ("running", 1, 10.0)


def test_summarize_adds_where_each_batch_spent_its_time() -> None:
    meta = {"job": "j", "sealed": "1", "batches": "2", "created": "10"}
    batches = {n: {**batch_result(documents=1, chunks=2), "encode_seconds": 2.0 + n, "upsert_seconds": 0.25,
                   "chunk_seconds": 0.5, "sparse_seconds": 0.125} for n in (0, 1)}
    status = summarize(meta, batches, {}, now=20.0)
    assert (status["encode_seconds"], status["upsert_seconds"], status["chunk_seconds"],
            status["sparse_seconds"], status["parse_seconds"]) == (5.0, 0.5, 1.0, 0.25, 0.0)


def test_submitted_batches_name_what_is_still_missing(jobs: JobStore) -> None:
    jobs.create("j1")
    jobs.record_submitted("j1", 0, ["a", "b"])
    jobs.record_submitted("j1", 1, ["c"])
    jobs.seal("j1", batches=2, documents=3, skipped=[], failed=[])
    jobs.record_batch("j1", 0, batch_result(documents=2, chunks=2))
    status = jobs.status("j1")
    assert (status["state"], status["batches_pending"]) == ("running", [1])
    jobs.record_batch("j1", 1, batch_result(documents=1, chunks=1))
    assert jobs.status("j1")["batches_pending"] == []


def test_expired_job_folders_are_removed_when_a_new_job_starts(tmp_path: Path) -> None:
    import os

    jobs = JobStore(FileHashes(tmp_path / "jobs"), ttl=60)
    jobs.create("old")
    for folder in (tmp_path / "jobs").iterdir():
        os.utime(folder, (1, 1))
    jobs.create("new")
    with pytest.raises(JobNotFound):
        jobs.status("old")
    assert jobs.status("new")["state"] == "submitting"


def test_failure_records_are_bounded_and_counted(jobs: JobStore) -> None:
    from services.jobs.store import KEEP_RECORDS

    many = [{"source": f"r{i}", "reason": "invalid_json", "error": "bad"} for i in range(KEEP_RECORDS + 500)]
    jobs.create("j1")
    jobs.seal("j1", batches=1, documents=1, skipped=[], failed=many)
    jobs.record_batch("j1", 0, batch_result(documents=1, failed=many[:3]))
    status = jobs.status("j1")
    assert len(status["failed"]) == KEEP_RECORDS
    assert status["failed_total"] == KEEP_RECORDS + 503 and status["skipped_total"] == 0
