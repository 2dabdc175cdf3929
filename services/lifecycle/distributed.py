"""A re-embed spread over workers: submit it, run its batch and finalize steps, report it.

Flow: take the collection's re-embed lock (Redis, TTL, refreshed by every step of the run), ``plan`` (resume the
re-embed in progress or create the target generation), send one batch step per batch of pending passages (the
passages travel as payload dicts, so a worker needs no source files and no extra read), then one finalize step
that waits for the batches, catches up, verifies, swaps and releases the lock. Sending is a ``Sender`` the caller
hands in (the Celery one lives in ``workers.reembed_dispatch``): nothing here knows Celery.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from encoders.registry import ModelNotFound, load_towers, model_for_fingerprint
from encoders.towers import DualEncoder
from services.core.errors import ConfigError, PermanentError, TransientError
from services.core.locks import Lease, WriteFence
from services.core.settings import Settings
from services.lifecycle.copy import copy_batch, pending_batches, plan
from services.lifecycle.gate import promotion_gate
from services.lifecycle.locks import lease_for, reembed_lease
from services.lifecycle.models import check_needed, promote_model
from services.lifecycle.progress import progress_for
from services.lifecycle.state import ReembedBusy, ReembedState, current_state, find_state, state_and_spec
from services.lifecycle.swap import finalize
from services.store.points import Passage
from services.store.protocol import VectorStore
from services.store.sparse import SparseEncoder, for_spec

log = logging.getLogger(__name__)


class Sender(Protocol):
    """Sends the steps of one re-embed of ``settings.collection`` to the workers."""

    def send_batch(self, target: str, batch_id: str, passages: list[dict[str, Any]]) -> None: ...

    def send_finalize(self, target: str, gate: str | None) -> None: ...


OpenSender = Callable[[Settings], contextlib.AbstractContextManager[Sender]]


class Encoders(Protocol):
    """What a step needs of the worker's runtime: towers by fingerprint and the sparse encoder."""

    @property
    def sparse(self) -> SparseEncoder: ...

    def towers_for(self, fingerprint: str) -> DualEncoder: ...


@dataclass
class Submitted:
    outcome: str  # "submitted" | "nothing_to_do"
    source: str = ""
    target: str = ""
    model: str = ""
    model_name: str = ""
    batches: int = 0
    passages: int = 0
    resumed: bool = False
    job: str = ""  # `dpr jobs JOB` follows the copy batches

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def submit_reembed(
    settings: Settings, open_sender: OpenSender, *, model: str | None = None, gate: str | None = None,
    adopt: bool = True,
) -> Submitted:
    """Lock, plan, send the pending batches and the finalize step. Raises ``ReembedBusy`` if another runs.

    ``adopt``: when the lock is held by the very re-embed in progress (its token is in the record), take it over
    and re-send what is still pending (what `dpr reembed` run again does after Ctrl-C or a dead worker). The beat
    passes False: a live run is left alone, and only a run whose lock expired is resumed."""
    import redis.exceptions

    from services.jobs import write_refused
    from services.store import open_store

    towers = load_towers(model or settings.encoder.model, settings.models_dir, device=settings.encoder.device,
                         backend=settings.encoder.passages, cache_dir=settings.onnx_cache_dir)  # as ingest's
    require_findable(settings, towers, model or settings.encoder.model)
    store = open_store(settings)
    lease = lease_for(settings)
    try:
        building = find_state(store)
        try:
            acquired = lease.acquire()
        except redis.exceptions.ResponseError as e:  # the broker refuses writes (its disk is full): one line
            refused = write_refused(settings.broker_url or "", e, lease.client,  # type: ignore[attr-defined]
                                    "no re-embed was started", "a re-embed resumes where it stopped")
            if refused is None:
                raise
            raise refused from e
        if not acquired:
            lease = _adopt(settings, lease, building if adopt else None)
        state = plan(store, towers, model_name=towers.name, lock_token=getattr(lease, "token", ""))
        if state is None:
            lease.release()
            return Submitted(outcome="nothing_to_do", model=towers.fingerprint, model_name=towers.name)
        resumed = building is not None and building.target == state.target
        if resumed:
            progress_for(settings, state.target).supersede_pending()
        else:
            progress_for(settings, state.target).reset()
        with open_sender(settings) as sender:
            sent = _send(settings, store, state, gate, sender)
        sent.resumed = resumed
        return sent
    except BaseException:
        lease.release()
        raise
    finally:
        store.close()


