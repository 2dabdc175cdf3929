"""Submit a re-embed to the workers and follow it (used by `dpr reembed` with a broker and by the beat check).

Flow: take the collection's re-embed lock (Redis, TTL, refreshed by every task of the run), ``plan`` (resume the
re-embed in progress or create the target generation), send one ``dpr.reembed.batch`` task per batch of pending
passages (the passages travel as payload dicts, so a worker needs no source files and no extra read), then one
``dpr.reembed.finalize`` task that waits for the batches, catches up, verifies, swaps and releases the lock.

Progress per target generation in Redis (all keys expire after a week):
``dpr:reembed:<alias>:<target>:sent`` / ``:done`` (sets of batch ids), ``:last`` (time of the last finished
batch), ``:result`` (the finalize outcome, JSON).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from services.lifecycle.swap import (
    ReembedBusy,
    ReembedState,
    current_state,
    find_state,
    pending_batches,
    plan,
    redis_client,
    reembed_lease,
)
from services.settings import Settings

log = logging.getLogger(__name__)

REEMBED_QUEUE = "reembed"
BATCH_TASK = "dpr.reembed.batch"
FINALIZE_TASK = "dpr.reembed.finalize"
CHECK_TASK = "dpr.reembed.check"
TTL = 7 * 24 * 3600


class Progress:
    def __init__(self, client: Any, alias: str, target: str) -> None:
        self.client = client
        self.key = f"dpr:reembed:{alias}:{target}"

    def reset(self) -> None:
        """Forget an earlier run's progress (a generation name can come back after `dpr gc`)."""
        self.client.delete(*(f"{self.key}:{part}" for part in ("sent", "done", "last", "result")))

    def sent(self, batch_ids: list[str]) -> None:
        if batch_ids:
            self.client.sadd(f"{self.key}:sent", *batch_ids)
            self.client.expire(f"{self.key}:sent", TTL)
            self.touch()

    def done(self, batch_id: str) -> None:
        self.client.sadd(f"{self.key}:done", batch_id)
        self.client.expire(f"{self.key}:done", TTL)
        self.touch()

    def touch(self) -> None:
        self.client.set(f"{self.key}:last", f"{time.time():.3f}", ex=TTL)

    def pending(self) -> int:
        return int(len(self.client.sdiff(f"{self.key}:sent", f"{self.key}:done")))

    def counts(self) -> tuple[int, int]:
        return int(self.client.scard(f"{self.key}:done")), int(self.client.scard(f"{self.key}:sent"))

    def idle_seconds(self) -> float:
        last = self.client.get(f"{self.key}:last")
        return time.time() - float(last) if last else float("inf")

    def set_result(self, result: dict[str, Any]) -> None:
        self.client.set(f"{self.key}:result", json.dumps(result), ex=TTL)

    def result(self) -> dict[str, Any] | None:
        raw = self.client.get(f"{self.key}:result")
        return json.loads(raw) if raw else None


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

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def submit_reembed(
    settings: Settings, *, model: str | None = None, gate: str | None = None, adopt: bool = True
) -> Submitted:
    """Lock, plan, send the pending batches and the finalize task. Raises ``ReembedBusy`` if another runs.

    ``adopt``: when the lock is held by the very re-embed in progress (its token is in the record), take it over
    and re-send what is still pending (what `dpr reembed` run again does after Ctrl-C or a dead worker). The beat
    passes False: a live run is left alone, and only a run whose lock expired is resumed."""
    from encoders.towers import load_towers
    from services.store import open_store

    url = settings.broker_url or ""
    towers = load_towers(model or settings.encoder.model, settings.models_dir, device=settings.encoder.device)
    store = open_store(settings)
    lease = reembed_lease(settings.collection, settings.data_dir, url, settings.reembed.lock_ttl)
    try:
        building = find_state(store)
        if not lease.acquire():
            holder = lease.client.get(lease.key)  # type: ignore[attr-defined]
            holder = holder.decode() if isinstance(holder, bytes) else holder
            if not adopt or building is None or not building.lock_token or holder != building.lock_token:
                raise ReembedBusy(
                    f"another re-embed of {settings.collection!r} holds the lock ({lease.holder()}); wait for it "
                    "(`dpr status`) or let its lock expire"
                )
            lease = reembed_lease(settings.collection, settings.data_dir, url, settings.reembed.lock_ttl,
                                  token=building.lock_token)  # resume the run whose tasks are still around
        token = getattr(lease, "token", "")
        state = plan(store, towers, model_name=towers.name, lock_token=token)
        if state is None:
            lease.release()
            return Submitted(outcome="nothing_to_do", model=towers.fingerprint, model_name=towers.name)
        resumed = building is not None and building.target == state.target
        if not resumed:
            Progress(redis_client(url), settings.collection, state.target).reset()
        sent = _send(settings, state, gate)
        sent.resumed = resumed
        return sent
    except BaseException:
        lease.release()
        raise
    finally:
        store.close()


def _send(settings: Settings, state: ReembedState, gate: str | None) -> Submitted:
    from services.store import open_store
    from workers.app import create_app

    progress = Progress(redis_client(settings.broker_url or ""), settings.collection, state.target)
    run = uuid.uuid4().hex[:8]
    out = Submitted("submitted", state.source, state.target, state.model, state.model_name)
    app = create_app(settings)
    store = open_store(settings)
    try:
        with app.producer_or_acquire() as producer:
            for n, batch in enumerate(pending_batches(store, state, settings.reembed.batch_size)):
                batch_id = f"{run}-{n}"
                progress.sent([batch_id])
                app.send_task(
                    BATCH_TASK,
                    args=[state.target, batch_id, [p.to_payload() for p in batch]],
                    kwargs={"collection": settings.collection},
                    queue=REEMBED_QUEUE,
                    producer=producer,
                )
                out.batches += 1
                out.passages += len(batch)
            progress.touch()
            app.send_task(
                FINALIZE_TASK,
                args=[state.target],
                kwargs={"collection": settings.collection, "gate": gate},
                queue=REEMBED_QUEUE,
                producer=producer,
            )
    finally:
        store.close()
        app.close()
    log.info("re-embed submitted", extra=out.to_json())
    return out


def reembed_status(settings: Settings, target: str | None = None) -> dict[str, Any]:
    """The newest re-embed record plus its Redis progress (batches done / sent, finalize result)."""
    from services.store import open_store

    store = open_store(settings)
    try:
        state = find_state(store, target) if target else current_state(store)
        if state is None:
            return {"state": None}
        data: dict[str, Any] = {"state": {**state.to_json(), "target": state.target}}
        data["target_points"] = store.count(generation=state.target)
        data["source_points"] = store.count(generation=state.source)
    finally:
        store.close()
    if settings.broker_url:
        progress = Progress(redis_client(settings.broker_url), settings.collection, state.target)
        done, sent = progress.counts()
        data.update(batches_done=done, batches_sent=sent, result=progress.result())
    return data
