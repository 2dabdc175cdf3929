"""The one batch loop of every ingest job, whoever runs it: ``job_batches`` cuts the job into batches (each
recorded before it is handed over; the job sealed after the last), and ``run_batch`` runs one batch and records its
outcome, a failure included. The in-process executor loops ``for batch in job_batches(...): run_batch(...)``;
the Celery executor sends each batch as a task, and the task (``workers.tasks``) calls ``run_batch``. Nothing
here calls back into its caller.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Any

from services.core.errors import DiskFull, DprError, TransientError
from services.ingest.files import PARSE_DEATHS, ParsedFiles, ParseGuard
from services.ingest.pipeline import IngestPipeline, IngestReport
from services.jobs.backends import refusal_kind
from services.jobs.store import KEEP_RECORDS, JobStore
from services.readers import Document, DocumentFailure, Item
from services.readers.filesig import FileRef

log = logging.getLogger(__name__)


@dataclass
class Submitted:
    """What the submitter knows once every batch is handed over."""

    job: str
    collection: str
    executor: str = ""
    documents: int = 0
    batches: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    batch_ids: dict[int, list[str]] = field(default_factory=dict)  # what the submitter handed over, for re-sending
    skipped_total: int = 0  # refusals counted; only the first KEEP_RECORDS of each are kept in full
    failed_total: int = 0

    def refuse(self, item: Item) -> None:
        """A document refused while reading: counted, and kept in full while there are few."""
        if isinstance(item, DocumentFailure):
            self.failed_total += 1
            if len(self.failed) < KEEP_RECORDS:
                self.failed.append(item.to_json())
        else:
            self.skipped_total += 1
            if len(self.skipped) < KEEP_RECORDS:
                self.skipped.append(item.to_json())

    def to_json(self) -> dict[str, Any]:
        """The job's first status: every field but ``batch_ids``, in the state ``queued``."""
        fields = asdict(self)
        del fields["batch_ids"]
        return {"job": fields.pop("job"), "state": "queued", **fields}


