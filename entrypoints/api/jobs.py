"""Ingest jobs behind the API: where a POST /v1/documents goes and where GET /v1/jobs/{id} looks.

- ``BrokerJobs`` (``DPR_BROKER_URL`` set): the same path as ``dpr ingest`` with a broker:
  ``workers.dispatch.submit_ingest`` and the job state the workers keep in Redis (``services.jobs``).
- ``LocalJobs`` (no broker, the embedded default): the same pipeline ``dpr ingest`` runs in-process,
  ``services.ingest.ingest_documents``, on one background thread, one job at a time; job state is kept in this
  process (the last ``keep`` jobs), shaped like the workers' job JSON: ``IngestReport.to_json()`` plus ``state``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Protocol

from services.errors import DprError
from services.ingest import IngestReport, batched_items, new_job_id
from services.readers import Document, Item
from services.runtime import run_ingest
from services.settings import Settings

log = logging.getLogger(__name__)

# Job states, as ``services.jobs`` names them for broker jobs. Terminal: done, failed.
QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
TERMINAL = (DONE, FAILED)


class JobBackend(Protocol):
    executor: str  # "local" | "broker"

    def submit(self, items: list[Item]) -> dict[str, Any]:
        """Accept a batch of parsed items; returns the job JSON (with ``job`` and ``state``)."""
        ...

    def get(self, job_id: str) -> dict[str, Any] | None: ...

    def pending(self) -> int:
        """Work waiting to run (queue depth)."""
        ...

    def close(self) -> None: ...


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class LocalJobs:
    """In-process ingest on one background thread; ``runtime`` gives the store and towers (loaded once)."""

    executor = "local"

    def __init__(
        self,
        settings: Settings,
        runtime: Any,
        on_batch: Callable[[IngestReport], None] | None = None,
        keep: int = 1000,
    ) -> None:
        self.settings = settings
        self.runtime = runtime
        self.on_batch = on_batch
        self.keep = keep
        self._jobs: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._pending = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpr-ingest")

    def submit(self, items: list[Item]) -> dict[str, Any]:
        job = new_job_id()
        c = self.settings.celery
        batches = sum(1 for _ in batched_items(items, c.batch_documents, c.batch_bytes))
        record = IngestReport(job=job).to_json() | {
            "state": QUEUED,
            "collection": self.settings.collection,
            "executor": self.executor,
            "batches_done": 0,
            "batches_total": batches,
            "documents_total": sum(isinstance(i, Document) for i in items),
            "errors": [],
            "submitted_at": _now(),
        }
        with self._lock:
            self._jobs[job] = record
            while len(self._jobs) > self.keep:
                self._jobs.popitem(last=False)
            self._pending += 1
            snapshot = dict(record)
        self._pool.submit(self._run, job, items)
        return snapshot

    def get(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            record = self._jobs.get(job_id)
            return None if record is None else _copy(record)

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def wait(self, job_id: str, timeout: float) -> dict[str, Any] | None:
        """Test and benchmark helper: block until the job ends (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = self.get(job_id)
            if record is None or record["state"] in TERMINAL:
                return record
            time.sleep(0.02)
        return self.get(job_id)

    # --- the background thread -----------------------------------------------------------------------------

    def _update(self, job_id: str, changes: dict[str, Any]) -> None:
        with self._lock:
            if job_id in self._jobs:
                self._jobs[job_id].update(changes)

    def _run(self, job: str, items: list[Item]) -> None:
        with self._lock:
            self._pending -= 1
        self._update(job, {"state": RUNNING, "started_at": _now()})
        running = IngestReport(job=job)
        batches_done = 0
        t0 = time.perf_counter()

        def progress(part: IngestReport) -> None:
            nonlocal batches_done
            running.add(part)
            batches_done += 1
            running.seconds = time.perf_counter() - t0
            self._update(job, running.to_json() | {"batches_done": batches_done})
            if self.on_batch is not None:
                self.on_batch(part)

        try:
            report = run_ingest(self.runtime, self.settings, items, job=job, progress=progress)
        except DprError as e:
            log.warning("ingest job failed", extra={"job": job, "error": str(e)})
            self._fail(job, type(e).__name__, str(e))
            return
        except Exception as e:  # the job fails with a reason; the API process goes on
            log.exception("ingest job crashed", extra={"job": job})
            self._fail(job, "internal", f"{type(e).__name__}: {e}")
            return
        self._update(job, report.to_json() | {"state": DONE, "finished_at": _now()})

    def _fail(self, job: str, type_: str, message: str) -> None:
        with self._lock:
            record = self._jobs.get(job)
            if record is not None:
                record["errors"] = [*record.get("errors", []), {"type": type_, "error": message}]
                record.update(state=FAILED, finished_at=_now())


class BrokerJobs:
    """Celery workers do the work; the job state is whatever the workers record in Redis."""

    executor = "broker"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def submit(self, items: list[Item]) -> dict[str, Any]:
        from workers.dispatch import submit_ingest

        submitted = submit_ingest(self.settings, items)
        return dict(submitted.to_json()) | {"executor": self.executor}

    def get(self, job_id: str) -> dict[str, Any] | None:
        from services.jobs import JobNotFound
        from workers.dispatch import job_status

        try:
            return dict(job_status(self.settings, job_id)) | {"executor": self.executor}
        except JobNotFound:
            return None

    def pending(self) -> int:
        from workers.dispatch import queue_depth

        return int(queue_depth(self.settings))

    def close(self) -> None:
        return None


def _copy(record: dict[str, Any]) -> dict[str, Any]:
    out = dict(record)
    for key in ("failed", "skipped", "errors"):
        if isinstance(out.get(key), list):
            out[key] = list(out[key])
    return out
