"""Whether a shard's files have settled, so that a copy of them taken now is the shard as it is (``EdgeEngine
.copy_pages`` reads a generation from such a copy, leaving it to the process that holds it): every write, through a
call or a memory map, moves the size, mtime or inode of one of them or of the generation's lock file."""

from __future__ import annotations

import os
import time
from pathlib import Path

from services.core.fsutil import fsync_path, tracks_mapped_writes

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
