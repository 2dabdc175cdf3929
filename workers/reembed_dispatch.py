"""Send a re-embed's steps to the workers: the Celery ``Sender`` for ``services.lifecycle.submit_reembed``.

The domain (lock, plan, which passages, progress) is in ``services.lifecycle.distributed``; this module only
names the tasks and the queue and sends them. Used by `dpr reembed` with a broker and by the beat check.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from services import lifecycle
from services.core.settings import Settings

REEMBED_QUEUE = "reembed"
BATCH_TASK = "dpr.reembed.batch"
FINALIZE_TASK = "dpr.reembed.finalize"
CHECK_TASK = "dpr.reembed.check"


class CelerySender:
    """Sends the batch and finalize tasks of one re-embed of ``collection`` through one producer."""

    def __init__(self, app: Any, producer: Any, collection: str) -> None:
        self.app = app
        self.producer = producer
        self.collection = collection

    def send_batch(self, target: str, batch_id: str, passages: list[dict[str, Any]]) -> None:
        self._send(BATCH_TASK, [target, batch_id, passages], {"collection": self.collection})

    def send_finalize(self, target: str, gate: str | None) -> None:
        self._send(FINALIZE_TASK, [target], {"collection": self.collection, "gate": gate})

    def _send(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        self.app.send_task(name, args=args, kwargs=kwargs, queue=REEMBED_QUEUE, producer=self.producer)


@contextmanager
def celery_sender(settings: Settings) -> Iterator[CelerySender]:
    from workers.app import create_app

    with create_app(settings) as app, app.producer_or_acquire() as producer:
        yield CelerySender(app, producer, settings.collection)


def submit_reembed(
    settings: Settings, *, model: str | None = None, gate: str | None = None, adopt: bool = True
) -> lifecycle.Submitted:
    """``services.lifecycle.submit_reembed`` over Celery. Raises ``ReembedBusy`` if another re-embed runs."""
    return lifecycle.submit_reembed(settings, celery_sender, model=model, gate=gate, adopt=adopt)
