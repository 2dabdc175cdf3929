"""A whole re-embed in this process (`dpr reembed` without a broker): lock, plan, copy, finalize, promote."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.core.settings import Settings
from services.lifecycle.copy import plan
from services.lifecycle.gate import promotion_gate
from services.lifecycle.locks import lease_for
from services.lifecycle.models import promote_model
from services.lifecycle.state import ReembedBusy
from services.lifecycle.swap import run_in_process
from services.store.sparse import for_spec


def reembed_in_process(
    settings: Settings,
    *,
    model: str | None = None,
    gate: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Re-embed ``settings.collection`` with ``model`` (default: the configured model) here; the JSON of the
    outcome (``nothing_to_do`` | ``activated`` | ``rejected``). ``progress(done, total)`` in passages."""
    from services.runtime import Runtime

    lease = lease_for(settings)
    if not lease.acquire():
        raise ReembedBusy(f"another re-embed of {settings.collection!r} is running ({lease.holder()})")
    runtime = Runtime(settings)
    try:
        towers = runtime.towers_of(model or settings.encoder.model)  # the passage tower's path, as ingest
        store = runtime.store
        state = plan(store, towers, model_name=towers.name, owned_here=True)
        if state is None:
            return {"outcome": "nothing_to_do", "model": towers.fingerprint, "model_name": towers.name}
        source_spec = store.info().active.spec  # type: ignore[union-attr]
        sparse = for_spec(source_spec, runtime.sparse) if source_spec.sparse else None  # its BM25 language
        result = run_in_process(
            store, state, towers, sparse, batch_size=settings.reembed.batch_size,
            encode_batch_size=settings.encoder.batch_size, fence=runtime.fence,
            gate=promotion_gate(settings, store, state, towers, gate, runtime.towers_for),
            on_activated=lambda s: promote_model(settings, s), progress=progress,
        )
        return result.to_json()
    finally:
        runtime.close()
        lease.release()
