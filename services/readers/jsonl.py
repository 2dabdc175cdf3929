"""JSONL rows: one rule for every reader (ingest, BEIR corpora and queries, training corpora).

- A row is a JSON object on one line; blank lines are ignored.
- Id: ``"id"``, else ``"_id"``; a string or an integer (``7`` and ``"7"`` are the same id); not blank, at most
  ``MAX_ID_CHARS`` characters.
- Text: ``"text"`` must be a string. A row whose text is blank is *empty*: it has nothing to embed, so ingest
  fails it (reason ``empty``); a BEIR corpus keeps it, because judgments may name it (Cranfield has two).
- Title: optional; a scalar is turned into a string.
- Every string kept (id, text, title, metadata keys and values) must be valid Unicode: a lone surrogate escape
  (``"\\ud800"``) fails the row (reason ``invalid_unicode``).
- Ingest only: a row with a title and a blank text is its title (searchable text, as BEIR reads it); a row with
  neither is *empty*. Text or a title holding NUL (``"\\u0000"``) is ``binary``, as a file holding NUL bytes is.
  A row is at most ``DPR_MAX_DOCUMENT_BYTES`` UTF-8 bytes, read with at most that much buffered (a longer line is
  read past, never held); an id already read in the run fails as ``duplicate_id`` naming both lines.

Two ways to meet a bad row: ingest yields a ``DocumentFailure`` and goes on (``iter_jsonl``); training and
evaluation data refuse the whole file with a ``DataError`` naming the file, the line and the fix (``read_rows``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from services.core.errors import DataError, DocumentError
from services.readers.files import oversized
from services.readers.lines import CORRUPT, Line, bounded_lines, open_bytes, wide_encoding
from services.readers.records import Document, DocumentFailure, IdLedger, Item, duplicate, safe_text

MAX_ID_CHARS = 512
RECORD_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")
_SCALAR = (str, int, float, bool)

T = TypeVar("T")
V = TypeVar("V")


@dataclass(frozen=True)
class Row:
    """The fields every JSONL reader takes from a row; ``metadata``: the other scalar fields."""

    doc_id: str
    text: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.text.strip()


def parse_object(line: str, source: str) -> dict[str, Any]:
    """One line -> a JSON object, or ``DocumentError`` (reason ``invalid_json``)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DocumentError(
            source, "invalid_json", f"is not valid JSON ({e.msg}, column {e.colno}); one JSON object per line"
        ) from e
    except RecursionError as e:  # json's decoder recurses per level: a row nested thousands deep fails alone
        raise DocumentError(
            source, "invalid_json", "nests its JSON values too deeply to read (thousands of levels of objects or "
            "arrays); flatten the row (metadata values are scalars)"
        ) from e
    if not isinstance(obj, dict):
        raise DocumentError(
            source, "invalid_json", f"is not a JSON object (got {type(obj).__name__}); one JSON object per line"
        )
    return obj


def row_id(obj: dict[str, Any], source: str, keys: tuple[str, ...] = ("id", "_id")) -> str:
    """The row's id under the first of ``keys`` present: a string or an integer, as a string."""
    key = next((k for k in keys if obj.get(k) is not None), None)
    if key is None:
        names = " or ".join(repr(k) for k in keys)
        raise DocumentError(source, "missing_field", f"has no {names}; give every row a unique id")
    raw = obj[key]
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise DocumentError(source, "invalid_id", f"{key!r} must be a string or an integer, got {type(raw).__name__}")
    value = str(raw)
    if not value.strip():
        raise DocumentError(source, "missing_field", f"has a blank {key!r}; give every row a unique id")
    if len(value) > MAX_ID_CHARS:
        raise DocumentError(source, "invalid_id", f"{key!r} is longer than {MAX_ID_CHARS} characters; shorten it")
    return value


def read_row(obj: dict[str, Any], source: str) -> Row:
    """The one rule for a document row (see the module docstring); ``DocumentError`` names what is wrong."""
    doc_id = row_id(obj, source)
    if "text" not in obj:
        raise DocumentError(source, "missing_field", "missing field 'text'; add the document text")
    text = obj["text"]
    if not isinstance(text, str):
        raise DocumentError(source, "missing_field", f"field 'text' must be a string, got {type(text).__name__}")
    title = obj.get("title")
    title = "" if title is None else title if isinstance(title, str) else str(title)
    metadata = {
        k: v for k, v in obj.items() if k not in {"id", "_id", "text", "title", "metadata"} and isinstance(v, _SCALAR)
    }
    if isinstance(obj.get("metadata"), dict):
        metadata.update({k: v for k, v in obj["metadata"].items() if isinstance(v, _SCALAR)})
    for name, kept in (("id", doc_id), ("text", text), ("title", title)):
        _check_unicode(source, name, kept)
    for key, meta in metadata.items():
        _check_unicode(source, "a metadata key", key)
        if isinstance(meta, str):
            _check_unicode(source, f"metadata {safe_text(key)!r}", meta)
    return Row(doc_id=doc_id, text=text, title=title, metadata=metadata)


