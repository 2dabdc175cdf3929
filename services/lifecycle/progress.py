"""The progress of a re-embed spread over workers, kept as a job of the one job model (``services.jobs``).

A re-embed into generation ``target`` of ``alias`` is the job ``reembed_job_id(alias, target)``: each copy batch
the submitter sends is a submitted batch, each batch a worker finishes is its outcome, the job is sealed when the
last batch is sent, and the finalize step's outcome is the ``result`` field of its header. So ``dpr jobs ID``
shows a re-embed as it shows an ingest. It lives where ingest jobs of a broker live (Redis). A re-embed in
process keeps no record (its progress goes to a callback).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from services.core.settings import Settings
from services.jobs import JobNotFound, JobStore

TTL = 7 * 24 * 3600


def reembed_job_id(alias: str, target: str) -> str:
    """A stable job id per (collection, target generation): the submitter and every worker find the same job."""
    return "reembed-" + hashlib.sha1(f"{alias}\0{target}".encode()).hexdigest()[:16]


class ReembedProgress:
    """Which copy batches were sent and which are done, when the last moved, and the finalize result."""

    def __init__(self, jobs: JobStore, alias: str, target: str) -> None:
        self.jobs = jobs
        self.alias = alias
        self.target = target
        self.job = reembed_job_id(alias, target)

    def reset(self) -> None:
        """Forget an earlier run's progress (a generation name can come back after `dpr gc`) and open the job."""
        self.jobs.delete(self.job)
        self.jobs.create(self.job, collection=self.alias, executor="reembed")
        self.jobs.annotate(self.job, {"target": self.target})

    def sent(self, batch_ids: list[str]) -> None:
        if self._status() is None:  # resumed after the record was lost (expired, or a broker without persistence)
            self.reset()
        for batch_id in batch_ids:
            self.jobs.record_submitted(self.job, batch_id, [])
        self.touch()

    def sealed(self, passages: int) -> None:
        """Every batch is sent (by this run and, when it resumed, earlier ones)."""
        self.jobs.seal(self.job, batches=self.counts()[1], documents=passages, skipped=[], failed=[])

    def supersede_pending(self) -> list[str]:
        """A resumed run re-sends every passage still missing from the target, so the batches an earlier run sent
        and never finished (a worker killed mid-batch, a redelivery not yet due) are covered by the new ones:
        close them, so neither the finalize step waits for them nor the job shows them pending. One of them that
        runs late anyway copies the same passages again (idempotent) and replaces its record."""
        status = self._status()
        stale = [str(b) for b in status["batches_pending"]] if status else []
        for batch_id in stale:
            self.jobs.record_batch(self.job, batch_id, {"passages": 0, "superseded": True})
        return stale

    def done(self, batch_id: str, passages: int = 0) -> None:
        self.jobs.record_batch(self.job, batch_id, {"passages": passages})
        self.touch()

    def failed(self, batch_id: str, error: str) -> None:
        """A batch that cannot succeed (a permanent error): no longer pending, so the finalize step stops waiting
        for it (its catch-up encodes what is missing, or fails naming the same error)."""
        self.jobs.record_batch(self.job, batch_id, {"passages": 0, "error": error})
        self.touch()

    def touch(self) -> None:
        """Record activity now (what ``idle_seconds`` measures from)."""
        self.jobs.annotate(self.job, {"last_activity": round(time.time(), 3)})

    def _status(self) -> dict[str, Any] | None:
        try:
            return self.jobs.status(self.job)
        except JobNotFound:
            return None

    def pending(self) -> int:
        """Batches sent and not done yet."""
        status = self._status()
        return len(status["batches_pending"]) if status else 0

    def counts(self) -> tuple[int, int]:
        """(batches done, batches sent)."""
        status = self._status()
        if status is None:
            return 0, 0
        return status["batches_done"], status["batches_done"] + len(status["batches_pending"])

    def idle_seconds(self) -> float:
        status = self._status()
        last = status.get("last_activity") if status else None
        return time.time() - float(last) if last else float("inf")

    def set_result(self, result: dict[str, Any]) -> None:
        self.jobs.annotate(self.job, {"result": result})

    def result(self) -> dict[str, Any] | None:
        status = self._status()
        return status.get("result") if status else None


def progress_for(settings: Settings, target: str, alias: str | None = None) -> ReembedProgress:
    """The progress record of the re-embed into ``target`` of ``alias`` (default ``settings.collection``)."""
    return ReembedProgress(JobStore.from_url(settings.broker_url or "", ttl=TTL), alias or settings.collection, target)
