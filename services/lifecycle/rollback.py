"""Rollback: swap the alias back to the previous generation (kept until `dpr gc`); its model becomes ACTIVE."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from encoders.registry import activate
from services.core.errors import CollectionNotFound, ConfigError
from services.core.fsutil import now_iso
from services.core.locks import NoFence, WriteFence
from services.core.settings import Settings
from services.lifecycle.locks import lease_for
from services.lifecycle.models import model_name_for
from services.lifecycle.state import ACTIVATED_KEY, PREVIOUS_KEY, ReembedBusy, ReembedState
from services.store.points import CollectionInfo, GenerationInfo
from services.store.protocol import VectorStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rollback:
    from_generation: str
    to_generation: str
    model: str

    def to_json(self) -> dict[str, Any]:
        return {"from": self.from_generation, "to": self.to_generation, "model": self.model}


def previous_generation(info: CollectionInfo) -> GenerationInfo | None:
    """The generation `dpr rollback` would go back to (kept until `dpr gc`), or None (also with no collection)."""
    current = info.active
    if current is None:
        return None
    by_name = {g.name: g for g in info.generations}
    previous = current.spec.settings.get(PREVIOUS_KEY)
    if isinstance(previous, str) and previous in by_name:
        return by_name[previous]
    # no record: the newest other generation that is complete (not an unfinished or rejected re-embed)
    for g in reversed(info.generations):
        st = ReembedState.from_generation(g)
        if g.name != current.name and (st is None or st.status == "active"):
            return g
    return None


def rollback_target(store: VectorStore) -> tuple[GenerationInfo, GenerationInfo]:
    info = store.info()
    if info.active is None:
        raise CollectionNotFound(f"collection {store.alias!r} does not exist yet")
    previous = previous_generation(info)
    if previous is not None:
        return info.active, previous
    raise ConfigError(
        f"collection {store.alias!r} has no previous generation to roll back to (generations kept: "
        f"{', '.join(g.name for g in info.generations)})"
    )


def rollback(store: VectorStore, *, fence: WriteFence | None = None) -> Rollback:
    """Swap the alias back to the previous generation (which then records this one as its previous)."""
    fence = fence or NoFence()
    with fence.exclusive():
        current, previous = rollback_target(store)
        store.activate(previous.name)
        store.update_settings({PREVIOUS_KEY: current.name, ACTIVATED_KEY: now_iso()}, generation=previous.name)
    log.info("rolled back", extra={"from": current.name, "to": previous.name})
    return Rollback(current.name, previous.name, previous.spec.model)


def rollback_collection(settings: Settings) -> dict[str, Any]:
    """`dpr rollback`: under the re-embed lock and the write fence, then the restored model becomes ACTIVE.

    Returns the rollback's JSON plus ``model_name``."""
    from services.runtime import Runtime

    lease = lease_for(settings)
    if not lease.acquire(wait=5):
        raise ReembedBusy(f"a re-embed of {settings.collection!r} is running ({lease.holder()}); roll back "
                          "after it ends")
    runtime = Runtime(settings)
    try:
        done = rollback(runtime.store, fence=runtime.fence)
        name = model_name_for(settings, done.model)
        activate(settings.models_dir, name)
    finally:
        runtime.close()
        lease.release()
    return {**done.to_json(), "model_name": name}
