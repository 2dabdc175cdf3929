"""Ingest jobs: one job model (``store``), where its state lives (``backends``), how batches are handed over and
run (``runner``), and the executor seam with its in-process implementation (``executor``). The Celery executor
is ``workers.executor.CeleryExecutor``; nothing here imports Celery."""

from services.jobs.backends import FileHashes, HashBackend, JobStoreUnavailable, RedisHashes, redact_url, unavailable
from services.jobs.executor import Executor, LocalExecutor
from services.jobs.follow import JobWaitTimeout, follow_job
from services.jobs.runner import Submitted, batch_failure, run_batch, submit_job
from services.jobs.store import COUNTERS, DEFAULT_TTL, TERMINAL, JobNotFound, JobState, JobStore, summarize

__all__ = [
    "COUNTERS", "DEFAULT_TTL", "TERMINAL", "Executor", "FileHashes", "HashBackend", "JobNotFound", "JobState",
    "JobStore", "JobStoreUnavailable", "JobWaitTimeout", "LocalExecutor", "RedisHashes", "Submitted",
    "batch_failure", "redact_url", "run_batch", "submit_job", "summarize", "unavailable", "follow_job",
]
