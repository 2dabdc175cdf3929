"""The data directory's format version: ``DATA_DIR/FORMAT`` says which on-disk layout a data dir holds
(docs/data-safety.md: what a release does with each kind of data dir, and `dpr migrate`).

``FORMAT`` is one JSON object, ``{"format": N, "written_by": "dpr-ingest X.Y.Z"}``, written atomically the first
time a process writes into the data dir. ``check`` opens a dir of ``CURRENT`` format (a dir with no ``FORMAT`` is
format 1), or an older one in ``OPENS_AS_IS``; any other is refused with one line naming the fix (``dpr migrate``,
which runs ``MIGRATIONS`` in order, or a newer release). A layout change adds ``N + 1`` to ``CURRENT``, a step
``MIGRATIONS[N]`` (``N`` -> ``N + 1``) and a fixture ``tests/fixtures/datadir-vN/`` made by the release before it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.core.errors import DataDirFormatError
from services.core.fsutil import allocated_bytes, built_beside, copy_tree_sparse, fsync_path, write_atomic

log = logging.getLogger(__name__)

FORMAT_FILE = "FORMAT"
CURRENT = 1
LEGACY = 1  # a data dir with content but no FORMAT file: written before the file existed (layout 1)
OPENS_AS_IS: frozenset[int] = frozenset({1})
# N -> the step that turns a format-N data dir into format N + 1 (``migrate`` runs it on a copy).
MIGRATIONS: dict[int, Callable[[Path], None]] = {}
CONTENT = ("store", "models", "jobs", "cache", "locks")  # what a used data dir holds


@dataclass(frozen=True)
class FormatState:
    path: Path
    format: int | None  # None: a new (empty or missing) data dir
    recorded: bool  # whether FORMAT exists
    written_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"data_dir": str(self.path), "format": self.format, "recorded": self.recorded,
                "written_by": self.written_by, "current": CURRENT}


def dpr_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"dpr-ingest {version('dpr-ingest')}"
    except PackageNotFoundError:  # pragma: no cover - running from a tree that was never installed
        return "dpr-ingest (unknown version)"


def read_format(data_dir: Path) -> FormatState:
    """What the data dir says about itself (never writes). A FORMAT that cannot be read is refused."""
    path = data_dir / FORMAT_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        used = data_dir.is_dir() and any((data_dir / name).exists() for name in CONTENT)
        return FormatState(data_dir, LEGACY if used else None, recorded=False)
    try:
        data = json.loads(text)
        number = data["format"]
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise ValueError(f"format {number!r} is not a positive integer")
    except (ValueError, KeyError, TypeError) as e:
        raise DataDirFormatError(
            f"{path} cannot be read ({e}); it must hold {{\"format\": N, \"written_by\": \"...\"}}: restore it "
            f"from a backup, or delete it if {data_dir} was written by this release (it is then stamped again)"
        ) from None
    return FormatState(data_dir, number, recorded=True, written_by=str(data.get("written_by") or "") or None)


def check(data_dir: Path) -> FormatState:
    """Refuse a data dir this release cannot read as it is (newer, or older and in need of ``dpr migrate``)."""
    state = read_format(data_dir)
    if state.format is None or state.format == CURRENT:
        return state
    by = f" by {state.written_by}" if state.written_by else ""
    if state.format > CURRENT:
        raise DataDirFormatError(
            f"data dir {data_dir} has format {state.format} (written{by}); this {dpr_version()} reads format "
            f"{CURRENT} and older: upgrade dpr to the release that wrote it, or restore a snapshot made by this "
            "release into a new data dir"
        )
    if state.format not in OPENS_AS_IS:
        raise DataDirFormatError(
            f"data dir {data_dir} has format {state.format} (written{by}); this {dpr_version()} needs format "
            f"{CURRENT}: run `dpr --data-dir {data_dir} migrate` (take a snapshot or copy first)"
        )
    return state


def stamp(data_dir: Path) -> None:
    """Record ``CURRENT`` on the first write into a data dir without a FORMAT file (new, or format 1 from before
    the file existed); a no-op when it is recorded. Call ``check`` first. Best effort on a read-only data dir."""
    if (data_dir / FORMAT_FILE).is_file():
        return
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(data_dir / FORMAT_FILE, _format_text(CURRENT))
    except OSError as e:
        log.warning("cannot record the data dir format", extra={"data_dir": str(data_dir), "error": str(e)})


def ensure_writable(data_dir: Path) -> FormatState:
    """``check``, then ``stamp``: what a process does before its first write into ``data_dir``."""
    state = check(data_dir)
    stamp(data_dir)
    return state


def migrate(data_dir: Path) -> dict[str, Any]:
    """Bring ``data_dir`` to ``CURRENT``: each step of ``MIGRATIONS`` from its format on, then the FORMAT stamp.

    A dir without FORMAT is format 1 and is only stamped. A newer dir is refused (``check``'s message). The steps run
    on a copy beside the data dir, which replaces it at the end: a migration that fails (or is killed) leaves the data
    dir as it was."""
    state = read_format(data_dir)
    if state.format is None:
        raise DataDirFormatError(
            f"{data_dir} is not a data dir (it holds none of {', '.join(CONTENT)}); check --data-dir / DPR_DATA_DIR"
        )
    if state.format > CURRENT:
        check(data_dir)  # raises with the message that names the version and the fix
    missing = next((n for n in range(state.format, CURRENT) if n not in MIGRATIONS), None)
    if missing is not None:
        raise DataDirFormatError(
            f"no migration from data dir format {missing} to {missing + 1} in this {dpr_version()}; migrate with "
            "the release after the one that wrote it first"
        )
    steps = [f"{n} -> {n + 1}" for n in range(state.format, CURRENT)]
    if steps:
        with built_beside(data_dir, f"migrating {data_dir}") as build:
            from services.core import diskspace  # a migration only: dpr query never loads it

            diskspace.require(build, 0, "migrating the data dir", need_bytes=allocated_bytes(data_dir))
            copy = build / "data"
            copy_tree_sparse(data_dir, copy)
            for number in range(state.format, CURRENT):
                log.info("migrating the data dir", extra={"data_dir": str(data_dir), "from": number})
                MIGRATIONS[number](copy)
            write_atomic(copy / FORMAT_FILE, _format_text(CURRENT))
            os.replace(data_dir, build / "old")
            try:
                os.replace(copy, data_dir)
            except BaseException:
                os.replace(build / "old", data_dir)
                raise
            fsync_path(data_dir.parent)
    elif not state.recorded:
        write_atomic(data_dir / FORMAT_FILE, _format_text(CURRENT))
        steps.append("stamped")
    return {"data_dir": str(data_dir), "from": state.format, "to": CURRENT, "recorded_before": state.recorded,
            "steps": steps, "written_by": dpr_version()}


def _format_text(number: int) -> str:
    return json.dumps({"format": number, "written_by": dpr_version()}) + "\n"
