"""Job state: one model for every ingest job, in-process or on Celery workers.

A job is one ingest: N batches of documents. The submitter records each batch as it hands it over (with the ids
of its documents, so a job can always tell what is still missing) and *seals* the job with its totals at the end;
whoever runs a batch (this process or a Celery worker) marks it started and records its outcome. Four hashes per
job, all expiring ``ttl`` seconds after the last write:

- ``dpr:job:<id>``            created, collection, executor, sealed, total batches, documents sent, refusals at
                              read time (skipped / failed lists, JSON)
- ``dpr:job:<id>:submitted``  batch number -> {"documents": [doc ids]}
- ``dpr:job:<id>:batches``    batch number -> that batch's outcome (``IngestReport.to_json()`` plus ``error``);
                              written per batch number, so a redelivered or retried batch replaces its own entry
                              instead of counting twice
- ``dpr:job:<id>:started``    batch number -> last start (worker, attempt, time)
- ``dpr:job:<id>:deliveries`` batch number -> how many times a batch was started (poison-batch guard)
- ``dpr:job:<id>:parsing``    batch number -> the document its runner is parsing ("" between documents);
                               ``<batch>-<sha256(doc id)>`` -> deliveries that died while parsing it

The hashes live behind ``HashBackend``: Redis (``services.jobs.backends.RedisHashes``, when a broker is
configured) or files under the data dir (``FileHashes``, the in-process default), so ``dpr jobs`` shows either.
``summarize`` (pure) turns the hashes into the status users see.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from services.core.errors import PermanentError
from services.jobs.backends import HashBackend, RedisHashes, redact_url

log = logging.getLogger(__name__)

JobState = Literal["submitting", "queued", "running", "done", "failed"]
TERMINAL: tuple[JobState, ...] = ("done", "failed")

DEFAULT_TTL = 7 * 24 * 3600
KEY_PREFIX = "dpr:job:"
PARTS = ("", "submitted", "batches", "started", "deliveries", "parsing")

BatchKey = int | str  # ingest batches are numbered; re-embed batches have string ids

KEEP_RECORDS = 1000  # failure and skip records kept in full per job; the rest are counted (``*_total``)

# Keys of IngestReport.to_json() summed / concatenated over batches.
COUNTERS = ("documents", "unchanged", "chunks", "title_truncated", "parsed")
# where a job's time went, summed over its batches (parsing overlaps the tower: the sum can exceed the wall time)
STEP_SECONDS = ("encode_seconds", "upsert_seconds", "chunk_seconds", "sparse_seconds", "parse_seconds")


class JobNotFound(PermanentError):
    """No job of that id (never submitted, or expired)."""


def _loads(value: Any, default: Any) -> Any:
    if value is None:
        return default
    try:
        return json.loads(value)
    except (json.JSONDecodeError, TypeError):
        return default


class JobStore:
    """Job state over a ``HashBackend`` (Redis or files; tests hand in a fake)."""

    def __init__(self, backend: HashBackend, ttl: int = DEFAULT_TTL) -> None:
        self.backend = backend
        self.ttl = ttl

    @classmethod
    def from_url(cls, url: str, ttl: int = DEFAULT_TTL) -> JobStore:
        return cls(RedisHashes.from_url(url), ttl=ttl)

    @property
    def where(self) -> str:
        return self.backend.describe()

    @staticmethod
    def key(job_id: str, part: str = "") -> str:
        return f"{KEY_PREFIX}{job_id}" + (f":{part}" if part else "")

    def keys(self, job_id: str) -> list[str]:
        return [self.key(job_id, part) for part in PARTS]

    def ping(self) -> None:
        self.backend.ping()

    # --- writes ---------------------------------------------------------------------------------------------
    def create(self, job_id: str, *, collection: str = "", executor: str = "", created: float | None = None) -> None:
        """Register a job before its first batch is handed over (state ``submitting`` until ``seal``)."""
        fields = {"job": job_id, "collection": collection, "executor": executor,
                  "created": repr(created or time.time()), "sealed": "0"}
        self.backend.hset(self.key(job_id), fields, self.ttl)
        log.info("job created", extra={"job": job_id, "collection": collection})

    def annotate(self, job_id: str, fields: Mapping[str, Any]) -> None:
        """Extra header fields (JSON values), shown in the status under their names (e.g. a re-embed's result)."""
        self.backend.hset(self.key(job_id), {f"x_{k}": json.dumps(v, default=str) for k, v in fields.items()},
                          self.ttl)

    def delete(self, job_id: str) -> None:
        self.backend.delete(self.keys(job_id))

    def record_submitted(self, job_id: str, batch: BatchKey, doc_ids: Sequence[str]) -> None:
        """A batch is handed to whoever runs it; its document ids are kept so a lost batch can be named."""
        self.backend.hset(self.key(job_id, "submitted"), {str(batch): json.dumps({"documents": list(doc_ids)})},
                          self.ttl)

    def seal(
        self,
        job_id: str,
        *,
        batches: int,
        documents: int,
        skipped: list[dict[str, str]],
        failed: list[dict[str, str]],
        skipped_total: int | None = None,
        failed_total: int | None = None,
    ) -> None:
        """Every batch is handed over: record the totals and the documents refused while reading (at most
        ``KEEP_RECORDS`` of each in full; ``*_total`` counts them all)."""
        fields = {  # "sealed" last: it commits the others (a file backend makes fields visible in this order)
            "batches": str(batches),
            "documents_total": str(documents),
            "skipped": json.dumps(skipped[:KEEP_RECORDS]),
            "failed": json.dumps(failed[:KEEP_RECORDS]),
            "skipped_total": str(len(skipped) if skipped_total is None else skipped_total),
            "failed_total": str(len(failed) if failed_total is None else failed_total),
            "sealed_at": repr(time.time()),
            "sealed": "1",
        }
        self.backend.hset(self.key(job_id), fields, self.ttl)
        self.backend.touch(self.keys(job_id), self.ttl)
        log.info("job sealed", extra={"job": job_id, "batches": batches, "documents": documents})

    def mark_started(self, job_id: str, batch: BatchKey, *, worker: str = "", attempt: int = 0) -> int:
        """A batch starts (or restarts). Returns how many times this batch has been started."""
        record = json.dumps({"worker": worker, "attempt": attempt, "at": time.time()})
        self.backend.hset(self.key(job_id, "started"), {str(batch): record}, self.ttl)
        return self.backend.hincrby(self.key(job_id, "deliveries"), str(batch), self.ttl)

    def mark_parsing(self, job_id: str, batch: BatchKey, doc_id: str) -> None:
        """The batch's runner starts parsing ``doc_id`` ("" once it is parsed): a delivery that finds a doc id
        here was preceded by one that died while parsing it (``services.ingest.files.ParseGuard``)."""
        self.backend.hset(self.key(job_id, "parsing"), {str(batch): doc_id}, self.ttl)

    def parse_died(self, job_id: str, batch: BatchKey, doc_id: str) -> int:
        """A delivery of the batch died while parsing ``doc_id``: count it (returns the count) and clear the mark,
        so a delivery that dies before parsing anything is not counted against the same document."""
        name = hashlib.sha256(doc_id.encode("utf-8", "surrogatepass")).hexdigest()[:24]  # a file name, too
        deaths = self.backend.hincrby(self.key(job_id, "parsing"), f"{batch}-{name}", self.ttl)
        self.mark_parsing(job_id, batch, "")
        return deaths

    def parsing(self, job_id: str, batch: BatchKey) -> str:
        """The document a delivery of this batch was parsing when it last stopped ("" if none)."""
        return str(self.raw(job_id)["parsing"].get(str(batch), ""))

    def record_batch(self, job_id: str, batch: BatchKey, result: Mapping[str, Any]) -> None:
        """Store one batch's outcome (``IngestReport.to_json()`` plus optional ``error``). Idempotent: keyed by
        batch number, so a redelivered batch replaces its previous outcome."""
        record = dict(result)
        record.setdefault("finished", time.time())
        self.backend.hset(self.key(job_id, "batches"), {str(batch): json.dumps(record, default=str)}, self.ttl)

    # --- reads ----------------------------------------------------------------------------------------------
    def raw(self, job_id: str) -> dict[str, dict[str, str]]:
        return dict(zip(PARTS, self.backend.hgetall_many(self.keys(job_id)), strict=True))

    def started(self, job_id: str) -> dict[BatchKey, dict[str, Any]]:
        return _batches(self.raw(job_id)["started"])

    def submitted(self, job_id: str) -> dict[BatchKey, list[str]]:
        """Batch -> the ids of the documents handed over in it."""
        return {k: list(v.get("documents", [])) for k, v in _batches(self.raw(job_id)["submitted"]).items()}

    def status(self, job_id: str, now: float | None = None) -> dict[str, Any]:
        raw = self.raw(job_id)
        if not raw[""]:
            raise JobNotFound(
                f"no job {job_id!r} in {self.where}: check the id; jobs expire after {self.ttl // 86400} days, and a "
                "broker restarted without persistence loses its jobs (ingest again: unchanged documents cost nothing)"
            )
        return summarize(
            raw[""], _batches(raw["batches"]), _batches(raw["started"]), now=now,
            submitted=_batches(raw["submitted"]),
        )


def _batches(raw: Mapping[str, str]) -> dict[BatchKey, dict[str, Any]]:
    return {(int(k) if k.isdigit() else k): _loads(v, {}) for k, v in raw.items()}


def _order(key: BatchKey) -> tuple[int, int, str]:
    return (0, key, "") if isinstance(key, int) else (1, 0, key)


def summarize(
    meta: Mapping[str, str],
    batches: Mapping[BatchKey, Mapping[str, Any]],
    started: Mapping[BatchKey, Mapping[str, Any]],
    now: float | None = None,
    submitted: Mapping[BatchKey, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The job's status: the keys of ``IngestReport.to_json()`` plus state and progress. Pure."""
    sealed = meta.get("sealed") == "1"
    total = int(meta.get("batches", "0") or 0) if sealed else None
    created = float(meta.get("created", "0") or 0)
    skipped: list[dict[str, str]] = list(_loads(meta.get("skipped"), []))
    failed: list[dict[str, str]] = list(_loads(meta.get("failed"), []))
    totals = {"skipped": int(meta.get("skipped_total") or len(skipped)),
              "failed": int(meta.get("failed_total") or len(failed))}
    counts = dict.fromkeys(COUNTERS, 0)
    seconds = dict.fromkeys(STEP_SECONDS, 0.0)  # summed over the batches
    parsed_by: list[str] = []  # the processes that parsed this job's binary files (host:pid)
    errors: list[dict[str, Any]] = []
    finished = created
    for number in sorted(batches, key=_order):
        result = batches[number]
        for name in COUNTERS:
            counts[name] += int(result.get(name, 0) or 0)
        for name in STEP_SECONDS:
            seconds[name] += float(result.get(name, 0) or 0)
        if result.get("parsed_by") and result["parsed_by"] not in parsed_by:
            parsed_by.append(str(result["parsed_by"]))
        for name, kept in (("skipped", skipped), ("failed", failed)):
            records = result.get(name) or []
            totals[name] += len(records)
            kept.extend(records[: max(0, KEEP_RECORDS - len(kept))])
        if result.get("error"):
            errors.append({"batch": number, "error": result["error"]})
        finished = max(finished, float(result.get("finished", 0) or 0))

    done = len(batches)
    state = _state(sealed, done, total, bool(errors), bool(started or batches))
    end = finished if state in TERMINAL else (now if now is not None else time.time())
    pending = sorted(set(submitted or {}) - set(batches), key=_order)
    out: dict[str, Any] = {
        "job": meta.get("job", ""),
        "state": state,
        "collection": meta.get("collection", ""),
        "batches_done": done,
        "batches_total": total,
        "documents_total": int(meta.get("documents_total", "0") or 0) if sealed else None,
        **counts,
        "skipped": skipped,
        "failed": failed,
        "skipped_total": totals["skipped"],
        "failed_total": totals["failed"],
        "errors": errors,
        "seconds": round(max(0.0, end - created), 3),
        **{name: round(value, 3) for name, value in seconds.items()},
        "batches_pending": pending,
    }
    if parsed_by:
        out["parsed_by"] = parsed_by
    if meta.get("executor"):
        out["executor"] = meta["executor"]
    for name, value in meta.items():
        if name.startswith("x_"):
            out[name[2:]] = _loads(value, value)
    return out


def _state(sealed: bool, done: int, total: int | None, errors: bool, begun: bool) -> JobState:
    if not sealed:
        return "running" if begun else "submitting"
    if done >= (total or 0):
        return "failed" if errors else "done"
    return "running" if begun else "queued"


__all__ = ["COUNTERS", "DEFAULT_TTL", "JobNotFound", "JobState", "JobStore", "TERMINAL", "redact_url", "summarize"]