def _check_unicode(source: str, name: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = value[e.start].encode("utf-8", "backslashreplace").decode("ascii")
        raise DocumentError(
            source,
            "invalid_unicode",
            f"{name} holds a lone surrogate ({bad} at character {e.start}); a \\u escape of a character outside "
            "the BMP needs both halves of its pair: fix the escape",
        ) from e


def parse_json_row(line: str, source: str, max_bytes: int, source_name: str = "") -> Document:
    """One JSONL line -> a ``Document`` to ingest, or ``DocumentError`` (see the module docstring)."""
    size = len(line.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise oversized(source, size, max_bytes)
    return row_document(parse_object(line, source), source, source_name or source)


def row_document(obj: dict[str, Any], source: str, source_name: str) -> Document:
    """A parsed row -> a ``Document`` to ingest (title-only rows are their title), or ``DocumentError``."""
    row = read_row(obj, source)
    for name, value in (("id", row.doc_id), ("text", row.text), ("title", row.title)):
        if "\x00" in value:
            raise DocumentError(source, "binary", f"{name} holds NUL characters (\\u0000); remove them")
    text = row.title if row.empty else row.text
    if not text.strip():
        raise DocumentError(source, "empty", "has an empty 'text' and no title; remove the row or add content")
    return Document(doc_id=row.doc_id, text=text, title=row.title, source=source_name, metadata=row.metadata)


def iter_jsonl(path: Path, max_bytes: int, ledger: IdLedger) -> Iterator[Item]:
    """Ingest: a ``Document`` or a ``DocumentFailure`` per row, streaming; nothing accumulates but ``ledger``'s ids.
    A file that cannot be opened is one failure; a compressed body that breaks is one failure naming the line
    where it broke, after the rows before it."""
    name = safe_text(str(path))
    number = 0
    try:
        with open_bytes(path) as f:
            for line in bounded_lines(f, max_bytes):
                number = line.number
                if number == 1 and line.data is not None and wide_encoding(line.data[:4]):
                    yield DocumentFailure(name, "encoding", f"{name}: is UTF-16 or UTF-32; re-encode it as UTF-8")
                    return
                item = _row_item(line, name, max_bytes, ledger)
                if item is not None:
                    yield item
    except CORRUPT as e:
        yield DocumentFailure(
            f"{name}:{number + 1}", "corrupt",
            f"{name}: the compressed data breaks after line {number:,} ({e}); the {number:,} lines before it were "
            "read; re-create or re-download the file",
        )
    except OSError as e:
        yield DocumentFailure(name, "unreadable", f"{name}: cannot be read ({e.strerror or e}); check the file")


def _row_item(line: Line, name: str, max_bytes: int, ledger: IdLedger) -> Item | None:
    """One line -> its item (None for a blank line); a duplicate id fails the later row."""
    source = f"{name}:{line.number}"
    if line.data is None:
        return DocumentFailure.from_error(oversized(source, line.size, max_bytes))
    try:
        text = line.data.decode("utf-8-sig" if line.number == 1 else "utf-8")
    except UnicodeDecodeError as e:
        return DocumentFailure(source, "encoding", f"{source}: is not valid UTF-8 (byte {e.start + 1} of the line: "
                               f"{line.data[e.start:e.start + 1]!r}); re-encode the file as UTF-8")
    if not text.strip():
        return None
    try:
        obj = parse_object(text, source)
    except DocumentError as e:
        return DocumentFailure.from_error(e)
    try:
        doc = row_document(obj, source, name)
    except DocumentError as e:
        raw = next((obj[k] for k in ("id", "_id") if isinstance(obj.get(k), str | int)), "")
        return DocumentFailure.from_error(e, doc_id=safe_text(str(raw))[:MAX_ID_CHARS])
    first = ledger.claim(doc.doc_id, name, line.number)
    return doc if first is None else duplicate(doc.doc_id, source, first)


# The longest row training and evaluation data may have (the ingest's default document limit): a longer one, or a
# decompression bomb of one endless line, refuses the file after at most this much is held in memory.
MAX_ROW_BYTES = 20_000_000


def iter_objects(path: Path, max_bytes: int = MAX_ROW_BYTES) -> Iterator[tuple[str, dict[str, Any]]]:
    """Training and evaluation data: (``path:line``, object) per row; any bad line refuses the file (DataError),
    and so does a line over ``max_bytes`` (read past in pieces, never held whole)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with open_bytes(path) as f:
            for line in bounded_lines(f, max_bytes):
                source = f"{path}:{line.number}"
                if line.data is None:
                    raise DataError(f"{source}: a line of {line.size:,} bytes, over the {max_bytes:,}-byte limit "
                                    "for one row; split the record or drop it")
                text = line.data.decode("utf-8")
                if text.strip():
                    yield source, strict(parse_object, text, source)
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason}); re-encode the file as UTF-8") from e
    except (OSError, EOFError, *CORRUPT) as e:
        raise DataError(f"{path}: cannot read ({e}); check the file is complete and, if .gz, valid gzip") from e


def read_rows(path: Path) -> Iterator[Row]:
    """Training and evaluation data: every row of ``path`` by the one rule; a bad row refuses the file."""
    for source, obj in iter_objects(path):
        yield strict(read_row, obj, source)


def strict(parse: Callable[[V, str], T], value: V, source: str) -> T:
    """``parse(value, source)`` with a ``DocumentError`` turned into a ``DataError`` (same message)."""
    try:
        return parse(value, source)
    except DocumentError as e:
        raise DataError(str(e)) from e
