"""Thin Celery tasks: primitives in, one call (``services.ingest.batches.run_batch``: the batch loop's body, the same
one the in-process executor runs), the outcome in the job store.

Model loading: each prefork pool process builds its one ``Runtime`` and loads the towers and the BM25 embedder
right after the fork (``worker_process_init``), before it takes its first task, and keeps them for its life.
Why there and not lazily on the first task: a task's soft and hard time limits start when the pool process
accepts it, so a lazy load made the first batch of every fresh process pay for the load inside its limit, and
under load batches failed on it (issue 12). Loading in the child, never at import or in the parent, keeps the
fork cheap and torch out of the parent; the pool waits for a loading child instead of killing it after
Celery's default 4 s (``worker_proc_alive_timeout`` in ``workers.app``), and tasks queue in the parent
meanwhile. A load that fails there is logged and tried again by the first task, which then reports the error
per batch. Outside a prefork pool (eager tests, another pool) the Runtime is still built on first use.

A broker that refuses writes can record neither an outcome nor a retry: ``_leave_with_a_refusing_broker``.

Retries: ``TransientError`` (store or Redis unavailable, shard lock held too long) and a soft time limit are
retried with exponential backoff and jitter, up to ``celery.max_retries``; the failure after the last retry
names the limit that fired. Bad documents are already reported one by one by the pipeline; anything else that
fails a whole batch marks its documents failed with the reason (``run_batch``), so the job always ends and no other
batch is affected.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from typing import Any

from celery import Task, current_app, shared_task
from celery.exceptions import Reject, SoftTimeLimitExceeded
from celery.signals import worker_process_init

from services.core.errors import TransientError
from services.core.settings import Settings
from services.ingest.batches import fail_batch, run_batch
from services.jobs import TERMINAL, JobStore
from services.jobs.backends import refusal_kind
from services.readers import Document, DocumentFailure, Item
from services.readers.filesig import FileRef, is_file_task, release_spooled
from services.runtime import Runtime
from workers.app import SOFT_LIMIT_MARGIN

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
    """This pool process's one Runtime (built at pool start, else on first use) kept for its life; tasks naming
    another collection get ``for_collection`` (same models, that collection's store and fence)."""
    global _runtime
    pid = os.getpid()
    if _runtime is None or _runtime[0] != pid or _runtime[1] is not settings:
        _runtime = (pid, settings, Runtime(settings))
    return _runtime[2]


@worker_process_init.connect(weak=False, dispatch_uid="dpr.load_models_at_pool_start")
def load_models_at_pool_start(**_: Any) -> None:
    """In each prefork pool process right after the fork (the app is current by then): load the models before
    the process accepts a task, so no task's time limit pays for the load. Never raises: a failed load is tried
    again by the first task, which reports it per batch."""
    settings: Settings | None = getattr(current_app, "settings", None)
    if settings is None:  # not a dpr app
        return
    t0 = time.perf_counter()
    try:
        runtime = worker_runtime(settings)
        runtime.towers.encode_documents(["warm-up"], batch_size=1)  # weights, tokenizer, first-call setup
        runtime.sparse.embed_document("warm-up")
    except Exception as e:
        log.exception("loading the models at pool start failed; the first task tries again (%s)", e)
        return
    log.info("models loaded at pool start", extra={"pid": os.getpid(), "seconds": round(time.perf_counter() - t0, 1)})


def parse_documents(documents: list[dict[str, Any]]) -> list[Item]:
    items: list[Item] = []
    for i, data in enumerate(documents):
        try:  # a binary file travels unparsed ({"file": ...}) and is parsed here, inside the batch
            items.append(FileRef.from_json(data) if is_file_task(data) else Document.from_json(data))
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
        report = run_batch(
            runtime.jobs, runtime.pipeline, job_id, batch, items, attempt=retries,
            worker=f"{self.request.hostname or socket.gethostname()}:{os.getpid()}",
            max_deliveries=settings.celery.max_retries + 1 + EXTRA_DELIVERIES,
            retry=(TransientError, SoftTimeLimitExceeded),
        )
    except TransientError as e:
        _leave_with_a_refusing_broker(e, ids)
        return _retry_or_fail(self, runtime.jobs, items, ids, e, "unavailable", str(e))
    except SoftTimeLimitExceeded as e:
        return _retry_or_fail(self, runtime.jobs, items, ids, e, "time_limit", time_limit_message(self))
    except Exception as e:  # run_batch recorded any other failure; this one could not be recorded
        _leave_with_a_refusing_broker(e, ids)
        raise
    release_spooled(items, settings.celery.path_map)  # API uploads kept for this batch: its outcome is recorded
    _index_when_the_job_ends(runtime, job_id)
    return {"job": job_id, "batch": batch, "state": "done" if report is not None else "failed"}


def _leave_with_a_refusing_broker(error: Exception, ids: dict[str, Any]) -> None:
    """The broker refuses writes (its disk is full, it is out of memory): neither the outcome, nor a retry, nor a
    failure can be recorded. Raise ``Reject(requeue=True)``: the message goes back to the queue, or, while the
    broker refuses that write too, stays in its unacked set and is delivered again after the visibility timeout
    once the broker takes writes (the worker's consumer reconnects: ``broker_channel_error_retry``). Whatever
    the batch wrote to the store stays and is unchanged the next time: nothing lost, nothing twice."""
    kind = refusal_kind(error)
    if kind is None:
        return
    log.error("the broker refuses writes (%s); the batch stays with the broker and runs again once it takes "
              "writes: %s", kind, error, extra=ids)
    raise Reject(f"the broker refuses writes ({kind})", requeue=True) from error


def _index_when_the_job_ends(runtime: Runtime, job_id: str) -> None:
    """The worker that records a job's last batch asks the store for its HNSW index (built once enough new points
    arrived: ``DPR_EDGE__INDEX_THRESHOLD``), as an in-process ingest does at its end. Never fails the batch."""
    try:
        if runtime.jobs.status(job_id)["state"] in TERMINAL:
            runtime.store.maybe_optimize()
    except Exception as e:
        log.warning("index build after the job failed; `dpr optimize` builds it (%s)", e, extra={"job": job_id})


def _retry_or_fail(
    task: Task, jobs: JobStore, items: list[Item], ids: dict[str, Any], error: Exception, reason: str, message: str
) -> dict[str, Any]:
    """Retry the batch with backoff (raises ``Retry``), or after ``celery.max_retries`` record its documents
    failed with ``reason`` and ``message``."""
    settings: Settings = task.app.settings  # type: ignore[attr-defined]
    job_id, batch, retries = ids["job"], ids["batch"], ids["attempt"]
    if retries >= settings.celery.max_retries:
        log.error("batch failed after retries", extra={**ids, "reason": reason, "error": message})
        fail_batch(jobs, job_id, batch, items, reason, message)
        return {"job": job_id, "batch": batch, "state": "failed"}
    countdown = backoff_seconds(retries)
    log.warning("batch will be retried",
                extra={**ids, "reason": reason, "countdown": round(countdown, 1), "error": message})
    raise task.retry(exc=error, countdown=countdown, max_retries=settings.celery.max_retries) from error


def time_limits(task: Task) -> tuple[float | None, float | None]:
    """(soft, hard) seconds that apply to this run of ``task``: the call's own, else the task's, else the app's."""
    hard, soft = task.request.timelimit or (None, None)
    conf = task.app.conf
    return (soft or task.soft_time_limit or conf.task_soft_time_limit,
            hard or task.time_limit or conf.task_time_limit)


def time_limit_message(task: Task) -> str:
    soft, hard = time_limits(task)
    fired = f"the soft time limit of {soft:g} s" if soft else "the soft time limit"
    if hard:
        fired += f" (hard limit {hard:g} s)"
    tries = int(task.request.retries or 0) + 1
    return (
        f"the batch was stopped by {fired} on each of {tries} attempts; lower "
        "DPR_CELERY__BATCH_DOCUMENTS or raise DPR_CELERY__TASK_TIME_LIMIT (the soft limit is "
        f"{SOFT_LIMIT_MARGIN} s below it; keep DPR_CELERY__VISIBILITY_TIMEOUT above it)"
    )
