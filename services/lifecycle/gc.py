"""Garbage collection of generations: keep the newest inactive ones (rollback targets), drop the rest."""

from __future__ import annotations

from services.errors import ConfigError
from services.lifecycle.state import ReembedState
from services.settings import Settings
from services.store.protocol import VectorStore


def gc(store: VectorStore, keep: int, drop_orphans: bool = True) -> list[str]:
    """Drop all but the newest ``keep`` inactive generations. Never the active one, never a re-embed in progress.

    A building generation whose in-process builder is dead (a killed `dpr reembed`) is unfinished, not a rollback
    target: it is always dropped (the next `dpr reembed` would otherwise resume into it), and so is an abandoned
    one. One whose builder runs, or cannot be told (workers, another host), is kept."""
    if keep < 0:
        raise ConfigError(f"--keep must be >= 0, got {keep}")
    info = store.info()
    inactive = []
    orphans = []
    for g in info.generations:
        st = ReembedState.from_generation(g)
        unfinished = st is not None and (st.status == "abandoned" or (st.status == "building"
                                                                        and st.owner_alive() is False))
        if drop_orphans and not g.active and unfinished:
            orphans.append(g)
            continue
        if g.active or (st is not None and st.status == "building"):
            continue
        inactive.append(g)
    inactive.sort(key=lambda g: g.name, reverse=True)  # names carry zero-padded numbers: newest first
    dropped = []
    for g in orphans + inactive[keep:]:
        store.drop_generation(g.name)
        dropped.append(g.name)
    return dropped


def gc_collection(settings: Settings, keep: int | None = None) -> tuple[list[str], int]:
    """`dpr gc`: (dropped generations, the keep applied; default ``reembed.keep_generations``)."""
    from services.lifecycle.locks import lease_for
    from services.store import open_store

    n = settings.reembed.keep_generations if keep is None else keep
    lease = lease_for(settings)
    try:
        idle = lease.acquire()  # no re-embed runs, and none can resume an orphan while gc drops it
    except Exception:  # noqa: BLE001 - the broker's lease cannot be checked: keep every building generation
        idle = False
    store = open_store(settings)
    try:
        return gc(store, n, drop_orphans=idle), n
    finally:
        store.close()
        if idle:
            lease.release()
