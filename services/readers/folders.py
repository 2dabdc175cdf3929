"""Folders -> every entry accounted for: a ``Document``, a ``DocumentFailure`` or a ``Skipped`` with the reason.

The walk is depth-first in name order (stable), iterative (any depth), and streams one folder listing at a time.
What each entry becomes:
- a text file (``TEXT_SUFFIXES``): one document, id = its path from the folder's parent (``docs/a.md``);
- a PDF, DOCX, PPTX, ODT or EPUB, known by its CONTENT (``services.readers.sniff``), whatever its suffix: read in
  the parser sandbox (``services.readers.binary``); a file named like one of them that holds HTML is read as HTML,
  one that holds anything else fails (``mislabelled``), never reaching the wrong parser;
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
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from services.core.errors import DocumentError
from services.core.settings import DocumentSettings
from services.readers.binary import BINARY_SUFFIXES, read_binary
from services.readers.files import TEXT_SUFFIXES, decode_text, guess_title, html_to_text, read_file
from services.readers.filesig import FileRef
from services.readers.jsonl import RECORD_SUFFIXES, iter_jsonl
from services.readers.records import Document, DocumentFailure, IdLedger, Item, Skipped, duplicate, safe_text
from services.readers.sandbox import ParserSandbox
from services.readers.sniff import READ_KINDS, Kind, sniff

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


def iter_files(root: Path, max_bytes: int, ledger: IdLedger,
               limits: DocumentSettings | None = None, sandbox: ParserSandbox | None = None,
               defer_binary: bool = False) -> Iterator[Item]:
    """Every entry under ``root`` (or ``root`` itself). Doc id: path relative to root's parent, as spelled.
    Binary documents are parsed in ``sandbox`` (default: this process's shared one) within ``limits``; with
    ``defer_binary`` they are yielded unparsed as ``filesig.FileRef`` (parsed where the batch runs)."""
    prefix = id_prefix(root)
    read = _Reading(max_bytes, ledger, limits or DocumentSettings(), sandbox)
    read.defer_binary = defer_binary
    if not root.is_dir():
        yield from _entry(root, prefix, read, given=True)
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
            yield from _entry(path, rel, read)
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


class _Reading:
    """What every entry of one walk is read with."""

    def __init__(self, max_bytes: int, ledger: IdLedger, limits: DocumentSettings,
                 sandbox: ParserSandbox | None) -> None:
        self.max_bytes, self.ledger, self.limits, self.sandbox = max_bytes, ledger, limits, sandbox
        self.defer_binary = False


SUPPORTED = " ".join(sorted(TEXT_SUFFIXES | set(BINARY_SUFFIXES)))
_OTHER_KINDS = {
    "xlsx": "a spreadsheet (XLSX), which is not read; export the sheets as CSV or text",
    "ods": "a spreadsheet (ODS), which is not read; export the sheets as CSV or text",
    "odp": "a presentation (ODP), which is not read; save it as PPTX or PDF",
    "ole": "a legacy Office file (.doc/.ppt/.xls), which is not read; save it as DOCX, PPTX or PDF",
}


def _entry(path: Path, rel: PurePosixPath, read: _Reading, given: bool = False) -> Iterator[Item]:
    """One file (a folder's entry, or a path given): its document, its rows, or why it is skipped. Records and
    archives are known by name; everything else by its content first."""
    source = safe_text(str(path))
    if given and not path.is_file():
        try:
            yield _special(source, os.stat(path).st_mode)
        except OSError as e:
            yield Skipped(source, f"cannot be examined ({e.strerror or e}); check the path")
        return
    name = path.name.lower()
    suffix = Path(name).suffix
    doc_id = safe_text(rel.as_posix())
    if name.endswith(RECORD_SUFFIXES):
        yield from iter_jsonl(path, read.max_bytes, read.ledger)
        return
    if name.endswith(ARCHIVE_SUFFIXES):
        suffix = next(s for s in ARCHIVE_SUFFIXES if name.endswith(s))
        yield Skipped(source, f"an archive or compressed file ({suffix}), which is not read; extract it first and "
                      "pass the folder")
        return
    try:
        kind: Kind = sniff(path)
    except OSError as e:
        yield DocumentFailure(source, "unreadable", f"{source}: cannot be read ({e.strerror or e}); check its "
                              "permissions", doc_id=doc_id)
        return
    if kind in READ_KINDS and read.defer_binary:  # parsed where its batch runs (services.ingest)
        try:
            yield _claimed(FileRef.of(path, kind, doc_id), read.ledger, source)
        except OSError as e:
            yield DocumentFailure(source, "unreadable", f"{source}: cannot be read ({e.strerror or e}); check its "
                                  "permissions", doc_id=doc_id)
    elif kind in READ_KINDS:
        for item in read_binary(path, kind, doc_id, read.max_bytes, read.limits, read.sandbox):
            yield _claimed(item, read.ledger, source)
    elif suffix in TEXT_SUFFIXES:
        if kind == "html" and suffix not in (".html", ".htm"):
            yield _claimed(_read_html(path, doc_id, read.max_bytes), read.ledger, source)
        else:
            try:
                doc = read_file(path, doc_id, read.max_bytes)
            except DocumentError as e:
                yield DocumentFailure.from_error(e, doc_id=doc_id)
                return
            yield _claimed(doc, read.ledger, source)
    elif suffix in BINARY_SUFFIXES:
        if kind == "html":  # a web page saved under a document's name: read as what it is
            yield _claimed(_read_html(path, doc_id, read.max_bytes), read.ledger, source)
        else:
            what = {"text": "plain text", "binary": "binary data"}.get(kind, kind.upper())
            yield DocumentFailure(source, "mislabelled", f"{source}: is named {suffix} but holds {what}, not a "
                                  f"{suffix[1:].upper()}; re-download it, or rename it to what it is", doc_id=doc_id)
    elif kind in _OTHER_KINDS:
        yield Skipped(source, _OTHER_KINDS[kind])
    else:
        yield Skipped(source, f"unsupported file type {suffix or '(none)'!r}; supported: {SUPPORTED} (PDF, DOCX, "
                      f"PPTX, ODT and EPUB known by content) and records {' '.join(RECORD_SUFFIXES)}")


def _claimed(item: Item, ledger: IdLedger, source: str) -> Item:
    """A document claims its id in the run's ledger; a second document under a taken id fails."""
    if not isinstance(item, Document):
        return item
    first = ledger.claim(item.doc_id, source)
    return item if first is None else duplicate(item.doc_id, source, first)


def _read_html(path: Path, doc_id: str, max_bytes: int) -> Item:
    """A file whose bytes are HTML whatever its name says (``guide.pdf`` saved from a browser)."""
    source = safe_text(str(path))
    try:
        size = path.stat().st_size
        if size > max_bytes:
            return DocumentFailure(source, "oversized", f"{source}: {size:,} bytes is over the {max_bytes:,}-byte "
                                   "limit; split the document or raise DPR_MAX_DOCUMENT_BYTES", doc_id=doc_id)
        text = decode_text(source, path.read_bytes(), max_bytes)
    except DocumentError as e:
        return DocumentFailure.from_error(e, doc_id=doc_id)
    except OSError as e:
        return DocumentFailure(source, "unreadable", f"{source}: cannot be read ({e.strerror or e}); check its "
                               "permissions", doc_id=doc_id)
    title, body = html_to_text(text)
    if not body and not title:
        return DocumentFailure(source, "empty", f"{source}: holds HTML with no visible text; remove it",
                               doc_id=doc_id)
    return Document(doc_id=doc_id, text=body or title, title=safe_text(title or guess_title(path, "")),
                    source=source, format="html", metadata={"named_as": path.suffix.lower()})
