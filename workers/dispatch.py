"""The submitting side: documents -> batches -> one ``dpr.ingest_batch`` task each, tracked as a job in Redis.

Used by ``dpr ingest`` when ``DPR_BROKER_URL`` is set. Documents stream through: the job is registered first,
each batch is sent as soon as it is full, and the job is sealed with its totals at the end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import kombu.exceptions
import redis
import redis.exceptions

from services.errors import ConfigError, TransientError
from services.ingest import batched_items, new_job_id
from services.jobs import JobStore, redact_url, unavailable
from services.readers import Document, DocumentFailure, Item
from services.settings import Settings
from workers.app import INGEST_QUEUE, create_app

log = logging.getLogger(__name__)

INGEST_TASK = "dpr.ingest_batch"


class BrokerUnavailable(TransientError):
    """Tasks cannot be sent to the broker."""


class JobWaitTimeout(TransientError):
    """The job did not end within the time the caller was willing to wait."""


@dataclass
class Submitted:
    job: str
    collection: str
    documents: int = 0
    batches: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "state": "queued",
            "collection": self.collection,
            "documents": self.documents,
            "batches": self.batches,
            "skipped": self.skipped,
            "failed": self.failed,
        }


def _broker_url(settings: Settings) -> str:
    if not settings.broker_url:
        raise ConfigError("no broker configured; set DPR_BROKER_URL=redis://host:6379/0")
    return settings.broker_url


def job_store(settings: Settings) -> JobStore:
    return JobStore.from_url(_broker_url(settings))


def submit_ingest(settings: Settings, items: Iterable[Item]) -> Submitted:
    """Register a job and send one task per batch of documents to the ``ingest`` queue."""
    url = _broker_url(settings)
    jobs = job_store(settings)
    jobs.ping()
    submitted = Submitted(job=new_job_id(), collection=settings.collection)
    jobs.create(submitted.job, collection=settings.collection)

    def documents_only() -> Iterator[Document]:
        for item in items:
            if isinstance(item, Document):
                submitted.documents += 1
                yield item
            elif isinstance(item, DocumentFailure):
                submitted.failed.append(item.to_json())
            else:
                submitted.skipped.append(item.to_json())

    app = create_app(settings)
    c = settings.celery
    try:
        with app.producer_or_acquire() as producer:
            for number, batch in enumerate(batched_items(documents_only(), c.batch_documents, c.batch_bytes)):
                app.send_task(
                    INGEST_TASK,
                    args=[submitted.job, number, [d.to_json() for d in batch if isinstance(d, Document)]],
                    kwargs={"collection": settings.collection},
                    queue=INGEST_QUEUE,
                    producer=producer,
                )
                submitted.batches = number + 1
    except (kombu.exceptions.OperationalError, redis.exceptions.ConnectionError) as e:
        raise BrokerUnavailable(
            f"cannot send tasks to the broker at {redact_url(url)} ({e}); job {submitted.job} stopped after "
            f"{submitted.batches} batches: fix the broker and ingest again (unchanged documents cost nothing)"
        ) from e
    finally:
        app.close()
    jobs.seal(
        submitted.job,
        batches=submitted.batches,
        documents=submitted.documents,
        skipped=submitted.skipped,
        failed=submitted.failed,
    )
    log.info("job submitted", extra={"job": submitted.job, "batches": submitted.batches})
    return submitted


def job_status(settings: Settings, job_id: str) -> dict[str, Any]:
    return job_store(settings).status(job_id)


def wait_for_job(
    settings: Settings,
    job_id: str,
    show_progress: bool,
    poll: float = 0.5,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Poll the job until it is done or failed; a rich progress bar on stderr when ``show_progress``.

    Returns the job's status: the keys of ``IngestReport.to_json()`` plus ``state`` and progress fields.
    Raises ``JobWaitTimeout`` if ``timeout`` seconds pass first.
    """
    jobs = job_store(settings)
    deadline = None if timeout is None else time.monotonic() + timeout
    if not show_progress:
        while True:
            status = jobs.status(job_id)
            if status["state"] in ("done", "failed"):
                return status
            _check_deadline(deadline, job_id, status)
            time.sleep(poll)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]job {task.fields[job]}[/] {task.fields[state]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("batches  {task.fields[chunks]} passages  {task.fields[failed]} failed"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        task = progress.add_task("job", total=None, job=job_id, state="", chunks=0, failed=0)
        while True:
            status = jobs.status(job_id)
            progress.update(
                task,
                total=status["batches_total"],
                completed=status["batches_done"],
                state=status["state"],
                chunks=status["chunks"],
                failed=len(status["failed"]),
            )
            if status["state"] in ("done", "failed"):
                return status
            _check_deadline(deadline, job_id, status)
            time.sleep(poll)


def _check_deadline(deadline: float | None, job_id: str, status: dict[str, Any]) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise JobWaitTimeout(
            f"job {job_id} is still {status['state']} ({status['batches_done']}/{status['batches_total']} "
            "batches); is a worker running? start one with `dpr worker`"
        )


def queue_depth(settings: Settings, queue: str = INGEST_QUEUE) -> int:
    """Messages waiting in ``queue`` (not counting the ones workers hold)."""
    url = _broker_url(settings)
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
    try:
        return int(client.llen(queue))
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
        raise unavailable(url, e) from e
    finally:
        client.close()
