"""The Celery side without a broker: configuration, retry policy and batch recording of the ingest task.

The task runs eagerly (``Task.apply``: same code path, retries re-applied synchronously); the pipeline is
replaced by a stand-in and the job store runs over a dict-backed fake Redis, so no socket is opened.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init
from kit.fake_redis import FakeRedis
from kit.fakes import CountingTowers, FakeRuntime, HashTowers

from services.core.errors import ConfigError, StoreUnavailable
from services.core.settings import CelerySettings, EncoderSettings, Settings
from services.ingest.pipeline import IngestReport
from services.jobs import JobStore, RedisHashes
from services.readers import Document
from services.store import Store
from services.store.edge.engine import EdgeEngine
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
    assert conf["task_acks_on_failure"] and conf["task_acks_on_timeout"] is False  # a hard-killed batch is requeued
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
    return SimpleNamespace(app=app, jobs=jobs, pipeline=pipeline, runtime=runtime, task=app.tasks["dpr.ingest_batch"])


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


# --- time limits and the model load ---------------------------------------------------------------------------


def test_a_time_limit_is_retried_like_a_transient_error(
    harness: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def slow_then_fine(items: list[Any], job: str = "") -> IngestReport:
        calls.append(1)
        if len(calls) < 3:
            raise SoftTimeLimitExceeded()
        return IngestReport(job="j1", documents=len(items), chunks=len(items))

    monkeypatch.setattr(harness.pipeline, "ingest_batch", slow_then_fine)
    run(harness)
    assert len(calls) == 3
    status = harness.jobs.status("j1")
    assert (status["state"], status["documents"], status["failed"]) == ("done", 3, [])


def test_a_time_limit_after_max_retries_names_the_limit_that_fired(
    tmp_path: Path, harness: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def always_slow(items: list[Any], job: str = "") -> IngestReport:
        calls.append(1)
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(harness.pipeline, "ingest_batch", always_slow)
    limited = create_app(settings(tmp_path, max_retries=2, task_time_limit=25, visibility_timeout=60))
    harness.task = limited.tasks["dpr.ingest_batch"]  # soft limit 20 s, hard 25 s
    run(harness)
    assert len(calls) == 3  # first try + max_retries (2)
    status = harness.jobs.status("j1")
    assert status["state"] == "failed"
    assert {f["reason"] for f in status["failed"]} == {"time_limit"}
    error = status["failed"][0]["error"]
    assert "soft time limit of 20 s" in error and "hard limit 25 s" in error, error
    assert "DPR_CELERY__TASK_TIME_LIMIT" in error


def test_each_pool_process_loads_its_models_when_it_starts_not_inside_a_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded: list[str] = []

    class Towers:
        def encode_documents(self, passages: list[str], batch_size: int = 32) -> Any:
            loaded.append("towers")

    class Sparse:
        def embed_document(self, text: str) -> Any:
            loaded.append("bm25")

    app = create_app(settings(tmp_path))
    runtime = SimpleNamespace(towers=Towers(), sparse=Sparse())
    monkeypatch.setattr(tasks, "worker_runtime", lambda s: runtime if s is app.settings else pytest.fail("settings"))
    worker_process_init.send(sender="w1@host")  # what the prefork pool sends in each child right after the fork
    assert loaded == ["towers", "bm25"]
    # the pool waits for a child that is still loading instead of killing it after Celery's default 4 s
    assert celery_config(settings(tmp_path))["worker_proc_alive_timeout"] >= 300


def test_a_model_that_fails_to_load_at_pool_start_leaves_the_error_to_the_first_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_settings: Settings) -> Any:
        raise FileNotFoundError("model directory /nope does not exist")

    create_app(settings(tmp_path))
    monkeypatch.setattr(tasks, "worker_runtime", broken)
    worker_process_init.send(sender="w1@host")  # logged, never raised: the child must still come up
    assert "/nope" in caplog.text


# --- counts after a redelivery (the real pipeline over the in-process store) --------------------------------------

LONG_DOCS = [Document(doc_id=f"d{i}", text=" ".join(f"word{i}x{j}" for j in range(40 + 30 * i)), source=f"d{i}.txt")
             for i in range(3)]


@pytest.mark.parametrize("engine", ["edge", "server-memory"])
def test_a_redelivered_batch_counts_what_its_dead_first_attempt_wrote(
    harness: SimpleNamespace, tmp_path: Path, engine: str
) -> None:
    """The first attempt wrote two of three documents and its worker died; the redelivered batch finds them
    stored. Written by this job: they count as written with their passages (not "unchanged", not 0 chunks),
    and only the missing document is encoded. Another job re-ingesting them finds them unchanged, encoding
    nothing."""
    towers = CountingTowers(HashTowers())
    store = Store(EdgeEngine(tmp_path / "store", "passages", lock_timeout=10)) if engine == "edge" else None
    with FakeRuntime(towers=towers, store=store) as runtime:
        harness.runtime.pipeline = runtime.pipeline
        runtime.pipeline.ingest_batch(LONG_DOCS[:2], job="j1")  # the first attempt, up to the SIGKILL
        written_before, encoded_before = runtime.store.count(), towers.encoded
        assert 0 < written_before == encoded_before

        harness.task.apply(args=["j1", 0, [d.to_json() for d in LONG_DOCS]])  # the redelivery

        stored = runtime.store.count()
        status = harness.jobs.status("j1")
        assert (status["state"], status["documents"], status["unchanged"]) == ("done", 3, 0)
        assert status["chunks"] == stored > written_before  # every stored passage is counted
        assert towers.encoded == stored  # only the missing document was encoded

        harness.jobs.create("j2")
        harness.jobs.seal("j2", batches=1, documents=3, skipped=[], failed=[])
        harness.task.apply(args=["j2", 0, [d.to_json() for d in LONG_DOCS]])
        again = harness.jobs.status("j2")
        assert (again["documents"], again["unchanged"], again["chunks"]) == (0, 3, 0)
        assert towers.encoded == stored


def test_a_batch_killed_by_the_hard_time_limit_is_requeued_not_acked_away(tmp_path: Path) -> None:
    task = create_app(settings(tmp_path)).tasks["dpr.ingest_batch"]
    assert task.acks_late and task.acks_on_failure and task.acks_on_timeout is False
