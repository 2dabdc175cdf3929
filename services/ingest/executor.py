"""The executor seam: where an ingest job's batches run. Chosen once, at the entry point:

- ``LocalExecutor`` (no broker, the embedded default): this process runs each batch as it is handed over,
  either in the caller's thread (``dpr ingest``) or on one background thread (the API, which answers 202 at
  once). Job state goes to files under the data dir, so ``dpr jobs ID`` shows in-process jobs too.
- ``workers.executor.CeleryExecutor`` (``DPR_BROKER_URL`` set): one Celery task per batch; job state in Redis.

Both cut a job into batches with ``services.ingest.batches.job_batches``; this one runs each with ``run_batch``
(as the Celery task does); callers read status through the executor's ``jobs`` and wait with
``services.ingest.follow.follow_job``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from services.core.errors import DprError
from services.ingest.batches import Submitted, job_batches, run_batch
from services.ingest.files import ParsedFiles, file_states, parse_files
from services.ingest.pipeline import IngestPipeline, IngestReport, new_job_id
from services.jobs.store import JobStore
from services.readers import Document, Item
from services.readers.filesig import FileRef

log = logging.getLogger(__name__)

BatchHook = Callable[[IngestReport], None]


class Executor(Protocol):
    name: str  # "local" | "broker"
    jobs: JobStore

    def submit(self, items: Iterable[Item], *, collection: str) -> Submitted:
        """Register a job and hand its batches over; returns once every batch is handed over."""
        ...

    def pending(self) -> int:
        """Work waiting to run (queue depth)."""
        ...

    def in_flight(self, job_id: str) -> set[int] | None:
        """Batch numbers the executor still holds a message for (queued, reserved or retrying); None: it cannot
        tell (the in-process one has nothing in flight)."""
        ...

    def resend(self, submitted: Submitted, batches: dict[int, list[Document]]) -> None:
        """Hand these batches over again (their numbers kept)."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    """Runs batches in this process. ``pipeline_for(collection)`` gives the collection's pipeline (the
    runtime's); ``background=True`` runs jobs one at a time on a thread and ``submit`` returns at once;
    ``scratch``: a throw-away collection's jobs (evaluation's): a batch's error propagates instead of failing the
    batch, and no index is built after the job."""

    name = "local"

    def __init__(
        self,
        jobs: JobStore,
        pipeline_for: Callable[[str], IngestPipeline],
        *,
        background: bool = False,
        on_batch: BatchHook | None = None,
        prefetch: bool = True,
        scratch: bool = False,
    ) -> None:
        self.jobs, self.scratch = jobs, scratch
        self.prefetch = prefetch  # parse the next batch's binary files while this one encodes
        self.pipeline_for = pipeline_for
        self.on_batch = on_batch
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpr-ingest") if background else None
        self._pending = 0
        self._lock = threading.Lock()

    def submit(self, items: Iterable[Item], *, collection: str) -> Submitted:
        submitted = Submitted(job=new_job_id(), collection=collection, executor=self.name)
        if self._pool is None:
            self.pipeline_for(collection)  # load the model first: the job's clock times the ingest, not the load
            self.jobs.create(submitted.job, collection=collection, executor=self.name)
            return self._run(submitted, items)
        self.jobs.create(submitted.job, collection=collection, executor=self.name)
        materialised = list(items)  # the request's items, already in memory
        with self._lock:
            self._pending += 1
        self._pool.submit(self._run_background, submitted, materialised)
        # What the caller sees is its own record: the background thread fills ``submitted`` meanwhile.
        return Submitted(job=submitted.job, collection=collection, executor=self.name,
                         documents=sum(isinstance(i, Document) for i in materialised))

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def in_flight(self, job_id: str) -> set[int] | None:
        return None  # batches run in this process: nothing is ever in flight elsewhere

    def resend(self, submitted: Submitted, batches: dict[int, list[Document]]) -> None:
        pipeline = self.pipeline_for(submitted.collection)
        for number, docs in sorted(batches.items()):
            self._run_batch(pipeline, submitted.job, number, list(docs))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def _run_background(self, submitted: Submitted, items: list[Item]) -> None:
        with self._lock:
            self._pending -= 1
        try:
            self._run(submitted, items)
        except Exception:  # the job's header says what happened; the serving process goes on
            log.exception("ingest job crashed", extra={"job": submitted.job})

    def _run(self, submitted: Submitted, items: Iterable[Item]) -> Submitted:
        """The batch loop: each batch runs here as ``job_batches`` cuts it. Parsing overlaps encoding: a batch's
        binary files are parsed (in the parser sandbox's child process) on one thread while the batch before it
        encodes and writes; its store lookups (is a file unchanged?) run here first, so the thread touches only
        files, and the two batches hold different documents."""
        pipeline = self.pipeline_for(submitted.collection)
        held: tuple[int, list[Item], Future[ParsedFiles | None]] | None = None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpr-parse") as parser:
            for number, docs in job_batches(self.jobs, submitted, items, batch_documents=pipeline.batch_documents,
                                            batch_bytes=pipeline.batch_bytes):
                batch: list[Item] = list(docs)
                parsing = self._parse_ahead(parser, pipeline, submitted.job, batch)
                if held is not None:
                    self._run_batch(pipeline, submitted.job, *held)
                    held = None
                if parsing is None:
                    self._run_batch(pipeline, submitted.job, number, batch)
                else:
                    held = (number, batch, parsing)
            if held is not None:  # the last batch
                self._run_batch(pipeline, submitted.job, *held)
        if not self.scratch:
            pipeline.store.maybe_optimize()  # HNSW once enough new points arrived (edge; off the lease, see store)
        if self.on_batch is not None and (submitted.skipped or submitted.failed):  # refused while reading
            self.on_batch(IngestReport(job=submitted.job, skipped=submitted.skipped, failed=submitted.failed))
        return submitted

    def _parse_ahead(self, parser: ThreadPoolExecutor, pipeline: IngestPipeline, job: str,
                     batch: list[Item]) -> Future[ParsedFiles | None] | None:
        """The batch's binary files, parsing on ``parser``; None when it has none or prefetch is off."""
        refs = [i for i in batch if isinstance(i, FileRef)]
        if not self.prefetch or not refs:
            return None
        try:
            known = file_states(pipeline, refs)
        except DprError as e:  # the batch runs without the head start and meets the error itself
            log.warning("looking up files ahead failed", extra={"job": job, "error": str(e)})
            return None
        return parser.submit(parse_files, pipeline, refs, job=job, known=known)

    def _run_batch(self, pipeline: IngestPipeline, job: str, number: int, batch: list[Item],
                   parsing: Future[ParsedFiles | None] | None = None) -> None:
        report = run_batch(self.jobs, pipeline, job, number, batch, worker="local", parsed=parsing,
                           retry=(Exception,) if self.scratch else ())
        if report is not None and self.on_batch is not None:
            self.on_batch(report)


def ingest_here(pipeline: IngestPipeline, items: Iterable[Item], jobs: JobStore,
                progress: BatchHook | None = None) -> IngestReport:
    """``items`` through the one batch loop in this process, the batches' reports summed (refusals included;
    ``progress`` sees the sum after each batch): for a throw-away collection, such as evaluation's, that has a
    pipeline but no runtime (``scratch``)."""
    total, t0 = IngestReport(job=""), time.perf_counter()

    def add(part: IngestReport) -> None:
        total.add(part)
        if progress is not None:
            progress(total)

    total.job = LocalExecutor(jobs, lambda _: pipeline, on_batch=add, scratch=True).submit(items, collection="").job
    total.seconds = time.perf_counter() - t0
    return total
