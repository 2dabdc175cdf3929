"""Garbage collection of generations: keep the newest inactive ones (rollback targets), drop the rest."""

from __future__ import annotations

from collections.abc import Callable

from services.core.errors import ConfigError
from services.core.settings import Settings
from services.lifecycle.state import ReembedState
from services.store.protocol import VectorStore


def gc(store: VectorStore, keep: int, drop_orphans: bool = True,
       alive: Callable[[ReembedState], bool | None] | None = None) -> list[str]:
    """Drop all but the newest ``keep`` inactive generations. Never the active one, never a re-embed in progress.

    A building generation whose builder is dead (a killed `dpr reembed`; workers whose re-embed lease expired) is
    unfinished, not a rollback target: it is always dropped (the next `dpr reembed` would otherwise resume into
    it), and so is an abandoned one. One whose builder runs, or cannot be told (another host, an unreadable
    broker), is kept. ``alive(state)``: whether its builder runs (default: the in-process owner's pid;
    ``gc_collection`` passes ``builder_alive``, which also reads the workers' lease)."""
    alive = alive or ReembedState.owner_alive
    if keep < 0:
        raise ConfigError(f"--keep must be >= 0, got {keep}")
    info = store.info()
    inactive = []
    orphans = []
    for g in info.generations:
        st = ReembedState.from_generation(g)
        unfinished = st is not None and (st.status == "abandoned" or (st.status == "building"
                                                                        and alive(st) is False))
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


def gc_collection(settings: Settings, keep: int | None = None, store: VectorStore | None = None
                  ) -> tuple[list[str], int]:
    """`dpr gc`: (dropped generations, the keep applied; default ``reembed.keep_generations``). ``store``: the
    collection's store when the caller has it open (default: opened here and closed after)."""
    from services.lifecycle.builder import builder_alive
    from services.lifecycle.locks import lease_for
    from services.store import open_store

    n = settings.reembed.keep_generations if keep is None else keep
    lease = lease_for(settings)
    try:
        idle = lease.acquire()  # no re-embed runs, and none can resume an orphan while gc drops it
    except Exception:  # noqa: BLE001 - the broker's lease cannot be checked: keep every building generation
        idle = False
    own = store is None
    store = store if store is not None else open_store(settings)
    try:
        return gc(store, n, drop_orphans=idle, alive=lambda st: builder_alive(settings, st)), n
    finally:
        if own:
            store.close()
        if idle:
            lease.release()