def require_findable(settings: Settings, towers: DualEncoder, model: str) -> None:
    """The workers load a re-embed's towers by fingerprint, from the base model or ``models_dir``: a model given
    by a path elsewhere would leave every batch failing on them. Refuse it here, before anything is sent."""
    try:
        model_for_fingerprint(towers.fingerprint, settings.models_dir)
    except ModelNotFound:
        raise ConfigError(
            f"--model {model}: the workers load a re-embed's model from {settings.models_dir} (or the base model), "
            f"and this one is not there; copy or link its folder to {settings.models_dir}/NAME and run "
            "`dpr reembed --model NAME`"
        ) from None


def _adopt(settings: Settings, lease: Lease, building: ReembedState | None) -> Lease:
    """The lease of the re-embed in progress when it holds the lock (resume the run whose steps are still
    around); else ``ReembedBusy``."""
    holder = lease.client.get(lease.key)  # type: ignore[attr-defined]
    holder = holder.decode() if isinstance(holder, bytes) else holder
    if building is None or not building.lock_token or holder != building.lock_token:
        raise ReembedBusy(
            f"another re-embed of {settings.collection!r} holds the lock ({lease.holder()}); wait for it "
            "(`dpr status`) or let its lock expire"
        )
    return lease_for(settings, token=building.lock_token)


def _send(settings: Settings, store: VectorStore, state: ReembedState, gate: str | None, sender: Sender) -> Submitted:
    progress = progress_for(settings, state.target)
    run = uuid.uuid4().hex[:8]
    out = Submitted("submitted", state.source, state.target, state.model, state.model_name)
    for n, batch in enumerate(pending_batches(store, state, settings.reembed.batch_size)):
        batch_id = f"{run}-{n}"
        progress.sent([batch_id])
        sender.send_batch(state.target, batch_id, [p.to_payload() for p in batch])
        out.batches += 1
        out.passages += len(batch)
    progress.sealed(out.passages)
    progress.touch()
    out.job = progress.job
    sender.send_finalize(state.target, gate)
    log.info("re-embed submitted", extra=out.to_json())
    return out


def copy_sent_batch(
    settings: Settings, encoders: Encoders, store: VectorStore, alias: str, target: str, batch_id: str,
    passages: list[dict[str, Any]],
) -> dict[str, Any]:
    """The batch step: encode ``passages`` with the target's passage tower into the target; skipped when the
    re-embed is no longer building. Idempotent. Refreshes the re-embed lock."""
    progress = progress_for(settings, target, alias)
    state, spec = state_and_spec(store, target)
    if state is None or state.status != "building":
        progress.done(batch_id)
        return {"batch": batch_id, "state": "skipped"}
    try:
        n = copy_batch(
            store, state, [Passage.from_payload(p) for p in passages], encoders.towers_for(state.model),
            for_spec(spec, encoders.sparse) if spec.sparse else None, settings.encoder.batch_size,
        )
    except (PermanentError, ModelNotFound) as e:  # retrying cannot help: let the finalize step stop waiting
        progress.failed(batch_id, str(e))
        raise
    progress.done(batch_id, n)
    if state.lock_token:
        reembed_lease(alias, settings.data_dir, settings.broker_url, settings.reembed.lock_ttl,
                      token=state.lock_token).refresh()
    log.info("re-embed batch done", extra={"target": target, "batch": batch_id, "passages": n})
    return {"batch": batch_id, "state": "done", "passages": n}


