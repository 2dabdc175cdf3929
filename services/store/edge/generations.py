"""Making and dropping an embedded generation's folder (``EdgeEngine.create`` and ``drop``), under the directory's
lock: one process at a time makes or drops generations, and neither runs on the query path.

A new generation's shard is created with the levers the memory budget chooses for the points the active
generation's last build saw (a re-embed's source; none for a new collection), then its payload indexes, its
levers and last its spec are written (a generation without its spec is not complete). A dropped one is renamed to
trash first, so that a crash mid-delete never leaves a half generation that looks complete. What a crash left (a
generation without its spec, a drop's trash) is swept before the next creation.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from qdrant_edge import EdgeShard

from services.store.edge.config import (
    SHARD,
    budget_levers,
    edge_config,
    indexed_points,
    payload_indexes,
    record_levers,
)

if TYPE_CHECKING:
    from services.store.edge.engine import EdgeEngine
    from services.store.points import CollectionSpec

log = logging.getLogger(__name__)




def create(engine: EdgeEngine, generation: str, spec: CollectionSpec) -> bool:
    """Make ``generation``; False if its folder exists (a generation, or a half-made one a crash left behind)."""
    with engine.session(create=True):  # the directory's lock: one process makes generations at a time
        sweep_half_made(engine.generations_dir, keep=generation)
        gen_dir = engine.generations_dir / generation
        try:
            gen_dir.mkdir(parents=True)
        except FileExistsError:
            return False
        levers, memory = engine.levers, None
        if engine.memory_budget_mb is not None:  # sized as the points the active generation's last build saw
            active = engine.read_pointer()
            expected = indexed_points(engine.generations_dir / active) if active else 0
            levers, memory = budget_levers(levers, expected, spec.dim, engine.memory_budget_mb, engine.fixed_levers)
        with engine.writing("creating a generation"):
            shard = EdgeShard.create(str(gen_dir / SHARD), edge_config(spec, levers=levers))
        engine.lease.adopt(generation, shard, gen_dir / SHARD)
        for operation in payload_indexes(levers):
            shard.update(operation)
        shard.flush()
        record_levers(gen_dir, levers, memory)
        engine.write_spec(generation, spec)  # last: a generation without its spec is not complete
        return True


def sweep_half_made(generations_dir: Path, keep: str) -> None:
    """Remove what a crash left in the generations dir: a generation without ``spec.json`` (killed or SIGBUS
    mid-creation, never listed or read) and a ``drop``'s trash. Under the directory's lock (creation and drop
    run whole under it), so no live process is making them. ``keep`` (the name about to be tried) stays: numbers are
    never reused; its leftover goes with the next creation."""
    if not generations_dir.is_dir():
        return
    for entry in generations_dir.iterdir():
        trash = entry.name.startswith(".") and ".dropping." in entry.name
        half_made = not entry.name.startswith(".") and not (entry / "spec.json").exists()
        if entry.name != keep and entry.is_dir() and (trash or half_made):
            log.warning("removing a half-made generation a crash left", extra={"path": str(entry)})
            shutil.rmtree(entry, ignore_errors=True)


def drop(engine: EdgeEngine, generation: str) -> bool:
    """Remove ``generation``'s folder and lock files; False if it does not exist."""
    with engine.session(create=True):  # the directory's lock, then the generation's (nobody has it open)
        if not (engine.generations_dir / generation).is_dir():
            return False
        engine.lease.claim(generation, sole=True)  # nobody has its shard open
        engine.lease.forget(generation)
        # rename first so that a crash mid-delete never leaves a half generation that looks complete
        trash = engine.generations_dir / f".{generation}.dropping.{os.getpid()}"
        os.replace(engine.generations_dir / generation, trash)
        engine.lease.dropped(generation)
        shutil.rmtree(trash, ignore_errors=True)
        return True
