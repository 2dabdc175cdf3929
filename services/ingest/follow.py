"""Following a job to its end without ever calling it done over a hole.

``follow_job`` polls the job store and rides out an outage of the store (the broker's Redis) with backoff. A
batch that was handed over but can no longer arrive is detected through the executor: it is pending (no
outcome), nobody is running it, and the executor holds no message for it (``in_flight``), twice in a row. Such
batches are re-sent when the caller can read the input again (``source``: the submitting ``dpr ingest``); else
their documents are recorded failed with reason ``lost`` and their ids, so the job ends failed, naming them.
A broker that refuses writes (its disk is full, it is out of memory) stops the follower at once with
``BrokerWriteRefused``: no worker can take or record a batch until it is fixed. A job whose whole record
vanished (a broker restarted without persistence) is re-created from what the submitter still knows
(``Submitted.batch_ids``) and every batch is re-sent: documents that did arrive are unchanged and cost nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from services.core.errors import TransientError
from services.ingest.batches import Submitted
from services.ingest.executor import Executor
from services.jobs.backends import JobStoreUnavailable
from services.jobs.store import TERMINAL, BatchKey, JobNotFound, JobStore
from services.readers import Document, Item

log = logging.getLogger(__name__)

StatusHook = Callable[[dict[str, Any]], None]
Source = Callable[[], Iterable[Item]]


WRITE_PROBE_EVERY = 5.0  # seconds without a batch done before the follower asks whether the broker takes writes


class JobWaitTimeout(TransientError):
    """The job did not end within the time the caller was willing to wait."""


def follow_job(
    executor: Executor,
    job_id: str,
    *,
    submitted: Submitted | None = None,
    source: Source | None = None,
    on_status: StatusHook | None = None,
    poll: float = 0.5,
    timeout: float | None = None,
    outage: float = 120.0,
    settle: float = 3.0,
    probe_every: float = WRITE_PROBE_EVERY,
) -> dict[str, Any]:
    """Poll until the job is done or failed; re-send or fail batches that can no longer arrive. ``outage``: how
    long the job store may stay unreachable before giving up (``JobStoreUnavailable``). ``probe_every``: seconds
    without a batch done before asking the executor whether the broker still takes writes."""
    jobs = executor.jobs
    deadline = None if timeout is None else time.monotonic() + timeout
    down_since: float | None = None
    suspects: dict[int, float] = {}  # pending batch -> when it was first seen with no message and not running
    writable = getattr(executor, "writable", None)  # the Celery executor: raises BrokerWriteRefused (a full disk)
    moved, last_done = time.monotonic(), -1
    while True:
        try:
            status = jobs.status(job_id)
            down_since = None
        except JobStoreUnavailable:
            down_since = down_since or time.monotonic()
            if time.monotonic() - down_since > outage:
                raise
            log.warning("job store unavailable; waiting", extra={"job": job_id})
            time.sleep(min(5.0, poll * 4))
            continue
        except JobNotFound:
            if submitted is None or submitted.job != job_id:
                raise
            log.warning("the job's record vanished (broker restarted without persistence?); re-creating it",
                        extra={"job": job_id})
            _recreate(jobs, submitted)
            _resend_or_fail(executor, submitted, source, set(submitted.batch_ids))
            continue
        if on_status is not None:
            on_status(status)
        if status["state"] in TERMINAL:
            return status
        if status.get("batches_done") != last_done:
            moved, last_done = time.monotonic(), status.get("batches_done", 0)
        elif writable is not None and time.monotonic() - moved >= probe_every:
            moved = time.monotonic()
            writable()  # a broker that refuses writes stops the follower with one line naming its disk and the fix
        lost = _lost(executor, job_id, status, suspects, settle)
        if lost:
            log.warning("batches can no longer arrive", extra={"job": job_id, "batches": sorted(lost)})
            _resend_or_fail(executor, submitted, source, lost, job_id=job_id)
            suspects.clear()
        if deadline is not None and time.monotonic() > deadline:
            raise JobWaitTimeout(
                f"job {job_id} is still {status['state']} ({status['batches_done']}/{status['batches_total']} "
                "batches); is a worker running? start one with `dpr worker`"
            )
        time.sleep(poll)


def _lost(executor: Executor, job_id: str, status: dict[str, Any], suspects: dict[int, float],
          settle: float) -> set[int]:
    """Pending batches with no message anywhere and no recent start, seen so for ``settle`` seconds."""
    pending = {b for b in status.get("batches_pending", []) if isinstance(b, int)}
    if not pending or status["state"] == "submitting":
        return set()
    held = executor.in_flight(job_id)
    if held is None:
        return set()
    unheld = pending - held
    if not unheld and not suspects:
        return set()  # the common case: every pending batch has its message; no second read of the job
    started = executor.jobs.started(job_id) if unheld else {}
    now = time.monotonic()
    quiet = {b for b in unheld if time.time() - float(started.get(b, {}).get("at", 0)) > settle}
    for b in list(suspects):
        if b not in quiet:
            del suspects[b]
    for b in quiet:
        suspects.setdefault(b, now)
    return {b for b, since in suspects.items() if now - since >= settle}


def _recreate(jobs: JobStore, submitted: Submitted) -> None:
    jobs.create(submitted.job, collection=submitted.collection, executor=submitted.executor)
    for number, ids in submitted.batch_ids.items():
        jobs.record_submitted(submitted.job, number, ids)
    jobs.seal(submitted.job, batches=submitted.batches, documents=submitted.documents,
              skipped=submitted.skipped, failed=submitted.failed)


def _resend_or_fail(executor: Executor, submitted: Submitted | None, source: Source | None,
                    batches: set[int], *, job_id: str | None = None) -> None:
    jobs = executor.jobs
    job_id = job_id or (submitted.job if submitted else "")
    ids = _batch_ids(jobs, job_id, submitted, batches)
    if source is not None and submitted is not None:
        wanted = {doc_id: number for number, doc_ids in ids.items() for doc_id in doc_ids}
        found: dict[int, list[Document]] = {number: [] for number in ids}
        for item in source():
            if isinstance(item, Document) and item.doc_id in wanted:
                found[wanted.pop(item.doc_id)].append(item)
        executor.resend(submitted, found)
        for doc_id, number in wanted.items():  # gone from the input since: say so
            _fail_batch(jobs, job_id, number, [doc_id], "the document is no longer in the input; ingest again")
        log.warning("re-sent batches", extra={"job": job_id, "batches": sorted(found)})
        return
    for number, doc_ids in ids.items():
        _fail_batch(jobs, job_id, number, doc_ids,
                    "the broker lost this batch (restarted without persistence?); ingest the input again "
                    "(unchanged documents cost nothing)")


def _batch_ids(jobs: JobStore, job_id: str, submitted: Submitted | None, batches: set[int]) -> dict[int, list[str]]:
    recorded = jobs.submitted(job_id)
    out: dict[int, list[str]] = {}
    for number in batches:
        ids = recorded.get(number)
        if ids is None and submitted is not None:
            ids = submitted.batch_ids.get(number, [])
        out[number] = list(ids or [])
    return out


def _fail_batch(jobs: JobStore, job_id: str, number: BatchKey, doc_ids: list[str], why: str) -> None:
    failed = [{"source": d, "reason": "lost", "error": f"{d}: {why}"} for d in doc_ids]
    jobs.record_batch(job_id, number, {"job": job_id, "documents": 0, "unchanged": 0, "chunks": 0,
                                       "title_truncated": 0, "skipped": [], "failed": failed,
                                       "error": f"lost: {why}"})
