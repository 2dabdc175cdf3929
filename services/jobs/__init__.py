"""Ingest jobs' state: one job model (``store``) and where it lives (``backends``: files under the data dir, or
Redis). Reading a job's state (``dpr status``, the API's job routes, a Runtime's ``jobs``) imports only this;
running, handing over and following jobs is ``services.ingest`` (above). Nothing here imports Celery.
"""

from services.jobs.backends import (
    BrokerDiskFull,
    BrokerWriteRefused,
    FileHashes,
    JobStoreUnavailable,
    RedisHashes,
    redact_url,
    unavailable,
    write_refused,
)
from services.jobs.store import TERMINAL, JobNotFound, JobStore, summarize

__all__ = [
    "BrokerDiskFull", "BrokerWriteRefused", "write_refused",
    "TERMINAL", "FileHashes", "JobNotFound", "JobStore", "JobStoreUnavailable", "RedisHashes", "redact_url",
    "summarize", "unavailable",
]
