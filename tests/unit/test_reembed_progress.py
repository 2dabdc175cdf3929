"""A re-embed's progress is a job of the one job model: sent batches, finished ones, idle time, the result."""

from __future__ import annotations

import pytest
from kit.fake_redis import FakeRedis

from services.jobs import JobStore, RedisHashes
from services.lifecycle.progress import ReembedProgress, reembed_job_id

pytestmark = pytest.mark.unit


@pytest.fixture
def jobs() -> JobStore:
    return JobStore(RedisHashes(FakeRedis(), url="redis://127.0.0.1:6399/0"))


def test_batches_sent_done_and_the_result_show_in_the_job(jobs: JobStore) -> None:
    progress = ReembedProgress(jobs, "docs", "docs-g2")
    progress.reset()
    progress.sent(["r1-0", "r1-1", "r1-2"])
    progress.sealed(passages=300)
    progress.done("r1-1", 100)
    assert progress.counts() == (1, 3) and progress.pending() == 2
    assert progress.idle_seconds() < 5
    status = jobs.status(progress.job)
    assert (status["executor"], status["state"], status["batches_pending"]) == ("reembed", "running", ["r1-0", "r1-2"])
    progress.done("r1-0", 100)
    progress.done("r1-2", 100)
    progress.done("r1-2", 100)  # a redelivered batch counts once
    progress.set_result({"outcome": "activated"})
    status = jobs.status(progress.job)
    assert (status["state"], status["batches_done"], status["target"]) == ("done", 3, "docs-g2")
    assert progress.result() == {"outcome": "activated"} and progress.pending() == 0


def test_reset_forgets_an_earlier_run_and_ids_are_per_collection_and_target(jobs: JobStore) -> None:
    progress = ReembedProgress(jobs, "docs", "docs-g2")
    progress.reset()
    progress.sent(["old-0"])
    progress.set_result({"outcome": "failed"})
    progress.reset()
    assert progress.counts() == (0, 0) and progress.result() is None
    assert reembed_job_id("docs", "docs-g2") != reembed_job_id("docs", "docs-g3") != reembed_job_id("x", "docs-g3")


def test_a_resumed_run_whose_record_was_lost_starts_a_new_one(jobs: JobStore) -> None:
    progress = ReembedProgress(jobs, "docs", "docs-g2")
    assert progress.counts() == (0, 0) and progress.idle_seconds() == float("inf")
    progress.sent(["r2-0"])  # no reset: the record had expired or the broker lost it
    assert jobs.status(progress.job)["batches_pending"] == ["r2-0"]


def test_a_resumed_run_closes_the_batches_an_earlier_run_left_unfinished(jobs: JobStore) -> None:
    progress = ReembedProgress(jobs, "docs", "docs-g2")
    progress.reset()
    progress.sent(["r1-0", "r1-1", "r1-2"])
    progress.done("r1-0", 2)  # r1-1 was in flight on a killed worker, r1-2 still queued
    assert progress.supersede_pending() == ["r1-1", "r1-2"]
    progress.sent(["r2-0"])  # the resumed run re-sends what the target still lacks
    assert jobs.status(progress.job)["batches_pending"] == ["r2-0"] and progress.pending() == 1
    progress.done("r2-0", 4)
    progress.done("r1-2", 2)  # the old batch runs late after all: its record is replaced, nothing pends
    status = jobs.status(progress.job)
    assert status["batches_pending"] == [] and status["batches_done"] == 4
    assert progress.supersede_pending() == []
