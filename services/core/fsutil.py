"""Small file helpers shared by the embedded store, the job folder and the model lifecycle: atomic writes, building
beside a target and moving in at the end, hole-keeping copies, and a polled ``flock`` with a deadline (the store's
shard lease and ``services.core.locks`` both take it)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_POLL = 0.05  # seconds between flock_until's tries (the default)


def write_atomic(path: Path, text: str) -> None:
    """Write a temp file, fsync it, ``os.replace`` it over ``path``, fsync the directory: readers see the old
    content or the new, never a torn file, and a crash after return keeps the new."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)


def json_or_empty(path: Path) -> dict[str, Any]:
    """The JSON object a record file holds; ``{}`` when it is missing, unreadable or not JSON."""
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def fsync_path(path: Path) -> None:
    """Make a file's written pages, or the renames in a directory, durable."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def built_beside(target: Path, what: str) -> Iterator[Path]:
    """A new, empty directory beside ``target`` (on its disk, so a rename moves what is built there into place at
    once) in which to build ``what``; removed at the end. On an error the folders made for it go too, and the error
    carries a note that ``target`` is as it was. A killed process leaves ``.TARGET.*.tmp`` (safe to delete)."""
    made = [p for p in target.parents if not p.exists()]
    build = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
    build.mkdir(parents=True)
    try:
        yield build
    except BaseException as e:
        e.add_note(f"{what} failed and left {target} as it was (nothing was written there)")
        if made:
            shutil.rmtree(made[-1], ignore_errors=True)
        raise
    finally:
        shutil.rmtree(build, ignore_errors=True)


def move_into(src: Path, dst: Path) -> None:
    """Move the tree ``src`` into ``dst`` by renames: what ``dst`` lacks moves in whole, a folder both hold is merged,
    a file both hold keeps ``dst``'s."""
    if not dst.exists():
        os.replace(src, dst)
        fsync_path(dst.parent)
        return
    for entry in src.iterdir():
        there = dst / entry.name
        if entry.is_dir() and there.is_dir():
            move_into(entry, there)
        elif not there.exists():
            os.replace(entry, there)
    fsync_path(dst)


def allocated_bytes(root: Path) -> int:
    """The disk space the files under ``root`` take (holes cost nothing)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


_COPY_BLOCK = 1 << 20


def copy_file_sparse(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` reading only its data extents (SEEK_DATA / SEEK_HOLE): the engine's pre-allocated,
    mostly empty files (the WAL: ~150 MB apparent) stay holes and cost no disk."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                start = os.lseek(fin.fileno(), offset, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fin.fileno(), start, os.SEEK_HOLE)
            fin.seek(start)
            fout.seek(start)
            remaining = end - start
            while remaining > 0:
                block = fin.read(min(_COPY_BLOCK, remaining))
                if not block:
                    break
                fout.write(block)
                remaining -= len(block)
            offset = end
        fout.truncate(size)
    shutil.copystat(src, dst)


def copy_tree_sparse(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, copy_function=lambda s, d: copy_file_sparse(Path(s), Path(d)))


Noted = dict[str, tuple[tuple[int, int, int], int]]  # file -> ((inode, size, mtime ns), when it was looked at, ns)
_SETTLED_NS = 1_000_000_000  # an mtime this close to the look: a write in the same clock tick could keep it


def copy_tree_changed(src: Path, dst: Path, noted: Noted | None = None, settle: bool = False) -> Noted:
    """Make ``dst`` a copy of ``src`` (holes kept), copying only the files an earlier call did not note unchanged:
    the same inode, size and mtime, that mtime a second older than the look; what ``src`` lacks is removed. Returns
    this call's notes. ``settle`` (``src`` may be written meanwhile): each file's dirty pages are written back before
    it is looked at, so that a later store through a memory map faults and moves its mtime (see
    ``tracks_mapped_writes``); a file that vanishes meanwhile is left to the next call."""
    notes: Noted = {}
    for folder, _, files in os.walk(src):
        (dst / Path(folder).relative_to(src)).mkdir(parents=True, exist_ok=True)
        for name in files:
            path = Path(folder) / name
            rel = str(path.relative_to(src))
            try:
                looked = time.time_ns()
                if settle:
                    fsync_path(path)
                st = path.stat()
                notes[rel] = ((st.st_ino, st.st_size, st.st_mtime_ns), looked)
                before = (noted or {}).get(rel)
                if before is None or before[0] != notes[rel][0] or st.st_mtime_ns > before[1] - _SETTLED_NS:
                    copy_file_sparse(path, dst / rel)
            except FileNotFoundError:
                if not settle:
                    raise
                notes.pop(rel, None)
    for folder, dirs, files in os.walk(dst, topdown=False):
        gone = [n for n in files + dirs if not (src / Path(folder).relative_to(dst) / n).exists()]
        for name in gone:
            path = Path(folder) / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return notes


def tracks_mapped_writes(path: Path) -> bool:
    """Whether stores through a memory map move the mtime of files under ``path`` once their pages were written
    back (disk file systems do; tmpfs never writes back, and a store after an fsync left it as it was, measured):
    ``copy_tree_changed`` can then trust it."""
    path, best, kind = path.resolve(), -1, ""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields, _, rest = line.partition(" - ")
        mount = fields.split()[4].replace("\\040", " ")
        if path.is_relative_to(mount) and len(mount) > best:
            best, kind = len(mount), rest.split()[0]
    return kind in {"ext4", "xfs", "btrfs", "overlay"}


def now_iso() -> str:
    """The UTC time stamp records on disk carry (key files, re-embed states, passages): seconds, ISO 8601."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def pid_alive(pid: int) -> bool:
    """A process ``pid`` runs on this host (under any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder_tag() -> str:
    """Who holds a lock, as lock files and lock keys record it: ``pid P host H since T``."""
    return f"pid {os.getpid()} host {socket.gethostname()} since {time.time():.0f}"


def flock_until(
    fd: int,
    mode: int,
    deadline: float,
    *,
    on_wait: Callable[[], None] | None = None,
    poll: float = _POLL,
    max_poll: float = _POLL,
) -> bool:
    """Take ``flock(fd, mode)`` (LOCK_EX or LOCK_SH), polling until ``deadline`` (``time.monotonic()``); the poll
    interval doubles from ``poll`` up to ``max_poll``; ``on_wait`` runs before each sleep. False on time-out."""
    delay = poll
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if on_wait is not None:
                on_wait()
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, max_poll)


def sha256_of(path: Path, block: int = 1 << 20) -> str:
    """The sha256 hex digest of a file's bytes, read in blocks (snapshots, uploads, a document's signature)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return digest.hexdigest()
