"""The Celery executor without a broker: batches, what goes to the tasks, what goes to the job header."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kit.fake_redis import FakeRedis

from services.core.settings import CelerySettings, Settings
from services.jobs import JobStore, RedisHashes
from services.readers import Document, DocumentFailure, Skipped
from workers import executor as celery_executor

pytestmark = pytest.mark.unit


class RecordingApp:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def producer_or_acquire(self) -> Iterator[object]:
        yield object()

    def send_task(self, name: str, args: list[Any], kwargs: dict[str, Any], queue: str, producer: object,
                  headers: dict[str, Any]) -> None:
        self.sent.append({"name": name, "args": args, "kwargs": kwargs, "queue": queue, "headers": headers})

    def close(self) -> None:
        pass


def test_submit_sends_documents_in_batches_and_keeps_refusals_in_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(broker_url="redis://127.0.0.1:6399/0", data_dir=tmp_path, collection="notes",
                        celery=CelerySettings(batch_documents=2))
    jobs = JobStore(RedisHashes(FakeRedis(), url=settings.broker_url or ""))
    app = RecordingApp()
    monkeypatch.setattr(celery_executor, "create_app", lambda _s: app)
    items = [
        Document("a", "alpha"), DocumentFailure("b.txt", "empty", "b.txt: has no text"), Document("c", "gamma"),
        Skipped("d.png", "unsupported"), Document("e", "epsilon"),
    ]

    submitted = celery_executor.CeleryExecutor(settings, jobs=jobs).submit(iter(items), collection="notes")

    assert submitted.to_json() | {"job": "-"} == {
        "job": "-", "state": "queued", "collection": "notes", "executor": "broker", "documents": 3, "batches": 2,
        "skipped": [{"source": "d.png", "reason": "unsupported"}],
        "failed": [{"source": "b.txt", "reason": "empty", "error": "b.txt: has no text"}],
        "skipped_total": 1, "failed_total": 1,
    }
    assert [m["queue"] for m in app.sent] == ["ingest", "ingest"]
    assert {m["name"] for m in app.sent} == {"dpr.ingest_batch"}
    assert [m["args"][1] for m in app.sent] == [0, 1]
    assert [[d["doc_id"] for d in m["args"][2]] for m in app.sent] == [["a", "c"], ["e"]]
    assert all(m["kwargs"] == {"collection": "notes"} for m in app.sent)
    assert [m["headers"] for m in app.sent] == [{"dpr_job": submitted.job, "dpr_batch": n} for n in (0, 1)]
    status = jobs.status(submitted.job)
    assert (status["state"], status["batches_total"], status["documents_total"]) == ("queued", 2, 3)
    assert [f["source"] for f in status["failed"]] == ["b.txt"]
    assert status["batches_pending"] == [0, 1]  # every batch handed over is known until a worker records it
