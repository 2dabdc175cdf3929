"""A generation read whole from a copy of its shard (``copy_pages``: ``EdgeEngine.copy_pages``, for ``Store.scan``),
so that the process holding it (`dpr serve` answering from it) keeps it. The files are copied beside the holder, and
the copy is kept if they had settled (``settled``) and none of them nor the lock file changed meanwhile: every write,
through a call or a memory map, moves the size, mtime or inode of one of them or of the generation's lock file.
Else they are copied again under one lease turn (the holder then loads its shard again)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from qdrant_edge import EdgeShard, ScrollRequest

from services.core.fsutil import copy_tree_sparse, fsync_path, pid_alive, tracks_mapped_writes
from services.store.edge.config import SHARD, recover_swap
from services.store.edge.generation_lock import lock_file

if TYPE_CHECKING:
    from services.store.edge.engine import EdgeEngine
    from services.store.protocol import Record

CLOCK_STEP_NS = 20_000_000  # more than the step of the kernel's file clock (a jiffy)


def stamps(shard_dir: Path, lock: Path, settle: bool = False) -> dict[str, tuple[int, int, int]]:
    """Size, mtime and inode of every file of a shard and of its generation's lock file (rewritten by each holder
    that takes it). ``settle``: each file's dirty pages are written back first, so that a later store through a
    memory map faults again and moves its mtime."""
    files = [Path(d, f) for d, _, names in os.walk(shard_dir) for f in names]
    for path in files if settle else ():
        fsync_path(path)
    return {str(p): (st.st_size, st.st_mtime_ns, st.st_ino) for p in [lock, *files] for st in [p.stat()]}


def settled(shard_dir: Path, lock: Path) -> dict[str, tuple[int, int, int]] | None:
    """``stamps`` once the newest is older than the file clock's step, so that any write from then on, through a
    call or a map, changes one of them; None if they moved meanwhile or the filesystem does not move an mtime on a
    store through a map (``tracks_mapped_writes``: tmpfs)."""
    if not tracks_mapped_writes(shard_dir):
        return None
    first = stamps(shard_dir, lock, settle=True)
    time.sleep(max(0.0, (max(m for _, m, _ in first.values()) + CLOCK_STEP_NS - time.time_ns()) / 1e9))
    return first if stamps(shard_dir, lock) == first else None




def copy_pages(engine: EdgeEngine, generation: str, limit: int) -> Iterator[list[Record]]:
    """Every point's payload of ``engine``'s ``generation``, ``limit`` a page, read from a copy of its shard (removed
    after)."""
    for stale in engine.generations_dir.glob(".*.read.*"):  # a reader killed mid-read left it
        if not pid_alive(int(stale.name.rsplit(".read.", 1)[1].split(".")[0])):
            shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{generation}.read.{os.getpid()}.", dir=engine.generations_dir))
    copy, source, shard = work / SHARD, engine.generations_dir / generation / SHARD, None
    lock = lock_file(engine.root, generation)
    try:
        with contextlib.suppress(OSError):  # a file went meanwhile (an index swap)
            quiet = settled(source, lock)
            if quiet is not None:
                with engine.writing("copying a generation to read it"):
                    copy_tree_sparse(source, copy)
                if stamps(source, lock) == quiet:
                    shard = EdgeShard.load(str(copy))
        if shard is None:
            shutil.rmtree(copy, ignore_errors=True)
            with engine.session():
                engine.lease.claim(generation)
                recover_swap(source.parent)
                engine.lease.flush(generation)
                with engine.writing("copying a generation to read it"):
                    copy_tree_sparse(source, copy)
            shard = EdgeShard.load(str(copy))
        offset = None
        while True:
            records, offset = shard.scroll(ScrollRequest(offset=offset, limit=limit, with_payload=True,
                                                         with_vector=False))
            yield [(str(r.id), dict(r.payload or {})) for r in records]
            if offset is None:
                return
    finally:
        if shard is not None:
            shard.close()
        shutil.rmtree(work, ignore_errors=True)
