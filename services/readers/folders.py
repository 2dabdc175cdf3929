"""Folders -> every entry accounted for: a ``Document``, a ``DocumentFailure`` or a ``Skipped`` with the reason.

The walk is depth-first in name order (stable), iterative (any depth), and streams one folder listing at a time.
What each entry becomes:
- a text file (``TEXT_SUFFIXES``): one document, id = its path from the folder's parent (``docs/a.md``);
- a records file (``.jsonl``, ``.jsonl.gz``, ``.ndjson``): its rows, as for a single file;
- an archive: skipped, "extract it first"; any other file type: skipped, naming the types read;
- a hidden entry (name starts with ``.``): skipped, with a hidden folder skipped whole;
- a symbolic link: never followed, skipped naming its target (outside the folder: pass the target to read it;
  inside: it is read where it lives); a dangling link or a link loop is skipped as such;
- a FIFO, socket or device: skipped (never opened: a FIFO would block); a folder or file that cannot be read:
  a failure naming it.
Names that are not valid UTF-8 are read; their ids and sources show the stray bytes as ``\\xe9`` (``safe_text``),
so every record is valid Unicode. Ids are claimed in the run's ``IdLedger``: a second document under an id fails.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from services.errors import DocumentError
from services.readers.files import TEXT_SUFFIXES, read_file
from services.readers.jsonl import RECORD_SUFFIXES, iter_jsonl
from services.readers.records import DocumentFailure, IdLedger, Item, Skipped, duplicate, safe_text

log = logging.getLogger(__name__)

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".7z",
                    ".rar", ".gz", ".bz2", ".xz", ".zst")
_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"))


def id_prefix(root: Path) -> PurePosixPath:
    """What the ids of the documents read under ``root`` start with: its name (``docs`` -> ``docs/a.md``)."""
    try:
        return PurePosixPath(root.resolve().relative_to(root.parent.resolve()).as_posix())
    except ValueError:  # root is a link to a folder elsewhere: ids start at the name given
        return PurePosixPath(root.name)


def iter_files(root: Path, max_bytes: int, ledger: IdLedger | None = None) -> Iterator[Item]:
    """Every entry under ``root`` (or ``root`` itself). Doc id: path relative to root's parent, as spelled."""
    ledger = IdLedger() if ledger is None else ledger
    prefix = id_prefix(root)
    if not root.is_dir():
        yield from _entry(root, prefix, max_bytes, ledger, given=True)
        return
    real_root = root.resolve()
    stack: list[Iterator[tuple[Path, PurePosixPath] | DocumentFailure]] = [_listing(root, prefix)]
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            continue
        if isinstance(nxt, DocumentFailure):  # the folder could not be listed
            yield nxt
            continue
        path, rel = nxt
        item = _classify(path, real_root)
        if item == "dir":
            stack.append(_listing(path, rel))
        elif item == "file":
            yield from _entry(path, rel, max_bytes, ledger)
        elif isinstance(item, Skipped):
            yield item


def _listing(folder: Path, rel: PurePosixPath) -> Iterator[tuple[Path, PurePosixPath] | DocumentFailure]:
    """The folder's entries in name order; a folder that cannot be listed yields one failure instead."""
    try:
        with os.scandir(folder) as it:
            names = sorted(entry.name for entry in it)
    except OSError as e:
        source = safe_text(str(folder))
        yield DocumentFailure(
            source, "unreadable", f"{source}: cannot list this folder ({e.strerror or e}); check its permissions"
        )
        return
    for name in names:
        yield folder / name, rel / name


def _classify(path: Path, real_root: Path) -> str | Skipped:
    """``dir`` to descend, ``file`` to read, or the ``Skipped`` record of anything else."""
    source = safe_text(str(path))
    if path.name.startswith("."):
        return Skipped(source, "hidden (its name starts with '.'); pass it by name to read it")
    try:
        mode = os.lstat(path).st_mode
    except OSError as e:
        return Skipped(source, f"cannot be examined ({e.strerror or e}); check its permissions")
    if stat.S_ISLNK(mode):
        return _link(path, source, real_root)
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return _special(source, mode)


def _special(source: str, mode: int) -> Skipped:
    kind = next((name for test, name in _SPECIAL if test(mode)), "not a regular file")
    return Skipped(source, f"{kind}, not a regular file; only files and folders are read")


def _link(path: Path, source: str, real_root: Path) -> Skipped:
    """A symbolic link is never followed; the record says where it points and how to read that."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return Skipped(source, "a symbolic link loop; fix or remove the link")
        target = safe_text(os.readlink(path)) if os.path.islink(path) else "?"
        return Skipped(source, f"a dangling symbolic link (to {target}, which cannot be reached); fix or remove it")
    target_path = Path(os.path.realpath(path))
    target = safe_text(str(target_path))
    if not target_path.is_relative_to(real_root):
        return Skipped(source, f"a symbolic link outside the folder given (to {target}); not followed: to read it, "
                       "pass its target")
    return Skipped(source, f"a symbolic link to {target} inside the folder given; not followed: it is read there")


def _entry(path: Path, rel: PurePosixPath, max_bytes: int, ledger: IdLedger, given: bool = False) -> Iterator[Item]:
    """One file (a folder's entry, or a path given): its document, its rows, or why it is skipped."""
    source = safe_text(str(path))
    if given and not path.is_file():
        try:
            yield _special(source, os.stat(path).st_mode)
        except OSError as e:
            yield Skipped(source, f"cannot be examined ({e.strerror or e}); check the path")
        return
    name = path.name.lower()
    if name.endswith(RECORD_SUFFIXES):
        yield from iter_jsonl(path, max_bytes, ledger)
    elif name.endswith(tuple(TEXT_SUFFIXES)):
        doc_id = safe_text(rel.as_posix())
        try:
            doc = read_file(path, doc_id, max_bytes)
        except DocumentError as e:
            yield DocumentFailure.from_error(e, doc_id=doc_id)
            return
        first = ledger.claim(doc_id, source)
        yield doc if first is None else duplicate(doc_id, source, first)
    elif name.endswith(ARCHIVE_SUFFIXES):
        suffix = next(s for s in ARCHIVE_SUFFIXES if name.endswith(s))
        yield Skipped(source, f"an archive or compressed file ({suffix}), which is not read; extract it first and "
                      "pass the folder")
    else:
        suffix = Path(name).suffix or "(none)"
        yield Skipped(source, f"unsupported file type {suffix!r}; supported: {' '.join(sorted(TEXT_SUFFIXES))} "
                      f"and records {' '.join(RECORD_SUFFIXES)}")