def batched_items(items: Iterable[Item], max_docs: int, max_bytes: int) -> Iterator[list[Item]]:
    """Group items into batches bounded by document count and text bytes (the one place batches are cut)."""
    batch: list[Item] = []
    size = 0
    for item in items:
        if isinstance(item, FileRef):  # weighed by its file: a large PDF goes alone, small ones together
            n = item.size
        else:
            n = len(item.text.encode("utf-8")) if isinstance(item, Document) else 0
        if batch and (len(batch) >= max_docs or size + n > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += n
    if batch:
        yield batch


def job_batches(
    jobs: JobStore, submitted: Submitted, items: Iterable[Item], *, batch_documents: int, batch_bytes: int,
) -> Iterator[tuple[int, list[Document]]]:
    """Stream ``items`` into numbered batches: documents refused while reading go to the job's header, every batch
    is recorded (with its document ids) before it is yielded, and the job is sealed with the totals once the
    caller has taken the last one. ``jobs.create`` must have run for ``submitted.job``."""

    def documents_only() -> Iterator[Document]:
        for item in items:
            if isinstance(item, Document):
                submitted.documents += 1
                yield item
            else:
                submitted.refuse(item)

    for number, batch in enumerate(batched_items(documents_only(), batch_documents, batch_bytes)):
        docs = [d for d in batch if isinstance(d, Document)]
        ids = [d.doc_id for d in docs]
        jobs.record_submitted(submitted.job, number, ids)
        submitted.batch_ids[number] = ids
        yield number, docs
        submitted.batches = number + 1
    jobs.seal(submitted.job, batches=submitted.batches, documents=submitted.documents,
              skipped=submitted.skipped, failed=submitted.failed,
              skipped_total=submitted.skipped_total, failed_total=submitted.failed_total)
    log.info("job submitted", extra={"job": submitted.job, "batches": submitted.batches})


def fail_batch(jobs: JobStore, job_id: str, number: int, items: list[Item], reason: str, error: str,
               **extra: Any) -> None:
    """A whole batch failed: every document in it is recorded failed with the reason. A job store that cannot
    take the record either is logged, not raised: the caller's own error is the one to report."""
    report = IngestReport(job=job_id)
    for item in items:
        if isinstance(item, Document):
            source = item.source or item.doc_id
            report.failed.append({"source": source, "reason": reason, "error": f"{source}: {error}"})
        elif isinstance(item, DocumentFailure):
            report.failed.append(item.to_json())
        else:
            report.skipped.append(item.to_json())
    try:
        jobs.record_batch(job_id, number, {**report.to_json(), "error": f"{reason}: {error}", **extra})
    except TransientError:
        log.exception("could not record a failed batch", extra={"job": job_id, "batch": number})


def run_batch(
    jobs: JobStore,
    pipeline: IngestPipeline,
    job_id: str,
    number: int,
    items: list[Item],
    *,
    attempt: int = 0,
    worker: str = "",
    max_deliveries: int | None = None,
    parsed: Future[ParsedFiles | None] | None = None,
    retry: tuple[type[BaseException], ...] = (),
) -> IngestReport | None:
    """Mark the batch started, run it through the pipeline and record its outcome (``parsed``: its files, parsed
    ahead by the caller). Returns None when the batch failed (its documents recorded failed with the reason) or
    was started more than ``max_deliveries`` times (it keeps killing its worker). Errors of the ``retry`` kinds
    propagate (the Celery task retries them), as does a job store that refuses writes (nothing can be recorded)
    and ``DiskFull``, once recorded: every later batch would fail the same way."""
    ids = {"job": job_id, "batch": number, "attempt": attempt}
    try:
        return _run_batch(jobs, pipeline, job_id, number, items, attempt=attempt, worker=worker,
                          max_deliveries=max_deliveries, parsed=parsed)
    except retry:
        raise
    except Exception as e:
        if refusal_kind(e) is not None:
            raise
        if isinstance(e, DprError):  # this batch fails with its reason; the next batches still run
            log.warning("batch failed", extra={**ids, "error": str(e)})
            fail_batch(jobs, job_id, number, items, type(e).__name__, str(e))
        else:
            log.exception("batch failed", extra=ids)
            fail_batch(jobs, job_id, number, items, "batch_error", f"{type(e).__name__}: {e}")
        if isinstance(e, DiskFull):
            raise
        return None


def _run_batch(jobs: JobStore, pipeline: IngestPipeline, job_id: str, number: int, items: list[Item], *,
               attempt: int, worker: str, max_deliveries: int | None,
               parsed: Future[ParsedFiles | None] | None) -> IngestReport | None:
    files = any(isinstance(i, FileRef) for i in items)
    was_parsing = jobs.parsing(job_id, number) if files else ""  # left by a delivery that died while parsing
    deliveries = jobs.mark_started(job_id, number, worker=worker, attempt=attempt)
    ids = {"job": job_id, "batch": number, "attempt": attempt}
    if max_deliveries is not None and deliveries > max_deliveries:
        log.error("batch keeps killing its worker; marking it failed", extra={**ids, "deliveries": deliveries})
        fail_batch(jobs, job_id, number, items, "worker_lost",
                   f"the worker died {deliveries - 1} times on this batch (out of memory, or the hard time limit?); "
                   "ingest it alone to see why", attempt=attempt)
        return None
    log.info("batch started", extra={**ids, "documents": len(items)})
    ahead = parsed.result() if parsed is not None else None
    if ahead is not None:
        report = pipeline.ingest_batch(items, job=job_id, parsed=ahead)
    elif files:
        poisoned = set()
        if was_parsing and deliveries > 1 and jobs.parse_died(job_id, number, was_parsing) >= PARSE_DEATHS:
            poisoned.add(was_parsing)
        guard = ParseGuard(jobs, job_id, number, poisoned=poisoned)
        report = pipeline.ingest_batch(items, job=job_id, guard=guard)
    else:
        report = pipeline.ingest_batch(items, job=job_id)
    jobs.record_batch(job_id, number, {**report.to_json(), "attempt": attempt})
    log.info("batch recorded", extra={**ids, "chunks": report.chunks})
    return report
