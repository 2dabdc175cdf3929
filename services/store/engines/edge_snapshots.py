"""Snapshots of the embedded engine: the active generation copied under the store's lease, and a snapshot's
generation moved in (``services/ops/snapshots.py`` builds and checks the archive around them).

Consistency: the copy runs inside ``engine.session()`` (the directory's ``ShardLease``: no call of any process
touches the shard meanwhile) after a flush, so it holds whole upsert batches only; holes of the WAL's sparse files
stay holes. The lease is held only for the copy; the archive is written after, without it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from services.core.errors import CollectionNotFound, SnapshotError
from services.store.engines import edge_index
from services.store.engines.edge_config import LEVERS_FILE
from services.store.points import CollectionSpec

if TYPE_CHECKING:
    from services.store.engines.edge import EdgeEngine


def snapshot_generation(engine: EdgeEngine, dest: Path) -> tuple[str, CollectionSpec, int]:
    """Copy the active generation (flushed, under the lease) into ``dest``: ``spec.json``, ``shard/``,
    ``index.json`` and ``levers.json`` if any. Returns the generation's name, spec and point count."""
    from services.core.fsutil import copy_tree_sparse

    with engine.session():
        generation = engine.read_pointer()
        if generation is None:
            raise CollectionNotFound(
                f"collection {engine.alias!r} under {engine.root.parent} has nothing to snapshot yet; ingest first"
            )
        shard = engine.shard(generation)
        shard.flush()
        points = shard.info().points_count
        gen_dir = engine.root / "generations" / generation
        dest.mkdir(parents=True, exist_ok=True)
        copy_tree_sparse(gen_dir / edge_index.SHARD, dest / "shard")
        for name in ("spec.json", edge_index.INDEX_RECORD, LEVERS_FILE):
            if (gen_dir / name).is_file():
                shutil.copy2(gen_dir / name, dest / name)
        return generation, engine.read_spec(generation), points


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
