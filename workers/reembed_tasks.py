"""Re-embed tasks (queue ``reembed``): primitives in, one ``services.lifecycle`` call. Run workers with
``dpr worker -Q ingest,reembed`` (or a dedicated ``-Q reembed`` pool).

- ``dpr.reembed.batch(target, batch_id, passages)``: encode with the target's passage tower, upsert into the
  target. Idempotent (point ids); skipped when the re-embed is no longer building.
- ``dpr.reembed.finalize(target, gate=None)``: waits (re-scheduling itself) while batches are in flight and
  still moving, then catch-up + gate + verify + swap under the write fence; releases the re-embed lock.
  Waiting ends early when no batch finished for ``visibility_timeout + 60`` s (a lost batch is then encoded
  by the catch-up itself); a batch that failed for good (a permanent error) counts as finished. A finalize
  step that cannot load the new towers records a failed outcome (``dpr reembed --wait`` returns).
- ``dpr.reembed.check()``: the beat's job: if the configured model differs from the collection's fingerprint,
  no re-embed runs, and the gate did not reject that model before, submit one.
"""

from __future__ import annotations

from typing import Any

from celery import Task, shared_task

from services.core.errors import TransientError
from services.core.settings import Settings
from services.lifecycle import check_and_submit, copy_sent_batch, finalize_sent
from workers.reembed_dispatch import BATCH_TASK, CHECK_TASK, FINALIZE_TASK, celery_sender
from workers.tasks import backoff_seconds, worker_runtime

__all__ = ["BATCH_TASK", "CHECK_TASK", "FINALIZE_TASK"]

FINALIZE_POLL = 2.0


@shared_task(name=BATCH_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def reembed_batch_task(
    self: Task, target: str, batch_id: str, passages: list[dict[str, Any]], collection: str | None = None
) -> dict[str, Any]:
    settings: Settings = self.app.settings  # type: ignore[attr-defined]
    runtime = worker_runtime(settings)
    try:
        return copy_sent_batch(settings, runtime, runtime.for_collection(collection).store,
                               collection or settings.collection, target, batch_id, passages)
    except TransientError as e:
        raise self.retry(exc=e, countdown=backoff_seconds(int(self.request.retries or 0)),
                         max_retries=settings.celery.max_retries) from e


# max_retries=None on the task itself: Celery's retry(max_retries=None) means "the task's default" (3), and the
# finalize task polls (retries) until the batches are done, however long that takes under load.
@shared_task(
    name=FINALIZE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True, max_retries=None
)
def reembed_finalize_task(
    self: Task, target: str, collection: str | None = None, gate: str | None = None
) -> dict[str, Any]:
    settings: Settings = self.app.settings  # type: ignore[attr-defined]
    runtime = worker_runtime(settings)
    target_runtime = runtime.for_collection(collection)
    try:
        out = finalize_sent(
            settings, runtime, target_runtime.store, target_runtime.fence,
            collection or settings.collection, target, gate, stall=settings.celery.visibility_timeout + 60,
        )
    except TransientError as e:
        raise self.retry(exc=e, countdown=backoff_seconds(int(self.request.retries or 0)), max_retries=None) from e
    if out is None:  # batches still in flight and moving: ask again shortly
        raise self.retry(countdown=FINALIZE_POLL, max_retries=None)
    return out


@shared_task(name=CHECK_TASK, bind=True, acks_late=True, ignore_result=True)
def reembed_check_task(self: Task, collection: str | None = None) -> dict[str, Any]:
    settings: Settings = self.app.settings  # type: ignore[attr-defined]
    if collection and collection != settings.collection:
        settings = settings.for_collection(collection)
    return check_and_submit(settings, celery_sender)
