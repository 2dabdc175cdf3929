"""Ingest job tracking in Redis (redis-py only: this module never imports Celery).

A job is one ``dpr ingest`` sent to the workers: N batches, each one Celery task. Keys (all expire after
``ttl`` seconds, refreshed on every write):

- ``dpr:job:<id>``           hash: created, collection, sealed, total batches, documents sent, parse-time
                             skipped / failed lists (JSON)
- ``dpr:job:<id>:batches``   hash: batch number -> that batch's result (JSON). Written with HSET, so a redelivered
                             or retried batch overwrites its own entry instead of counting twice.
- ``dpr:job:<id>:started``   hash: batch number -> last start (worker, attempt, time), JSON
- ``dpr:job:<id>:deliveries`` hash: batch number -> how many times a worker started it (poison-batch guard)

The submitter writes the job header first, sends batches as it reads documents, and *seals* the job with the
totals at the end, so a large corpus is never held in memory. ``summarize`` (pure) turns the three hashes into
the status users see.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.exceptions

from services.errors import PermanentError, TransientError

log = logging.getLogger(__name__)

JobState = Literal["submitting", "queued", "running", "done", "failed"]

DEFAULT_TTL = 7 * 24 * 3600
KEY_PREFIX = "dpr:job:"

# Keys of IngestReport.to_json() summed / concatenated over batches.
COUNTERS = ("documents", "unchanged", "chunks", "title_truncated")


class JobStoreUnavailable(TransientError):
    """Redis (the broker, which also holds job state) cannot be reached."""


class JobNotFound(PermanentError):
    """No job of that id (never submitted, or expired)."""


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def unavailable(url: str, error: Exception) -> JobStoreUnavailable:
    return JobStoreUnavailable(
        f"cannot reach Redis at {redact_url(url)} ({error}); start Redis (e.g. `redis-server --port 6379`) "
        "or fix DPR_BROKER_URL"
    )


def _decode(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _loads(value: Any, default: Any) -> Any:
    if value is None:
        return default
    try:
        return json.loads(_decode(value))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return default


class JobStore:
    """Job state in Redis. Hand it a redis-py client (tests and callers choose how to connect)."""

    def __init__(self, client: Any, url: str = "redis://", ttl: int = DEFAULT_TTL) -> None:
        self.client = client
        self.url = url
        self.ttl = ttl

    @classmethod
    def from_url(cls, url: str, ttl: int = DEFAULT_TTL) -> JobStore:
        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=30, health_check_interval=30)
        return cls(client, url=url, ttl=ttl)

    # --- keys ----------------------------------------------------------------------------------------------
    @staticmethod
    def key(job_id: str, part: str = "") -> str:
        return f"{KEY_PREFIX}{job_id}" + (f":{part}" if part else "")

    def _keys(self, job_id: str) -> list[str]:
        return [self.key(job_id), self.key(job_id, "batches"), self.key(job_id, "started"),
                self.key(job_id, "deliveries")]

    def _run(self, fn: Any) -> Any:
        try:
            return fn()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
            raise unavailable(self.url, e) from e

    def ping(self) -> None:
        self._run(self.client.ping)

    # --- writes ---------------------------------------------------------------------------------------------
    def create(self, job_id: str, *, collection: str = "", created: float | None = None) -> None:
        """Register a job before its first batch is sent (state ``submitting`` until ``seal``)."""
        fields = {"job": job_id, "collection": collection, "created": repr(created or time.time()), "sealed": "0"}

        def write() -> None:
            pipe = self.client.pipeline()
            pipe.hset(self.key(job_id), mapping=fields)
            pipe.expire(self.key(job_id), self.ttl)
            pipe.execute()

        self._run(write)
        log.info("job created", extra={"job": job_id, "collection": collection})

    def seal(
        self,
        job_id: str,
        *,
        batches: int,
        documents: int,
        skipped: list[dict[str, str]],
        failed: list[dict[str, str]],
    ) -> None:
        """Every batch is sent: record the totals and the documents refused while reading."""
        fields = {
            "sealed": "1",
            "batches": str(batches),
            "documents_total": str(documents),
            "skipped": json.dumps(skipped),
            "failed": json.dumps(failed),
            "sealed_at": repr(time.time()),
        }

        def write() -> None:
            pipe = self.client.pipeline()
            pipe.hset(self.key(job_id), mapping=fields)
            for key in self._keys(job_id):
                pipe.expire(key, self.ttl)
            pipe.execute()

        self._run(write)
        log.info("job sealed", extra={"job": job_id, "batches": batches, "documents": documents})

    def mark_started(self, job_id: str, batch: int, *, worker: str = "", attempt: int = 0) -> int:
        """A worker starts (or restarts) a batch. Returns how many times this batch has been started."""
        record = json.dumps({"worker": worker, "attempt": attempt, "at": time.time()})

        def write() -> int:
            pipe = self.client.pipeline()
            pipe.hset(self.key(job_id, "started"), str(batch), record)
            pipe.hincrby(self.key(job_id, "deliveries"), str(batch), 1)
            pipe.expire(self.key(job_id, "started"), self.ttl)
            pipe.expire(self.key(job_id, "deliveries"), self.ttl)
            return int(pipe.execute()[1])

        return int(self._run(write))

    def record_batch(self, job_id: str, batch: int, result: Mapping[str, Any]) -> None:
        """Store one batch's result (``IngestReport.to_json()`` plus optional ``error``). Idempotent: HSET by
        batch number, so a redelivered batch replaces its previous result."""
        record = dict(result)
        record.setdefault("finished", time.time())
        payload = json.dumps(record, default=str)

        def write() -> None:
            pipe = self.client.pipeline()
            pipe.hset(self.key(job_id, "batches"), str(batch), payload)
            pipe.expire(self.key(job_id, "batches"), self.ttl)
            pipe.execute()

        self._run(write)

    # --- reads ----------------------------------------------------------------------------------------------
    def raw(self, job_id: str) -> tuple[dict[str, str], dict[int, dict[str, Any]], dict[int, dict[str, Any]]]:
        def read() -> list[Any]:
            pipe = self.client.pipeline()
            pipe.hgetall(self.key(job_id))
            pipe.hgetall(self.key(job_id, "batches"))
            pipe.hgetall(self.key(job_id, "started"))
            return list(pipe.execute())

        meta_raw, batches_raw, started_raw = self._run(read)
        meta = {_decode(k): _decode(v) for k, v in (meta_raw or {}).items()}
        batches = {int(_decode(k)): _loads(v, {}) for k, v in (batches_raw or {}).items()}
        started = {int(_decode(k)): _loads(v, {}) for k, v in (started_raw or {}).items()}
        return meta, batches, started

    def started(self, job_id: str) -> dict[int, dict[str, Any]]:
        return self.raw(job_id)[2]

    def status(self, job_id: str, now: float | None = None) -> dict[str, Any]:
        meta, batches, started = self.raw(job_id)
        if not meta:
            raise JobNotFound(
                f"no job {job_id!r} in Redis at {redact_url(self.url)}; check the id (jobs expire after "
                f"{self.ttl // 86400} days)"
            )
        return summarize(meta, batches, started, now=now)


def summarize(
    meta: Mapping[str, str],
    batches: Mapping[int, Mapping[str, Any]],
    started: Mapping[int, Mapping[str, Any]],
    now: float | None = None,
) -> dict[str, Any]:
    """The job's status: the keys of ``IngestReport.to_json()`` plus state and progress. Pure."""
    sealed = meta.get("sealed") == "1"
    total = int(meta.get("batches", "0") or 0) if sealed else None
    created = float(meta.get("created", "0") or 0)
    skipped: list[dict[str, str]] = list(_loads(meta.get("skipped"), []))
    failed: list[dict[str, str]] = list(_loads(meta.get("failed"), []))
    counts = dict.fromkeys(COUNTERS, 0)
    errors: list[dict[str, Any]] = []
    finished = created
    for number in sorted(batches):
        result = batches[number]
        for name in COUNTERS:
            counts[name] += int(result.get(name, 0) or 0)
        skipped.extend(result.get("skipped") or [])
        failed.extend(result.get("failed") or [])
        if result.get("error"):
            errors.append({"batch": number, "error": result["error"]})
        finished = max(finished, float(result.get("finished", 0) or 0))

    done = len(batches)
    if not sealed:
        state: JobState = "submitting"
    elif done >= (total or 0):
        state = "failed" if errors else "done"
    elif started or batches:
        state = "running"
    else:
        state = "queued"
    end = finished if state in ("done", "failed") else (now if now is not None else time.time())
    return {
        "job": meta.get("job", ""),
        "state": state,
        "collection": meta.get("collection", ""),
        "batches_done": done,
        "batches_total": total,
        "documents_total": int(meta.get("documents_total", "0") or 0) if sealed else None,
        **counts,
        "skipped": skipped,
        "failed": failed,
        "errors": errors,
        "seconds": round(max(0.0, end - created), 3),
    }
