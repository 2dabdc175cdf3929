"""Snapshots of the embedded engine: the active generation copied under the store's lease, and a snapshot's
generation moved in (``services/ops/snapshots.py`` builds and checks the archive around them).

Consistency: as an index build's copy (``edge_index.copy_shard``), most of the shard is copied first without the
lease, then, inside ``engine.session()`` with the generation claimed (every writer's batch flushed, none writing
meanwhile), the files changed since; so the copy holds whole upsert batches only, and holes of the WAL's sparse
files stay holes. The shard is never loaded here: a process answering from it (``dpr serve``) keeps it open and
answers throughout (writers wait only for the second, short copy). The point count is read from the copy, after.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from services.core.errors import CollectionNotFound, SnapshotError
from services.store.edge import index as edge_index
from services.store.edge.config import LEVERS_FILE
from services.store.points import CollectionSpec

if TYPE_CHECKING:
    from services.store.edge.engine import EdgeEngine


def snapshot_generation(engine: EdgeEngine, dest: Path) -> tuple[str, CollectionSpec, int]:
    """Copy the active generation into ``dest``: ``spec.json``, ``shard/``, ``index.json`` and ``levers.json`` if
    any. Returns the generation's name, spec and point count."""
    from qdrant_edge import CountRequest, EdgeShard

    generation = _active(engine)
    dest.mkdir(parents=True, exist_ok=True)
    noted = edge_index.copy_shard(engine.root / "generations" / generation, dest / "shard")  # off the lease
    with engine.session():
        if _active(engine) != generation:  # another generation was activated meanwhile: all of it, under the lease
            generation, noted = _active(engine), {}
        gen_dir = engine.root / "generations" / generation
        engine.lease.claim(generation)  # not loaded: one open elsewhere was flushed, and stays open there
        edge_index.recover_swap(gen_dir)
        engine.lease.flush(generation)  # this process's own writes, if it has the shard open
        edge_index.copy_shard(gen_dir, dest / "shard", noted)
        for name in ("spec.json", edge_index.INDEX_RECORD, LEVERS_FILE):
            if (gen_dir / name).is_file():
                shutil.copy2(gen_dir / name, dest / name)
        spec = engine.read_spec(generation)
    with contextlib.closing(EdgeShard.load(str(dest / "shard"))) as copy:  # its own count: the served one untouched
        points = copy.count(CountRequest(exact=True))
    return generation, spec, points


def _active(engine: EdgeEngine) -> str:
    with engine.session():
        generation = engine.read_pointer()
    if generation is None:
        raise CollectionNotFound(
            f"collection {engine.alias!r} under {engine.root.parent} has nothing to snapshot yet; ingest first"
        )
    return generation


def restore_generation(engine: EdgeEngine, source: Path, generation: str) -> None:
    """Move ``source`` (a generation directory unpacked from a snapshot, on this disk) in as ``generation`` and point
    the collection at it; refused when the collection exists here."""
    with engine.session(create=True):
        if engine.read_pointer() is not None or engine.generations():
            raise SnapshotError(
                f"collection {engine.alias!r} already exists in {engine.root.parent}; restore into a new data dir "
                "(--data-dir) or delete that collection first"
            )
        generations = engine.root / "generations"
        generations.mkdir(parents=True, exist_ok=True)
        os.replace(source, generations / generation)
        engine.write_pointer(generation, None)
