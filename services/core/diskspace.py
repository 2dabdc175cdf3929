"""Free space before writing: a full disk gets one line naming the disk and the fix, never a SIGBUS.

The embedded engine writes through memory maps: when the disk fills under it, the kernel kills the process with
SIGBUS (exit 135) mid-write, with no message. So every writer checks *before* writing (``require``): an upsert
batch, a new generation, a job file, a snapshot; below ``min_free_mb`` (``DPR_MIN_FREE_MB``) it raises
``DiskFull`` (a transient error: exit 3) and writes nothing. A write that still meets ENOSPC (another program
filled the disk meanwhile) is turned into the same error by ``translate``. Reads never check: a full disk serves
queries.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.core.errors import DiskFull

WARN_FACTOR = 4  # `dpr status` warns below WARN_FACTOR x min_free_mb
MB = 1024 * 1024


@dataclass(frozen=True)
class DiskSpace:
    path: Path  # the directory asked about (or its nearest existing parent)
    free_bytes: int
    total_bytes: int

    @property
    def free_mb(self) -> float:
        return self.free_bytes / MB

    def to_json(self, min_free_mb: int) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "free_mb": round(self.free_mb, 1),
            "total_mb": round(self.total_bytes / MB, 1),
            "min_free_mb": min_free_mb,
            "low": self.free_mb < min_free_mb * WARN_FACTOR,
            "writes_refused": self.free_mb < min_free_mb,
        }


def existing_parent(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_space(path: Path) -> DiskSpace:
    where = existing_parent(path)
    st = os.statvfs(where)
    return DiskSpace(where, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)


def require(path: Path, min_free_mb: int, what: str, need_bytes: int = 0) -> None:
    """Raise ``DiskFull`` unless the disk under ``path`` has ``min_free_mb`` MB (plus ``need_bytes``) free."""
    if min_free_mb <= 0 and need_bytes <= 0:
        return
    space = disk_space(path)
    if space.free_bytes - need_bytes < min_free_mb * MB:
        raise disk_full(space, what, min_free_mb, need_bytes)


def disk_full(space: DiskSpace, what: str, min_free_mb: int, need_bytes: int = 0) -> DiskFull:
    disk = f"the disk of {space.path} ({space.free_mb:.1f} MB free of {space.total_bytes / MB:.0f} MB)"
    if min_free_mb <= 0 and need_bytes <= 0:  # the OS said ENOSPC: the write was refused (temp files are removed)
        return DiskFull(
            f"disk full: {what} failed, {disk} is full; what was written before stays intact: free space there (or "
            "move DPR_DATA_DIR to a larger disk) and run the command again"
        )
    need = f"{min_free_mb} MB (DPR_MIN_FREE_MB)" + (f" + {need_bytes / MB:.1f} MB to write" if need_bytes else "")
    return DiskFull(
        f"disk full: {what} needs {need} free on {disk}; nothing was written: free space there (or move "
        "DPR_DATA_DIR to a larger disk, or lower DPR_MIN_FREE_MB) and run the command again"
    )


def is_enospc(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    return "No space left on device" in text or "os error 28" in text


def full_disk_error(error: BaseException) -> DiskFull | None:
    """``DiskFull`` naming the disk for an ENOSPC ``error`` (the path from the OSError when it has one), else None."""
    if not is_enospc(error):
        return None
    filename = getattr(error, "filename", None)
    path = Path(filename) if isinstance(filename, str | os.PathLike) else Path.cwd()
    return disk_full(disk_space(path), f"writing {filename}" if filename else "a write", 0)


@contextlib.contextmanager
def translate(path: Path, what: str) -> Iterator[None]:
    """An ENOSPC/EDQUOT (the OS's, or the engine's text of it) inside becomes ``DiskFull`` naming the disk."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:
        if not is_enospc(e):
            raise
        raise disk_full(disk_space(path), what, 0) from e
