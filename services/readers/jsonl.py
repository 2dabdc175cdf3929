"""JSONL rows: one rule for every reader (ingest, BEIR corpora and queries, training corpora).

- A row is a JSON object on one line; blank lines are ignored.
- Id: ``"id"``, else ``"_id"``; a string or an integer (``7`` and ``"7"`` are the same id); not blank, at most
  ``MAX_ID_CHARS`` characters.
- Text: ``"text"`` must be a string. A row whose text is blank is *empty*: it has nothing to embed, so ingest
  fails it (reason ``empty``); a BEIR corpus keeps it, because judgments may name it (Cranfield has two).
- Title: optional; a scalar is turned into a string.

Two ways to meet a bad row: ingest yields a ``DocumentFailure`` and goes on (``iter_jsonl``); training and
evaluation data refuse the whole file with a ``DataError`` naming the file, the line and the fix (``read_rows``).
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from services.errors import DataError, DocumentError
from services.readers.files import open_text
from services.readers.records import Document, DocumentFailure, Item

log = logging.getLogger(__name__)

MAX_ID_CHARS = 512
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
    return Row(doc_id=doc_id, text=text, title=title, metadata=metadata)


def parse_json_row(line: str, source: str, max_bytes: int, source_name: str = "") -> Document:
    """One JSONL line -> a ``Document`` to ingest, or ``DocumentError`` (an empty row fails: nothing to embed)."""
    if len(line) > max_bytes:
        raise DocumentError(source, "oversized", f"row is over the {max_bytes:,}-byte limit; split it")
    row = read_row(parse_object(line, source), source)
    if row.empty:
        raise DocumentError(source, "empty", "has an empty 'text'; remove the row or add content")
    return Document(
        doc_id=row.doc_id, text=row.text, title=row.title, source=source_name or source, metadata=row.metadata
    )


def iter_jsonl(path: Path, max_bytes: int) -> Iterator[Item]:
    """Ingest: a ``Document`` or a ``DocumentFailure`` per row; a file that cannot be read is one failure."""
    try:
        with open_text(path) as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    yield parse_json_row(line, f"{path}:{lineno}", max_bytes, source_name=str(path))
                except DocumentError as e:
                    yield DocumentFailure.from_error(e)
    except UnicodeDecodeError as e:
        yield DocumentFailure(str(path), "encoding", f"{path}: is not valid UTF-8; re-encode it as UTF-8")
        log.warning("stopped reading a JSONL file", extra={"source": str(path), "error": str(e)})
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        yield DocumentFailure(str(path), "unreadable", f"{path}: cannot be read ({e}); check the file")


def iter_objects(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Training and evaluation data: (``path:line``, object) per row; any bad line refuses the file (DataError)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        with open_text(path) as f:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    source = f"{path}:{lineno}"
                    yield source, strict(parse_object, line, source)
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason}); re-encode the file as UTF-8") from e
    except (OSError, EOFError) as e:
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
