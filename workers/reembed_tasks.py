"""Re-embed tasks (queue ``reembed``): thin wrappers over ``services.reembed``. Run workers with
``dpr worker -Q ingest,reembed`` (or a dedicated ``-Q reembed`` pool).

- ``dpr.reembed.batch(target, batch_id, passages)``: encode with the target's passage tower, upsert into the
  target. Idempotent (point ids); skipped when the re-embed is no longer building.
- ``dpr.reembed.finalize(target, gate=None)``: waits (re-scheduling itself) while batches are in flight and
  still moving, then catch-up + gate + verify + swap under the write fence; releases the re-embed lock.
  Waiting ends early when no batch finished for ``visibility_timeout + 60`` s (a lost batch is then encoded
  by the catch-up itself).
- ``dpr.reembed.check()``: the beat's job: if the configured model differs from the collection's fingerprint,
  no re-embed runs, and the gate did not reject that model before, submit one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from celery import Task, shared_task

from services.errors import TransientError
from services.reembed import (
    ReembedBusy,
    ReembedError,
    ReembedState,
    copy_batch,
    eval_scorer,
    finalize,
    promote_model,
    redis_client,
    reembed_lease,
    run_gate,
)
from services.settings import Settings
from services.store.points import Passage
from workers.reembed_dispatch import BATCH_TASK, CHECK_TASK, FINALIZE_TASK, Progress, submit_reembed
from workers.tasks import backoff_seconds, worker_runtime

log = logging.getLogger(__name__)

FINALIZE_POLL = 2.0


def _state_and_spec(store: Any, target: str) -> tuple[ReembedState | None, Any]:
    for g in store.info().generations:
        if g.name == target:
            return ReembedState.from_generation(g), g.spec
    return None, None


@shared_task(name=BATCH_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def reembed_batch_task(
    self: Task, target: str, batch_id: str, passages: list[dict[str, Any]], collection: str | None = None
) -> dict[str, Any]:
    settings: Settings = self.app.settings  # type: ignore[attr-defined]
    runtime = worker_runtime(settings).for_collection(collection)
    store = runtime.store
    alias = collection or settings.collection
    progress = Progress(redis_client(settings.broker_url or ""), alias, target)
    try:
        state, spec = _state_and_spec(store, target)
        if state is None or state.status != "building":
            progress.done(batch_id)
            return {"batch": batch_id, "state": "skipped"}
        towers = runtime.towers_for(state.model)
        n = copy_batch(
            store, state, [Passage.from_payload(p) for p in passages], towers,
            runtime.sparse if spec.sparse else None, settings.encoder.batch_size,
        )
        progress.done(batch_id)
        if state.lock_token:
            reembed_lease(alias, settings.data_dir, settings.broker_url, settings.reembed.lock_ttl,
                          token=state.lock_token).refresh()
    except TransientError as e:
        raise self.retry(exc=e, countdown=backoff_seconds(int(self.request.retries or 0)),
                         max_retries=settings.celery.max_retries) from e
    log.info("re-embed batch done", extra={"target": target, "batch": batch_id, "passages": n})
    return {"batch": batch_id, "state": "done", "passages": n}


# max_retries=None on the task itself: Celery's retry(max_retries=None) means "the task's default" (3), and the
# finalize task polls (retries) until the batches are done, however long that takes under load.
@shared_task(
    name=FINALIZE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True, max_retries=None
)
def reembed_finalize_task(
    self: Task, target: str, collection: str | None = None, gate: str | None = None
) -> dict[str, Any]:
    settings: Settings = self.app.settings  # type: ignore[attr-defined]
    runtime = worker_runtime(settings).for_collection(collection)
    store = runtime.store
    alias = collection or settings.collection
    progress = Progress(redis_client(settings.broker_url or ""), alias, target)
    state, spec = _state_and_spec(store, target)
    if state is None or state.status != "building":
        return {"target": target, "state": "skipped"}
    lease = reembed_lease(alias, settings.data_dir, settings.broker_url, settings.reembed.lock_ttl,
                          token=state.lock_token or None)
    stall = settings.celery.visibility_timeout + 60
    if progress.pending() and progress.idle_seconds() < stall:
        lease.refresh()
        raise self.retry(countdown=FINALIZE_POLL, max_retries=None)
    towers = runtime.towers_for(state.model)
    sparse = runtime.sparse if spec.sparse else None
    gate_fn = None
    if gate:
        scorer = eval_scorer(settings, Path(gate))
        old = runtime.towers_for(store.info().active.spec.model)  # type: ignore[union-attr]

        def gate_fn() -> Any:
            return run_gate(store, state, towers, old, scorer, data=gate)

    try:
        result = finalize(
            store, state, towers, sparse, fence=runtime.fence, gate=gate_fn,
            on_activated=lambda s: promote_model(settings, s),
        )
        out = result.to_json()
    except TransientError as e:
        lease.refresh()
        raise self.retry(exc=e, countdown=backoff_seconds(int(self.request.retries or 0)), max_retries=None) from e
    except ReembedError as e:  # the target stays as it is: `dpr reembed` again resumes (or starts over)
        out = {"outcome": "failed", "target": target, "error": str(e)}
    progress.set_result(out)
    lease.release()
    log.info("re-embed finalized", extra=out)
    return out


def check_needed(settings: Settings) -> dict[str, Any]:
    """Does the configured (ACTIVE) model differ from the collection's? (pure read; no lock)"""
    from encoders.towers import model_fingerprint, resolve_model_path
    from services.store import open_store

    path, name = resolve_model_path(settings.encoder.model, settings.models_dir)
    wanted = model_fingerprint(path)
    store = open_store(settings)
    try:
        info = store.info()
    finally:
        store.close()
    if info.active is None:
        return {"needed": False, "reason": "no collection yet", "model": wanted}
    if info.active.spec.model == wanted:
        return {"needed": False, "reason": "collection already embedded by the configured model", "model": wanted}
    for g in info.generations:
        st = ReembedState.from_generation(g)
        if st and st.model == wanted and st.source == info.active.name and st.status == "rejected":
            return {"needed": False, "reason": f"the gate rejected model {name} ({g.name})", "model": wanted}
    return {"needed": True, "model": wanted, "model_name": name, "collection_model": info.active.spec.model}


@shared_task(name=CHECK_TASK, bind=True, acks_late=True, ignore_result=True)
def reembed_check_task(self: Task, collection: str | None = None) -> dict[str, Any]:
    settings: Settings = self.app.settings  # type: ignore[attr-defined]
    if collection and collection != settings.collection:
        settings = settings.model_copy(update={"collection": collection})
    decision = check_needed(settings)
    if not decision["needed"]:
        log.info("re-embed check: nothing to do", extra=decision)
        return decision
    try:
        submitted = submit_reembed(settings, adopt=False)
    except ReembedBusy as e:
        return {**decision, "submitted": False, "reason": str(e)}
    log.info("re-embed check: submitted", extra=submitted.to_json())
    return {**decision, "submitted": True, **submitted.to_json()}
