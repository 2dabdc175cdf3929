"""A broker that answers but refuses writes (its disk is full: Redis' MISCONF; out of memory; a read-only replica)
is told apart from an unreachable one: one line naming the broker (URL without password, its folder) and the fix,
a ``TransientError`` (exit 3, 503); reads go on; a follower stops instead of waiting forever; a worker hands the
batch back to the broker (``Reject(requeue=True)``) instead of recording a failure or a retry it cannot write.
The real thing (a Valkey AOF on a full tmpfs, a real worker) is tests/integration/test_broker_disk_full.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis.exceptions
from celery.exceptions import Reject
from kit.fake_redis import FakeRedis

from services.core.errors import DiskFull, TransientError
from services.core.settings import CelerySettings, Settings
from services.ingest.batches import Submitted
from services.ingest.follow import follow_job
from services.ingest.pipeline import IngestReport
from services.jobs import BrokerDiskFull, BrokerWriteRefused, JobStore, RedisHashes, write_refused
from services.jobs.backends import refusal_kind
from services.readers import Document
from workers import tasks
from workers.app import celery_config, create_app

pytestmark = pytest.mark.unit

URL = "redis://:secret@10.0.0.5:6379/0"
AOF_FULL = "MISCONF Errors writing to the AOF file: No space left on device"
RDB_FAILED = ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk. "
              "Commands that may modify the data set are disabled")
OOM = "OOM command not allowed when used memory > 'maxmemory'."


def test_a_full_aof_disk_is_one_line_naming_the_broker_its_folder_and_the_fix() -> None:
    error = write_refused(URL, redis.exceptions.ResponseError(AOF_FULL), FakeRedis())
    assert isinstance(error, BrokerDiskFull) and isinstance(error, DiskFull) and isinstance(error, TransientError)
    text = str(error)
    assert "\n" not in text and "secret" not in text
    assert "redis://:***@10.0.0.5:6379/0" in text and "/var/lib/redis" in text
    assert "No space left on device" in text and "free space" in text and "run the command again" in text


def test_each_refusal_says_its_own_cause_and_other_errors_are_left_alone() -> None:
    rdb = write_refused(URL, redis.exceptions.ResponseError(RDB_FAILED), FakeRedis())
    assert isinstance(rdb, BrokerWriteRefused) and not isinstance(rdb, DiskFull)
    assert "cannot save its data in /var/lib/redis" in str(rdb)
    oom = write_refused(URL, redis.exceptions.ResponseError(OOM))
    assert isinstance(oom, BrokerWriteRefused) and "out of memory" in str(oom) and "maxmemory" in str(oom)
    replica = write_refused(URL, redis.exceptions.ResponseError("READONLY You can't write against a read only "
                                                                "replica."))
    assert replica is not None and "primary" in str(replica)
    assert write_refused(URL, redis.exceptions.ResponseError("WRONGTYPE Operation against a key")) is None
    # a pipeline reports the refusal in a wrapped error, and celery/kombu may re-raise it from another
    try:
        try:
            raise redis.exceptions.ResponseError(f"Command # 1 (HSET k f v) of pipeline caused error: {AOF_FULL}")
        except redis.exceptions.ResponseError as inner:
            raise RuntimeError("ack failed") from inner
    except RuntimeError as outer:
        assert refusal_kind(outer) == "disk"


def test_managed_redis_without_config_still_gets_the_line() -> None:
    client = FakeRedis()
    client.config = {}  # CONFIG disabled or renamed: no folder to name
    text = str(write_refused(URL, redis.exceptions.ResponseError(AOF_FULL), client))
    assert "CONFIG GET dir" in text and "free space" in text


def test_the_job_store_turns_a_refused_write_into_the_line_and_reads_go_on() -> None:
    fake = FakeRedis()
    jobs = JobStore(RedisHashes(fake, url=URL))
    jobs.create("j1", collection="c", executor="broker")
    fake.refusing = AOF_FULL
    with pytest.raises(BrokerDiskFull, match="broker disk full"):
        jobs.create("j2", collection="c", executor="broker")
    with pytest.raises(BrokerDiskFull):
        jobs.record_batch("j1", 0, {"documents": 1})
    assert jobs.status("j1")["state"]  # reads answer


class StalledExecutor:
    """A job whose worker cannot move (the broker refuses its BRPOP and its records) and a broker to probe."""

    def __init__(self, fake: FakeRedis) -> None:
        self.fake = fake
        self.jobs = JobStore(RedisHashes(fake, url=URL))
        self.probes = 0

    def in_flight(self, job_id: str) -> set[int] | None:
        return {0, 1}  # both batches still have their message

    def resend(self, submitted: Submitted, batches: dict[int, list[Document]]) -> None:
        raise AssertionError("nothing is lost: nothing to re-send")

    def writable(self) -> None:
        self.probes += 1
        try:
            self.fake.set("dpr:write-probe", "1", ex=60)
        except redis.exceptions.ResponseError as e:
            refused = write_refused(URL, e, self.fake, "workers can neither take nor record batches meanwhile")
            assert refused is not None
            raise refused from e


def test_a_follower_stops_with_the_line_once_the_broker_refuses_writes() -> None:
    fake = FakeRedis()
    executor = StalledExecutor(fake)
    executor.jobs.create("j1", collection="c", executor="broker")
    for n in (0, 1):
        executor.jobs.record_submitted("j1", n, [f"d{n}"])
    executor.jobs.seal("j1", batches=2, documents=2, skipped=[], failed=[])
    seen: list[int] = []

    def fill_after_a_while(status: dict[str, Any]) -> None:
        seen.append(1)
        if len(seen) == 3:
            fake.refusing = AOF_FULL

    with pytest.raises(BrokerDiskFull, match="workers can neither take nor record"):
        follow_job(executor, "j1", poll=0.01, probe_every=0.05, on_status=fill_after_a_while, timeout=30)
    assert executor.probes >= 1


# --- the worker ---------------------------------------------------------------------------------------------------


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    s = Settings(broker_url=URL, data_dir=tmp_path, celery=CelerySettings(max_retries=2))
    app = create_app(s)
    fake = FakeRedis()
    jobs = JobStore(RedisHashes(fake, url=URL))
    written: list[str] = []

    def ingest(items: list[Any], job: str = "") -> IngestReport:
        written.extend(d.doc_id for d in items)  # the store took the batch ...
        fake.refusing = AOF_FULL  # ... and then the broker's disk filled
        return IngestReport(job=job, documents=len(items), chunks=len(items))

    runtime = SimpleNamespace(jobs=jobs, pipeline=SimpleNamespace(ingest_batch=ingest))
    runtime.for_collection = lambda _collection: runtime
    monkeypatch.setattr(tasks, "worker_runtime", lambda _settings: runtime)
    jobs.create("j1")
    jobs.seal("j1", batches=1, documents=2, skipped=[], failed=[])
    return SimpleNamespace(app=app, fake=fake, jobs=jobs, written=written, task=app.tasks["dpr.ingest_batch"])


def test_a_worker_hands_the_batch_back_when_the_broker_refuses_its_outcome(harness: SimpleNamespace) -> None:
    docs = [Document(doc_id=f"d{i}", text=f"text {i}", source=f"d{i}.txt").to_json() for i in range(2)]
    result = harness.task.apply(args=["j1", 0, docs])
    assert isinstance(result.result, Reject) and result.result.requeue is True  # back to the broker, not acked
    assert harness.written == ["d0", "d1"]  # the store has it: the redelivery finds it unchanged
    harness.fake.refusing = None
    status = harness.jobs.status("j1")
    assert status["batches_done"] == 0 and status["failed"] == []  # no failure (nor retry) recorded for it


def test_a_worker_reconnects_instead_of_shutting_down_on_a_refused_ack(tmp_path: Path) -> None:
    conf = celery_config(Settings(broker_url=URL, data_dir=tmp_path))
    assert conf["broker_channel_error_retry"] is True


def test_a_refusal_no_caller_translated_is_still_the_broker_line_on_the_cli(capsys: pytest.CaptureFixture[str]
                                                                            ) -> None:
    import typer

    from entrypoints.cli.common import EXIT_UNAVAILABLE, cli_errors

    with pytest.raises((SystemExit, typer.Exit)) as stopped, cli_errors():
        raise redis.exceptions.ResponseError(AOF_FULL)  # e.g. a lock's SET deep in a command
    code = getattr(stopped.value, "exit_code", None) or getattr(stopped.value, "code", None)
    assert code == EXIT_UNAVAILABLE
    err = capsys.readouterr().err
    assert "broker disk full" in err and "DPR_BROKER_URL" in err and "the disk of" not in err  # not the data dir's
    assert "Traceback" not in err


class RefusingApp:
    """A Celery app whose broker takes the first task and refuses the next (its disk filled meanwhile)."""

    def __init__(self) -> None:
        self.sent = 0

    def producer_or_acquire(self) -> Any:
        import contextlib

        return contextlib.nullcontext(object())

    def send_task(self, *args: Any, **kwargs: Any) -> None:
        if self.sent >= 1:
            raise redis.exceptions.ResponseError(AOF_FULL)
        self.sent += 1

    def close(self) -> None:
        pass


def test_a_submit_the_broker_refuses_midway_stops_with_the_line_naming_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers import executor as celery_executor

    settings = Settings(broker_url=URL, data_dir=tmp_path, celery=CelerySettings(batch_documents=1))
    monkeypatch.setattr(celery_executor, "create_app", lambda _s: RefusingApp())
    monkeypatch.setattr(celery_executor.redis.Redis, "from_url", lambda *a, **k: FakeRedis())  # CONFIG GET dir
    executor = celery_executor.CeleryExecutor(settings, jobs=JobStore(RedisHashes(FakeRedis(), url=URL)))
    docs = [Document(doc_id=f"d{i}", text=f"text {i}") for i in range(3)]
    with pytest.raises(BrokerDiskFull, match=r"job \w+ stopped after 1 batches") as refused:
        executor.submit(iter(docs), collection="c")
    assert "redis://:***@10.0.0.5:6379/0" in str(refused.value) and "/var/lib/redis" in str(refused.value)
