"""The Celery side without a broker: configuration, retry policy and batch recording of the ingest task.

The task runs eagerly (``Task.apply``: same code path, retries re-applied synchronously); the pipeline is
replaced by a stand-in and the job store runs over a dict-backed fake Redis, so no socket is opened.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kit.fake_redis import FakeRedis

from services.errors import ConfigError, StoreUnavailable
from services.ingest import IngestReport
from services.jobs import JobStore, RedisHashes
from services.readers import Document
from services.settings import CelerySettings, EncoderSettings, Settings
from workers import tasks
from workers.app import celery_config, create_app, worker_settings

pytestmark = pytest.mark.unit

DOCS = [Document(doc_id=f"d{i}", text=f"text {i}", source=f"d{i}.txt") for i in range(3)]


def settings(tmp_path: Path, **celery: Any) -> Settings:
    return Settings(broker_url="redis://127.0.0.1:6399/0", data_dir=tmp_path, celery=CelerySettings(**celery))


def test_config_is_json_only_acks_late_prefetch_one(tmp_path: Path) -> None:
    conf = celery_config(settings(tmp_path, visibility_timeout=120, task_time_limit=60,
                                  unacked_restore_interval=1, unacked_restore_throttle=1))
    assert conf["task_serializer"] == conf["result_serializer"] == "json"
    assert conf["accept_content"] == ["json"]
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["broker_transport_options"] == {
        "visibility_timeout": 120, "unacked_restore_interval": 1, "unacked_restore_throttle": 1
    }
    assert conf["task_time_limit"] == 60 and conf["task_soft_time_limit"] < 60
    assert conf["task_routes"]["dpr.ingest_batch"] == {"queue": "ingest"}
    assert conf["worker_hijack_root_logger"] is False
    assert conf["broker_connection_retry_on_startup"] is True


def test_time_limit_must_stay_below_visibility_timeout(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="DPR_CELERY__VISIBILITY_TIMEOUT"):
        celery_config(settings(tmp_path, visibility_timeout=60, task_time_limit=60))


def test_app_needs_a_broker(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="DPR_BROKER_URL=redis://"):
        create_app(Settings(data_dir=tmp_path))


def test_worker_threads_split_cores_between_pool_processes(tmp_path: Path) -> None:
    s = settings(tmp_path)
    assert worker_settings(s, 2, cores=8).encoder.threads == 4
    assert worker_settings(s, 4, cores=2).encoder.threads == 1
    pinned = s.model_copy(update={"encoder": EncoderSettings(threads=3)})
    assert worker_settings(pinned, 2, cores=8).encoder.threads == 3
    assert worker_settings(s, 1).encoder.threads is not None


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    for retries, ceiling in [(0, 2.0), (1, 4.0), (3, 16.0), (20, 300.0)]:
        values = {tasks.backoff_seconds(retries) for _ in range(20)}
        assert all(ceiling / 2 <= v <= ceiling for v in values)
        assert len(values) > 1


def test_malformed_task_documents_fail_alone() -> None:
    items = tasks.parse_documents([DOCS[0].to_json(), {"doc_id": "x", "source": "x.txt"}])
    assert items[0] == DOCS[0]
    assert items[1].reason == "invalid_task"  # type: ignore[union-attr]


# --- the task, eagerly ----------------------------------------------------------------------------------------


class StubPipeline:
    """Stands in for the runtime's IngestPipeline; each test sets ``ingest_batch``."""

    def ingest_batch(self, items: list[Any], job: str = "") -> IngestReport:
        raise AssertionError("set ingest_batch in the test")


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    s = settings(tmp_path, max_retries=2)
    app = create_app(s)
    jobs = JobStore(RedisHashes(FakeRedis(), url=s.broker_url or ""))
    pipeline = StubPipeline()
    runtime = SimpleNamespace(jobs=jobs, pipeline=pipeline)
    runtime.for_collection = lambda _collection: runtime
    monkeypatch.setattr(tasks, "worker_runtime", lambda _settings: runtime)
    monkeypatch.setattr(tasks, "backoff_seconds", lambda retries: 0.0)
    jobs.create("j1")
    jobs.seal("j1", batches=1, documents=len(DOCS), skipped=[], failed=[])
    return SimpleNamespace(app=app, jobs=jobs, pipeline=pipeline, task=app.tasks["dpr.ingest_batch"])


def run(h: SimpleNamespace) -> None:
    h.task.apply(args=["j1", 0, [d.to_json() for d in DOCS]])


def test_batch_result_is_recorded(harness: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_ingest(items: list[Any], job: str = "") -> IngestReport:
        assert job == "j1"
        return IngestReport(job="j1", documents=len(items), chunks=2 * len(items))

    monkeypatch.setattr(harness.pipeline, "ingest_batch", fake_ingest)
    run(harness)
    status = harness.jobs.status("j1")
    assert (status["state"], status["documents"], status["chunks"]) == ("done", 3, 6)


def test_transient_error_is_retried_then_the_batch_succeeds(
    harness: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def flaky(items: list[Any], job: str = "") -> IngestReport:
        calls.append(1)
        if len(calls) < 3:
            raise StoreUnavailable("shard lock held by pid 42; retry later")
        return IngestReport(job="j1", documents=len(items), chunks=len(items))

    monkeypatch.setattr(harness.pipeline, "ingest_batch", flaky)
    run(harness)
    assert len(calls) == 3
    status = harness.jobs.status("j1")
    assert (status["state"], status["documents"], status["failed"]) == ("done", 3, [])
    assert harness.jobs.started("j1")[0]["attempt"] == 2


def test_transient_error_after_max_retries_fails_the_batch_with_its_reason(
    harness: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def down(items: list[Any], job: str = "") -> IngestReport:
        calls.append(1)
        raise StoreUnavailable("store at /data is locked")

    monkeypatch.setattr(harness.pipeline, "ingest_batch", down)
    run(harness)
    assert len(calls) == 3  # first try + max_retries (2)
    status = harness.jobs.status("j1")
    assert status["state"] == "failed"
    assert {f["source"] for f in status["failed"]} == {"d0.txt", "d1.txt", "d2.txt"}
    assert {f["reason"] for f in status["failed"]} == {"unavailable"}


def test_permanent_batch_error_is_not_retried_and_reports_every_document(
    harness: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def broken(items: list[Any], job: str = "") -> IngestReport:
        calls.append(1)
        raise ValueError("tensor shape mismatch")

    monkeypatch.setattr(harness.pipeline, "ingest_batch", broken)
    run(harness)
    assert len(calls) == 1
    status = harness.jobs.status("j1")
    assert status["state"] == "failed"
    assert len(status["failed"]) == 3
    assert all("tensor shape mismatch" in f["error"] for f in status["failed"])


def test_a_batch_that_keeps_killing_workers_is_failed_not_redelivered_forever(
    harness: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness.pipeline, "ingest_batch", lambda items, **kw: pytest.fail("must not run again"))
    for _ in range(2 + 1 + tasks.EXTRA_DELIVERIES):  # deliveries a worker died on
        harness.jobs.mark_started("j1", 0)
    run(harness)
    status = harness.jobs.status("j1")
    assert status["state"] == "failed"
    assert {f["reason"] for f in status["failed"]} == {"worker_lost"}
