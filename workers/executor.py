"""The Celery implementation of the executor seam (``services.jobs.executor.Executor``): one ``dpr.ingest_batch``
task per batch on the ``ingest`` queue; job state in Redis, written by the same ``services.jobs`` code the
in-process executor uses. Chosen by the entry points when ``DPR_BROKER_URL`` is set.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import kombu.exceptions
import redis
import redis.exceptions

from services.documents import Document, Item
from services.errors import ConfigError, TransientError
from services.ingest import new_job_id
from services.jobs import JobStore, Submitted, redact_url, submit_job, unavailable
from services.settings import Settings
from workers.app import INGEST_QUEUE, create_app

log = logging.getLogger(__name__)

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
        app = create_app(self.settings)
        c = self.settings.celery
        try:
            with app.producer_or_acquire() as producer:

                def send(number: int, docs: list[Document]) -> None:
                    app.send_task(
                        INGEST_TASK,
                        args=[submitted.job, number, [d.to_json() for d in docs]],
                        kwargs={"collection": collection},
                        queue=INGEST_QUEUE,
                        producer=producer,
                    )

                return submit_job(self.jobs, submitted, items, batch_documents=c.batch_documents,
                                  batch_bytes=c.batch_bytes, hand_over=send)
        except (kombu.exceptions.OperationalError, redis.exceptions.ConnectionError) as e:
            raise BrokerUnavailable(
                f"cannot send tasks to the broker at {redact_url(self.url)} ({e}); job {submitted.job} stopped "
                f"after {submitted.batches} batches: fix the broker and ingest again (unchanged documents cost "
                "nothing)"
            ) from e
        finally:
            app.close()

    def pending(self) -> int:
        return queue_depth(self.settings)

    def close(self) -> None:
        return None


def queue_depth(settings: Settings, queue: str = INGEST_QUEUE) -> int:
    """Messages waiting in ``queue`` (not counting the ones workers hold)."""
    url = broker_url(settings)
    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
    try:
        return int(client.llen(queue))
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
        raise unavailable(url, e) from e
    finally:
        client.close()