def finalize_sent(
    settings: Settings, encoders: Encoders, store: VectorStore, fence: WriteFence, alias: str, target: str,
    gate: str | None, stall: float,
) -> dict[str, Any] | None:
    """The finalize step: None while batches are in flight and still moving (ask again later); else catch-up,
    gate, verify, swap under ``fence``, record the outcome and release the re-embed lock. A ``TransientError``
    refreshes the lock and propagates (retry the step)."""
    state, spec = state_and_spec(store, target)
    if state is None or state.status != "building":
        return {"target": target, "state": "skipped"}
    progress = progress_for(settings, target, alias)
    lease = reembed_lease(alias, settings.data_dir, settings.broker_url, settings.reembed.lock_ttl,
                          token=state.lock_token or None)
    if progress.pending() and progress.idle_seconds() < stall:
        lease.refresh()
        return None
    try:
        towers = encoders.towers_for(state.model)
        gate_fn = promotion_gate(settings, store, state, towers, gate, encoders.towers_for)
        result = finalize(
            store, state, towers, for_spec(spec, encoders.sparse) if spec.sparse else None, fence=fence, gate=gate_fn,
            on_activated=lambda s: promote_model(settings, s),
        )
        out = result.to_json()
    except TransientError:
        lease.refresh()
        raise
    except (PermanentError, ModelNotFound) as e:  # a ReembedError too; the target stays: `dpr reembed` resumes it
        out = {"outcome": "failed", "target": target, "error": str(e)}
    progress.set_result(out)
    lease.release()
    log.info("re-embed finalized", extra=out)
    return out


def check_and_submit(settings: Settings, open_sender: OpenSender) -> dict[str, Any]:
    """The beat's check: submit a re-embed when the configured model differs from the collection's (and the gate
    did not reject it before); a live re-embed is left alone."""
    decision = check_needed(settings)
    if not decision["needed"]:
        log.info("re-embed check: nothing to do", extra=decision)
        return decision
    try:
        submitted = submit_reembed(settings, open_sender, adopt=False)
    except ReembedBusy as e:
        return {**decision, "submitted": False, "reason": str(e)}
    log.info("re-embed check: submitted", extra=submitted.to_json())
    return {**decision, "submitted": True, **submitted.to_json()}


def reembed_progress(settings: Settings, target: str) -> dict[str, Any]:
    """With a broker: the batches done / sent and the finalize result of the re-embed into ``target``, from the
    broker alone. A follower polls this: ``reembed_status`` opens the store, and with the embedded engine every
    open takes the shard's lease from the workers and the server (who then load their shards again)."""
    progress = progress_for(settings, target)
    done, sent = progress.counts()
    return {"batches_done": done, "batches_sent": sent, "result": progress.result(), "job": progress.job}


def reembed_status(settings: Settings, target: str | None = None) -> dict[str, Any]:
    """The newest re-embed record plus its progress with a broker (batches done / sent, finalize result)."""
    from services.store import open_store

    with open_store(settings) as store:
        # a follower names the target: it counts that generation alone, while it builds (on the embedded engine
        # the active one is `dpr serve`'s, and counting it takes it from the server, which then reloads it); the
        # counts at the end are the verification's
        state = state_and_spec(store, target)[0] if target else current_state(store)
        if state is None:
            return {"state": None}
        data: dict[str, Any] = {"state": {**state.to_json(), "target": state.target}}
        if target is None or state.status == "building":
            data["target_points"] = store.count(generation=state.target)
        if target is None:
            data["source_points"] = store.count(generation=state.source)
    if settings.broker_url:
        data.update(reembed_progress(settings, state.target))
    verified = (data.get("result") or {}).get("verification") or {}
    for key in ("source", "target"):
        data.setdefault(f"{key}_points", verified.get(f"{key}_count"))
    return data
