"""Following a job never ends in "done" over a hole: lost batches are re-sent from the input or failed by name,
a vanished job record is re-created, and an outage of the job store is ridden out."""

from __future__ import annotations

from typing import Any

import pytest
from kit.fake_redis import FakeRedis

from services.ingest.batches import Submitted, job_batches
from services.ingest.follow import follow_job
from services.jobs import JobStore, JobStoreUnavailable, RedisHashes
from services.readers import Document

pytestmark = pytest.mark.unit

DOCS = [Document(doc_id=f"d{i}", text=f"text {i}") for i in range(5)]


class FakeExecutor:
    """Holds messages like a broker would; ``lose`` drops some, as a broker restarted without persistence does."""

    def __init__(self, redis: FakeRedis) -> None:
        self.jobs = JobStore(RedisHashes(redis, url="redis://127.0.0.1:6399/0"))
        self.held: dict[int, list[Document]] = {}
        self.resent: list[int] = []

    def submit(self) -> Submitted:
        submitted = Submitted(job="j1", collection="c", executor="broker")
        self.jobs.create("j1", collection="c", executor="broker")
        self.held.update(job_batches(self.jobs, submitted, DOCS, batch_documents=2, batch_bytes=10**6))
        return submitted

    def work(self) -> None:
        """A worker takes every held message and records its outcome."""
        for number, docs in sorted(self.held.items()):
            self.jobs.mark_started("j1", number)
            self.jobs.record_batch("j1", number, {"documents": len(docs), "chunks": len(docs)})
        self.held.clear()

    def in_flight(self, job_id: str) -> set[int] | None:
        return set(self.held)

    def resend(self, submitted: Submitted, batches: dict[int, list[Document]]) -> None:
        self.resent.extend(batches)
        self.held.update(batches)


def follow(executor: FakeExecutor, **kw: Any) -> dict[str, Any]:
    def on_status(status: dict[str, Any]) -> None:
        if executor.resent:
            executor.work()  # a worker picks up what was re-sent

    return follow_job(executor, "j1", poll=0.01, settle=0.05, on_status=on_status, timeout=10, **kw)


def test_lost_batches_are_resent_from_the_input_and_the_job_ends_done() -> None:
    executor = FakeExecutor(FakeRedis())
    submitted = executor.submit()
    del executor.held[1]  # the broker lost batch 1 (d2, d3)
    executor.work()
    status = follow(executor, submitted=submitted, source=lambda: iter(DOCS))
    assert executor.resent == [1]
    assert (status["state"], status["documents"], status["batches_pending"]) == ("done", 5, [])


def test_lost_batches_without_the_input_fail_naming_their_documents() -> None:
    executor = FakeExecutor(FakeRedis())
    executor.submit()
    del executor.held[2]
    executor.work()
    status = follow(executor)
    assert status["state"] == "failed"
    assert [(f["source"], f["reason"]) for f in status["failed"]] == [("d4", "lost")]


def test_a_vanished_job_record_is_recreated_and_every_batch_resent() -> None:
    redis = FakeRedis()
    executor = FakeExecutor(redis)
    submitted = executor.submit()
    redis.hashes.clear()  # broker restarted without persistence: queue and job record gone
    executor.held.clear()
    status = follow(executor, submitted=submitted, source=lambda: iter(DOCS))
    assert sorted(executor.resent) == [0, 1, 2]
    assert (status["state"], status["documents"], status["documents_total"]) == ("done", 5, 5)


def test_an_outage_of_the_job_store_is_ridden_out_and_a_long_one_is_reported() -> None:
    redis = FakeRedis()
    executor = FakeExecutor(redis)
    executor.submit()
    executor.work()
    redis.down = True
    with pytest.raises(JobStoreUnavailable):
        follow_job(executor, "j1", poll=0.01, outage=0.05)
    calls = {"n": 0}
    real = executor.jobs.status

    def flaky(job_id: str, now: float | None = None) -> dict[str, Any]:
        calls["n"] += 1
        redis.down = calls["n"] < 3  # down for the first two reads, then back
        return real(job_id)

    executor.jobs.status = flaky  # type: ignore[method-assign]
    assert follow_job(executor, "j1", poll=0.01, outage=30)["state"] == "done"
