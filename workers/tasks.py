"""Thin Celery tasks: primitives in, one pipeline call (``services.jobs.run_batch``), the outcome in the job store.

The process's one ``Runtime`` (towers, BM25 embedder, store) is built on the first task a pool process runs and
kept for the life of that process (never at import, never in ``worker_process_init``), so forking the pool stays
cheap and a process that never receives a task never loads a model.

Retries: only ``TransientError`` (store or Redis unavailable, shard lock held too long) is retried, with
exponential backoff and jitter, up to ``celery.max_retries``. Bad documents are already reported one by one by
the pipeline; anything else that fails a whole batch marks its documents failed with the
reason, so the job always ends and no other batch is affected.
"""

from __future__ import annotations

import logging
import os
import random
import socket
from typing import Any

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded

from services.documents import Document, DocumentFailure, Item
from services.errors import TransientError
from services.jobs import JobStore, batch_failure, run_batch
from services.runtime import Runtime
from services.settings import Settings

log = logging.getLogger(__name__)

BACKOFF_BASE = 2.0  # seconds before the first retry (then 4, 8, ... with jitter)
BACKOFF_MAX = 300.0
# A batch started this many times more than its retries allow has killed its worker repeatedly (e.g. out of
# memory): it is marked failed instead of being delivered forever.
EXTRA_DELIVERIES = 3


def backoff_seconds(retries: int, base: float = BACKOFF_BASE, cap: float = BACKOFF_MAX) -> float:
    """Exponential backoff with "equal jitter": between half and all of min(cap, base * 2**retries)."""
    ceiling = min(cap, base * (2**retries))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


_runtime: tuple[int, Settings, Runtime] | None = None


def worker_runtime(settings: Settings) -> Runtime:
    """This pool process's one Runtime: towers and BM25 load on its first task and stay for its life; tasks
    naming another collection get ``for_collection`` (same models, that collection's store and fence)."""
    global _runtime
    pid = os.getpid()
    if _runtime is None or _runtime[0] != pid or _runtime[1] is not settings:
        _runtime = (pid, settings, Runtime(settings))
    return _runtime[2]


def parse_documents(documents: list[dict[str, Any]]) -> list[Item]:
    items: list[Item] = []
    for i, data in enumerate(documents):
        try:
            items.append(Document.from_json(data))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            source = str(data.get("source") or data.get("doc_id") or f"item {i}") if isinstance(data, dict) else ""
            items.append(DocumentFailure(source, "invalid_task", f"{source}: malformed document in task ({e!r})"))
    return items


@shared_task(
    name="dpr.ingest_batch",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def ingest_batch_task(
    self: Task, job_id: str, batch: int, documents: list[dict[str, Any]], collection: str | None = None
) -> dict[str, Any]:
    """Ingest one batch of documents (``Document.to_json()`` dicts) and record the result under the job."""
    settings: Settings = self.app.settings  # type: ignore[attr-defined]
    runtime = worker_runtime(settings).for_collection(collection)
    retries = int(self.request.retries or 0)
    ids = {"job": job_id, "batch": batch, "attempt": retries}
    items = parse_documents(documents)
    try:
        run_batch(
            runtime.jobs, runtime.pipeline, job_id, batch, items, attempt=retries,
            worker=f"{self.request.hostname or socket.gethostname()}:{os.getpid()}",
            max_deliveries=settings.celery.max_retries + 1 + EXTRA_DELIVERIES,
        )
    except TransientError as e:
        if retries >= settings.celery.max_retries:
            log.error("batch failed after retries", extra={**ids, "error": str(e)})
            _record_failure(runtime.jobs, job_id, batch, batch_failure(job_id, items, "unavailable", str(e)))
            return {"job": job_id, "batch": batch, "state": "failed"}
        countdown = backoff_seconds(retries)
        log.warning("batch will be retried", extra={**ids, "countdown": round(countdown, 1), "error": str(e)})
        raise self.retry(exc=e, countdown=countdown, max_retries=settings.celery.max_retries) from e
    except SoftTimeLimitExceeded:
        limit = settings.celery.task_time_limit
        log.error("batch hit the time limit", extra=ids)
        _record_failure(runtime.jobs, job_id, batch, batch_failure(
            job_id, items, "time_limit",
            f"the batch took longer than {limit} s; lower DPR_CELERY__BATCH_DOCUMENTS or raise "
            "DPR_CELERY__TASK_TIME_LIMIT (and DPR_CELERY__VISIBILITY_TIMEOUT above it)",
        ))
        return {"job": job_id, "batch": batch, "state": "failed"}
    except Exception as e:  # a permanent failure of the whole batch: report its documents, keep the others
        log.exception("batch failed", extra=ids)
        _record_failure(runtime.jobs, job_id, batch,
                        batch_failure(job_id, items, "batch_error", f"{type(e).__name__}: {e}"))
        return {"job": job_id, "batch": batch, "state": "failed"}
    return {"job": job_id, "batch": batch, "state": "done"}


def _record_failure(jobs: JobStore, job_id: str, batch: int, result: dict[str, Any]) -> None:
    try:
        jobs.record_batch(job_id, batch, result)
    except TransientError:
        log.exception("could not record a failed batch", extra={"job": job_id, "batch": batch})
