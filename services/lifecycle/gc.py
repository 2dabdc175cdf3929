"""Garbage collection of generations: keep the newest inactive ones (rollback targets), drop the rest."""

from __future__ import annotations

from services.errors import ConfigError
from services.lifecycle.state import ReembedState
from services.settings import Settings
from services.store.protocol import VectorStore


def gc(store: VectorStore, keep: int) -> list[str]:
    """Drop all but the newest ``keep`` inactive generations. Never the active one, never a re-embed in progress."""
    if keep < 0:
        raise ConfigError(f"--keep must be >= 0, got {keep}")
    info = store.info()
    inactive = []
    for g in info.generations:
        st = ReembedState.from_generation(g)
        if g.active or (st is not None and st.status == "building"):
            continue
        inactive.append(g)
    inactive.sort(key=lambda g: g.name, reverse=True)  # names carry zero-padded numbers: newest first
    dropped = []
    for g in inactive[keep:]:
        store.drop_generation(g.name)
        dropped.append(g.name)
    return dropped


def gc_collection(settings: Settings, keep: int | None = None) -> tuple[list[str], int]:
    """`dpr gc`: (dropped generations, the keep applied; default ``reembed.keep_generations``)."""
    from services.store import open_store

    n = settings.reembed.keep_generations if keep is None else keep
    store = open_store(settings)
    try:
        return gc(store, n), n
    finally:
        store.close()
