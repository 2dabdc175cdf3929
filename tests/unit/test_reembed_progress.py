"""A re-embed's progress is a job of the one job model: sent batches, finished ones, idle time, the result."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

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


def test_dpr_reembed_wait_follows_the_broker_and_opens_the_store_only_every_store_poll_seconds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Reading the store's record each second took the embedded shard's lease from the workers and the server
    # every second (each then loaded its shards again): a 100k re-embed beside `dpr serve` ran at ~15 passages/s.
    import workers.reembed_dispatch
    from entrypoints.cli import lifecycle as cli
    from services.core.settings import Settings

    clock = [0.0]
    calls = {"broker": 0, "store": 0}
    submitted = SimpleNamespace(outcome="submitted", target="docs__g0002",
                                to_json=lambda: {"outcome": "submitted", "target": "docs__g0002"})
    monkeypatch.setattr(workers.reembed_dispatch, "submit_reembed", lambda *a, **k: submitted)
    monkeypatch.setattr(cli.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(cli.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))

    def done() -> dict[str, Any] | None:
        return {"outcome": "activated", "target": "docs__g0002"} if clock[0] >= 95 else None

    def from_broker(settings: Settings, target: str) -> dict[str, Any]:
        calls["broker"] += 1
        return {"batches_done": 3, "batches_sent": 4, "result": done(), "job": "j"}

    def from_store(settings: Settings, target: str) -> dict[str, Any]:
        calls["store"] += 1
        return {"state": {"status": "active" if done() else "building"}, "target_points": 10, "source_points": 12,
                **from_broker(settings, target)}

    monkeypatch.setattr(cli.lifecycle, "reembed_progress", from_broker)
    monkeypatch.setattr(cli.lifecycle, "reembed_status", from_store)
    settings = Settings(data_dir=tmp_path, broker_url="redis://127.0.0.1:6399/0")
    out = cli._reembed_on_workers(settings, "v2", None, wait=True, timeout=None, quiet=True)
    assert out["outcome"] == "activated" and out["status"]["state"]["status"] == "active"
    assert calls["store"] == 4  # at 30, 60 and 90 s, and once the broker reported the result
    assert calls["broker"] >= 95
