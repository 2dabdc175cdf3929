"""Finalize a re-embed: catch up, (gate), then under the exclusive write fence catch up, verify, swap the alias.

No lost writes: writers (ingest batches, deletes) hold the collection's ``WriteFence`` shared from resolving the
active generation to their last write. ``finalize`` catches up without the fence (cheap passes that copy what
changed meanwhile), then takes the fence exclusively (in-flight writes finish, new ones wait), catches up the
last changes, verifies, swaps the alias, records, and releases: a write either landed in the source before the
final catch-up read it, or waits and lands in the new generation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Literal

from encoders.towers import DualEncoder
from services.core.fsutil import now_iso
from services.core.locks import NoFence, WriteFence
from services.lifecycle.copy import check_towers, embed_passages, pending_batches, write_points
from services.lifecycle.gate import Gate, GateDecision
from services.lifecycle.state import (
    ACTIVATED_KEY,
    PREVIOUS_KEY,
    STATE_KEY,
    ReembedError,
    ReembedState,
    save_state,
)
from services.lifecycle.verify import Verification, catch_up, verified_by, verify
from services.store.protocol import VectorStore
from services.store.sparse import SparseEncoder

log = logging.getLogger(__name__)

OnActivated = Callable[[ReembedState], None]


@dataclass
class ReembedResult:
    state: ReembedState
    outcome: Literal["activated", "rejected", "nothing_to_do"]
    verification: Verification | None = None
    gate: GateDecision | None = None
    copied: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "source": self.state.source,
            "target": self.state.target,
            "model": self.state.model,
            "model_name": self.state.model_name,
            "copied": self.copied,
            "seconds": round(self.seconds, 3),
            "verification": self.verification.to_json() if self.verification else None,
            "gate": self.gate.to_json() if self.gate else None,
        }


def finalize(
    store: VectorStore,
    state: ReembedState,
    towers: DualEncoder,
    sparse: SparseEncoder | None,
    *,
    fence: WriteFence | None = None,
    gate: Gate | None = None,
    on_activated: OnActivated | None = None,
    max_unfenced_passes: int = 3,
    small: int = 256,
) -> ReembedResult:
    """Catch up, (gate), then under the exclusive write fence: catch up, verify, swap, record. Idempotent."""
    check_towers(state, towers)
    active = store.active()  # no count: the source stays with `dpr serve`
    if active is not None and active.name == state.target:  # already swapped (a redelivered finalize)
        return ReembedResult(state=replace(state, status="active"), outcome="activated")
    if active is None or active.name != state.source:
        save_state(store, replace(state, status="abandoned", finished=now_iso(), error="source no longer active"))
        raise ReembedError(
            f"the source generation {state.source} is no longer active (now "
            f"{active.name if active else None}); run `dpr reembed` again to re-embed the new one"
        )
    copied = 0
    for _ in range(max_unfenced_passes):
        d = catch_up(store, state, towers, sparse)
        copied += len(d.stale)
        if len(d.stale) + len(d.extra) <= small:
            break
    store.maybe_optimize(state.target)  # the new generation's HNSW, before the fence and the swap
    decision = gate() if gate is not None else None
    if decision is not None and not decision.promote:
        state = replace(state, status="rejected", finished=now_iso(), gate=decision.to_json())
        save_state(store, state)
        return ReembedResult(state=state, outcome="rejected", gate=decision, copied=copied)
    with (fence or NoFence()).exclusive():
        result = _swap(store, state, towers, sparse, decision, on_activated)
    result.copied += copied
    return result


def _swap(
    store: VectorStore,
    state: ReembedState,
    towers: DualEncoder,
    sparse: SparseEncoder | None,
    decision: GateDecision | None,
    on_activated: OnActivated | None,
) -> ReembedResult:
    """Under the exclusive fence: the last catch-up, verification, the alias swap and the record."""
    active_now = store.active().name  # type: ignore[union-attr]
    if active_now == state.target:  # a concurrent finalize of the same re-embed won
        return ReembedResult(state=replace(state, status="active"), outcome="activated")
    if active_now != state.source:
        raise ReembedError(f"the source generation {state.source} stopped being active during the re-embed")
    last = catch_up(store, state, towers, sparse)
    # a clean diff *is* the verification (same ids, hashes, one model); only re-scan the target after writing
    verification = verified_by(last, state) if last.clean else verify(store, state, last.source)
    if not verification.ok:
        save_state(store, replace(state, error=f"verification failed: {verification.to_json()}"))
        raise ReembedError(
            f"re-embed into {state.target} failed verification {verification.to_json()}; the alias still "
            f"points at {state.source}; run `dpr reembed` again to resume"
        )
    store.activate(state.target)
    stamp = now_iso()
    state = replace(state, status="active", finished=stamp, error="", gate=decision.to_json() if decision else {})
    store.update_settings(
        {STATE_KEY: state.to_json(), PREVIOUS_KEY: state.source, ACTIVATED_KEY: stamp}, generation=state.target
    )
    if on_activated is not None:
        on_activated(state)
    log.info("re-embed activated", extra={"target": state.target, "source": state.source, "model": state.model})
    return ReembedResult(state=state, outcome="activated", verification=verification, gate=decision,
                         copied=len(last.stale))


def run_in_process(
    store: VectorStore,
    state: ReembedState,
    towers: DualEncoder,
    sparse: SparseEncoder | None,
    *,
    batch_size: int = 256,
    encode_batch_size: int = 32,
    fence: WriteFence | None = None,
    gate: Gate | None = None,
    on_activated: OnActivated | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReembedResult:
    """The whole re-embed in this process: copy what is pending, then finalize. ``progress(done, total)``."""
    t0 = time.perf_counter()
    total = store.count(generation=state.source)
    copied = 0
    done = min(store.count(generation=state.target), total)  # resumed: roughly what is already there
    if progress:
        progress(done, total)
    # The tower keeps the CPU busy: a batch's points are written on another thread while the next batch encodes
    # (the runtimes release the GIL), as `dpr ingest` overlaps its reading with the tower. One write in flight.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpr-reembed-write") as writer:
        writing: Future[int] | None = None
        for batch in pending_batches(store, state, batch_size):
            check_towers(state, towers)
            points = embed_passages(batch, towers, sparse, encode_batch_size)
            if writing is not None:
                copied += writing.result()
            writing = writer.submit(write_points, store, state, points)
            if progress:
                done += len(batch)
                progress(min(done, total), total)
        if writing is not None:
            copied += writing.result()
    result = finalize(store, state, towers, sparse, fence=fence, gate=gate, on_activated=on_activated)
    result.copied += copied
    result.seconds = time.perf_counter() - t0
    return result
