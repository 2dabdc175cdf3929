"""Ingest jobs: one job model (``store``), where its state lives (``backends``), how batches are handed over and
run (``runner``), how a caller follows a job (``follow``), and the executor seam with its in-process
implementation (``executor``). The Celery executor is ``workers.executor.CeleryExecutor``; nothing here imports
Celery.

The package itself exports the job model and its state only: reading a job's state (``dpr status``, the API's
job routes, a Runtime's ``jobs``) must not import the ingest pipeline. Running or following jobs imports
``services.jobs.executor`` / ``runner`` / ``follow``.
"""

from services.jobs.backends import (
    BrokerDiskFull,
    BrokerWriteRefused,
    FileHashes,
    HashBackend,
    JobStoreUnavailable,
    RedisHashes,
    redact_url,
    unavailable,
    write_refused,
)
from services.jobs.store import COUNTERS, DEFAULT_TTL, TERMINAL, JobNotFound, JobState, JobStore, summarize

__all__ = [
    "BrokerDiskFull", "BrokerWriteRefused", "write_refused",
    "COUNTERS", "DEFAULT_TTL", "TERMINAL", "FileHashes", "HashBackend", "JobNotFound", "JobState", "JobStore",
    "JobStoreUnavailable", "RedisHashes", "redact_url", "summarize", "unavailable",
]
