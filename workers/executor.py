"""The Celery implementation of the executor seam (``services.ingest.executor.Executor``): one ``dpr.ingest_batch``
task per batch on the ``ingest`` queue; job state in Redis, written by the same ``services.jobs`` code the
in-process executor uses. Chosen by the entry points when ``DPR_BROKER_URL`` is set.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from typing import Any

import kombu.exceptions
import redis
import redis.exceptions

from services.core.errors import ConfigError, TransientError
from services.core.locks import redis_client
from services.core.settings import Settings
from services.ingest.batches import Submitted, job_batches
from services.ingest.pipeline import new_job_id
from services.jobs import JobStore, redact_url, unavailable, write_refused
from services.readers import Document, Item
from services.readers.filesig import FileRef
from workers.app import INGEST_QUEUE, create_app

INGEST_TASK = "dpr.ingest_batch"


class BrokerUnavailable(TransientError):
    """Tasks cannot be sent to the broker."""


def broker_url(settings: Settings) -> str:
    if not settings.broker_url:
        raise ConfigError("no broker configured; set DPR_BROKER_URL=redis://host:6379/0")
    return settings.broker_url


class CeleryExecutor:
    """Batches go to Celery workers; ``jobs`` is the job state they keep in Redis."""

    name = "broker"

    def __init__(self, settings: Settings, jobs: JobStore | None = None) -> None:
        self.settings = settings
        self.url = broker_url(settings)
        self.jobs = jobs or JobStore.from_url(self.url)

    def submit(self, items: Iterable[Item], *, collection: str) -> Submitted:
        """Register a job and send one task per batch of documents to the ``ingest`` queue."""
        self.jobs.ping()
        submitted = Submitted(job=new_job_id(), collection=collection, executor=self.name)
        self.jobs.create(submitted.job, collection=collection, executor=self.name)
        c = self.settings.celery
        batches = job_batches(self.jobs, submitted, items, batch_documents=c.batch_documents, batch_bytes=c.batch_bytes)
        self._send_all(submitted, batches, lambda: f"job {submitted.job} stopped after {submitted.batches} batches",
                       fix="fix the broker and ingest again (unchanged documents cost nothing)")
        return submitted

    def _send_all(self, submitted: Submitted, batches: Iterable[tuple[int, list[Document]]],
                  stopped: Callable[[], str], fix: str = "") -> None:
        """Send ``batches`` through one producer: ``BrokerUnavailable`` when the broker is unreachable (saying what
        ``stopped()`` and the ``fix``, when given), ``BrokerWriteRefused`` when it refuses writes (full disk, OOM)."""
        app = create_app(self.settings)
        try:
            with app.producer_or_acquire() as producer:
                for number, docs in batches:
                    _send(app, producer, submitted, number, docs, self.settings.celery.inline_file_bytes)
        except (kombu.exceptions.OperationalError, redis.exceptions.ConnectionError) as e:
            advice = f"; {stopped()}: {fix}" if fix else ""
            raise BrokerUnavailable(f"cannot send tasks to the broker at {redact_url(self.url)} ({e}){advice}") from e
        except redis.exceptions.ResponseError as e:  # the broker answers but refuses the write: name its disk
            with redis_client(self.url) as client:
                refused = write_refused(self.url, e, client, stopped())
            raise (refused or e) from e
        finally:
            app.close()

    def writable(self) -> None:
        """Raise ``BrokerWriteRefused`` when the broker refuses writes now (one tiny expiring key): a follower
        asks this while a job makes no progress, since workers can neither take nor record batches then."""
        with redis_client(self.url) as client:
            try:
                client.set(WRITE_PROBE_KEY, "1", ex=60)
            except redis.exceptions.ResponseError as e:
                refused = write_refused(self.url, e, client, "workers can neither take nor record batches meanwhile")
                if refused is None:
                    raise
                raise refused from e
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                return  # an outage, not a refusal: the follower rides it out through the job store

    def pending(self) -> int:
        return queue_depth(self.settings)

    def resend(self, submitted: Submitted, batches: dict[int, list[Document]]) -> None:
        """Send these batches again under their numbers (a worker records each outcome over the old one)."""
        self._send_all(submitted, sorted(batches.items()), lambda: f"re-sending batches of job {submitted.job} stopped")

    def in_flight(self, job_id: str) -> set[int] | None:
        """Batches of ``job_id`` with a message in the queue (any priority) or reserved by a worker (kombu's
        ``unacked`` hash: prefetched, running, or waiting for a retry). None when the broker cannot be read."""
        with redis_client(self.url) as client:
            try:
                raw = list(client.lrange(INGEST_QUEUE, 0, -1))
                for step in PRIORITY_STEPS:
                    raw.extend(client.lrange(f"{INGEST_QUEUE}{QUEUE_SEP}{step}", 0, -1))
                for value in client.hvals(UNACKED_KEY):
                    with contextlib.suppress(ValueError, TypeError, IndexError, KeyError):
                        raw.append(json.dumps(json.loads(value)[0]))
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                return None
        held: set[int] = set()
        for message in raw:
            try:
                headers = json.loads(message).get("headers") or {}
            except (ValueError, AttributeError):
                continue
            if headers.get("dpr_job") == job_id and isinstance(headers.get("dpr_batch"), int):
                held.add(headers["dpr_batch"])
        return held

    def close(self) -> None:
        return None


# kombu's Redis transport: priority queues are "<queue><sep><step>" for steps above 0; reserved messages sit in
# the "unacked" hash as [message, exchange, routing key] until acked or restored.
QUEUE_SEP = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)
UNACKED_KEY = "unacked"
WRITE_PROBE_KEY = "dpr:write-probe"


def _send(app: Any, producer: Any, submitted: Submitted, number: int, docs: list[Document],
          inline_limit: int = 0) -> None:
    """One batch task, tagged with its job and number so a follower can find it in the queue. A binary file
    (``FileRef``) goes unparsed: its bytes inline up to ``inline_limit``, else its path (the worker parses it)."""
    body = [d.with_bytes(inline_limit).to_json() if isinstance(d, FileRef) else d.to_json() for d in docs]
    app.send_task(
        INGEST_TASK,
        args=[submitted.job, number, body],
        kwargs={"collection": submitted.collection},
        queue=INGEST_QUEUE,
        producer=producer,
        headers={"dpr_job": submitted.job, "dpr_batch": number},
    )


def broker_refusal(settings: Settings) -> str | None:
    """The one line saying why the broker refuses writes now (a full disk makes Redis refuse even PING), or None.
    Reads only: `dpr status` asks it."""
    url = broker_url(settings)
    with redis_client(url) as client:
        try:
            client.ping()
        except redis.exceptions.ResponseError as e:
            refused = write_refused(url, e, client, "ingest is refused meanwhile")
            return str(refused) if refused is not None else None
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            return None  # unreachable: queue_depth says so
    return None


def queue_depth(settings: Settings, queue: str = INGEST_QUEUE) -> int:
    """Messages waiting in ``queue`` (not counting the ones workers hold)."""
    url = broker_url(settings)
    with redis_client(url) as client:
        try:
            return int(client.llen(queue))
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
            raise unavailable(url, e) from e
