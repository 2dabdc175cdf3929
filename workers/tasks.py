"""Thin Celery tasks: primitives in, one service call, the result into the job store.

The towers, the BM25 embedder and the store are built on the first task a pool process runs and cached for the
life of that process (never at import, never in ``worker_process_init``), so forking the pool stays cheap and a
process that never receives a task never loads a model.

Retries: only ``TransientError`` (store or Redis unavailable, shard lock held too long) is retried, with
exponential backoff and jitter, up to ``celery.max_retries``. Bad documents are already reported one by one by
``services.ingest.ingest_batch``; anything else that fails a whole batch marks its documents failed with the
reason, so the job always ends and no other batch is affected.
"""

from __future__ import annotations

import logging
import os
import random
import socket
from dataclasses import dataclass, field
from typing import Any

from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded

from services.errors import TransientError
from services.ingest import IngestReport, ingest_batch
from services.jobs import JobStore
from services.locks import WriteFence
from services.readers import Document, DocumentFailure, Item
from services.runtime import Runtime
from services.settings import Settings
from services.store.protocol import VectorStore

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


@dataclass
class ProcessState:
    """What one pool process keeps between tasks: one Runtime (towers and BM25 loaded once, the default
    collection's store and write fence) plus, for tasks naming another collection, that collection's store and
    fence (its own Runtime, whose towers are never touched: models are shared through ``get_runtime()``)."""

    settings: Settings
    pid: int = field(default_factory=os.getpid)
    runtime: Runtime | None = None
    collections: dict[str, Runtime] = field(default_factory=dict)
    jobs: JobStore | None = None

    def get_runtime(self) -> Runtime:
        if self.runtime is None:
            self.runtime = Runtime(self.settings)
        return self.runtime

    def _for(self, collection: str | None) -> Runtime:
        if not collection or collection == self.settings.collection:
            return self.get_runtime()
        if collection not in self.collections:
            self.collections[collection] = Runtime(self.settings.model_copy(update={"collection": collection}))
        return self.collections[collection]

    def get_store(self, collection: str | None) -> VectorStore:
        return self._for(collection).store

    def get_fence(self, collection: str | None) -> WriteFence:
        return self._for(collection).fence

    def get_jobs(self) -> JobStore:
        if self.jobs is None:
            self.jobs = JobStore.from_url(self.settings.broker_url or "")
        return self.jobs


_state: ProcessState | None = None


def process_state(settings: Settings) -> ProcessState:
    global _state
    if _state is None or _state.pid != os.getpid() or _state.settings is not settings:
        _state = ProcessState(settings)
    return _state


def parse_documents(documents: list[dict[str, Any]]) -> list[Item]:
    items: list[Item] = []
    for i, data in enumerate(documents):
        try:
            items.append(Document.from_json(data))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            source = str(data.get("source") or data.get("doc_id") or f"item {i}") if isinstance(data, dict) else ""
            items.append(DocumentFailure(source, "invalid_task", f"{source}: malformed document in task ({e!r})"))
    return items


def batch_failure(job_id: str, items: list[Item], reason: str, error: str) -> dict[str, Any]:
    """A whole batch failed: every document in it is reported failed with the reason."""
    report = IngestReport(job=job_id)
    for item in items:
        if isinstance(item, Document):
            source = item.source or item.doc_id
            report.failed.append({"source": source, "reason": reason, "error": f"{source}: {error}"})
        elif isinstance(item, DocumentFailure):
            report.failed.append(item.to_json())
        else:
            report.skipped.append(item.to_json())
    return {**report.to_json(), "error": f"{reason}: {error}"}


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
    state = process_state(settings)
    retries = int(self.request.retries or 0)
    ids = {"job": job_id, "batch": batch, "attempt": retries}
    items = parse_documents(documents)
    try:
        jobs = state.get_jobs()
        deliveries = jobs.mark_started(
            job_id, batch, worker=f"{self.request.hostname or socket.gethostname()}:{os.getpid()}", attempt=retries
        )
        if deliveries > settings.celery.max_retries + 1 + EXTRA_DELIVERIES:
            log.error("batch keeps killing its worker; marking it failed", extra={**ids, "deliveries": deliveries})
            result = batch_failure(
                job_id, items, "worker_lost",
                f"the worker died {deliveries - 1} times on this batch (out of memory?); ingest it alone to see why",
            )
        else:
            log.info("batch started", extra={**ids, "documents": len(items)})
            runtime = state.get_runtime()
            report = ingest_batch(
                items,
                store=state.get_store(collection),
                towers=runtime.towers,
                chunking=settings.chunk,
                sparse=runtime.sparse,
                batch_size=settings.encoder.batch_size,
                job=job_id,
                fence=state.get_fence(collection),  # the target collection's, not the default one's
                towers_for=runtime.towers_for,
            )
            result = report.to_json()
        jobs.record_batch(job_id, batch, {**result, "attempt": retries})
    except TransientError as e:
        if retries >= settings.celery.max_retries:
            log.error("batch failed after retries", extra={**ids, "error": str(e)})
            _record_failure(state, job_id, batch, batch_failure(job_id, items, "unavailable", str(e)))
            return {"job": job_id, "batch": batch, "state": "failed"}
        countdown = backoff_seconds(retries)
        log.warning("batch will be retried", extra={**ids, "countdown": round(countdown, 1), "error": str(e)})
        raise self.retry(exc=e, countdown=countdown, max_retries=settings.celery.max_retries) from e
    except SoftTimeLimitExceeded:
        limit = settings.celery.task_time_limit
        log.error("batch hit the time limit", extra=ids)
        _record_failure(state, job_id, batch, batch_failure(
            job_id, items, "time_limit",
            f"the batch took longer than {limit} s; lower DPR_CELERY__BATCH_DOCUMENTS or raise "
            "DPR_CELERY__TASK_TIME_LIMIT (and DPR_CELERY__VISIBILITY_TIMEOUT above it)",
        ))
        return {"job": job_id, "batch": batch, "state": "failed"}
    except Exception as e:  # a permanent failure of the whole batch: report its documents, keep the others
        log.exception("batch failed", extra=ids)
        _record_failure(state, job_id, batch, batch_failure(job_id, items, "batch_error", f"{type(e).__name__}: {e}"))
        return {"job": job_id, "batch": batch, "state": "failed"}
    log.info("batch recorded", extra={**ids, "chunks": result.get("chunks", 0)})
    return {"job": job_id, "batch": batch, "state": "done"}


def _record_failure(state: ProcessState, job_id: str, batch: int, result: dict[str, Any]) -> None:
    try:
        state.get_jobs().record_batch(job_id, batch, result)
    except TransientError:
        log.exception("could not record a failed batch", extra={"job": job_id, "batch": batch})
