"""What the readers yield for ingest: a ``Document``, a ``DocumentFailure`` (one bad input, with the reason and
the fix) or a ``Skipped`` file; and the ``IdLedger`` that refuses a second document under an id already read.
Training and evaluation data are ``encoders.data`` records instead.

Every string in a record is valid Unicode (a path that is not valid UTF-8 is shown by ``safe_text``), so a record
always serialises to JSON and into the store."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from services.core.errors import DocumentError


@dataclass(frozen=True)
class Section:
    """One piece of a document with its place: the page (range) of a paged format, the heading path of the others.
    Readers of structured formats yield a document as its sections; chunks never mix two sections' places."""

    text: str
    heading: tuple[str, ...] = ()  # heading path, outermost first: ("Installing", "On Windows")
    page: int | None = None  # 1-based first page, paged formats only
    page_end: int | None = None  # last page when the section runs over several; None: the same as ``page``

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"text": self.text}
        if self.heading:
            out["heading"] = list(self.heading)
        if self.page is not None:
            out["page"] = self.page
        if self.page_end is not None:
            out["page_end"] = self.page_end
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Section:
        page, page_end = data.get("page"), data.get("page_end")
        return cls(
            text=str(data["text"]),
            heading=tuple(str(h) for h in data.get("heading") or ()),
            page=int(page) if page is not None else None,
            page_end=int(page_end) if page_end is not None else None,
        )


SECTION_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Document:
    """A document to ingest. ``text`` is always the whole text; a structured reader also gives ``sections`` (their
    texts joined by ``SECTION_SEPARATOR`` are ``text``) and the ``format`` it read (``pdf``, ``docx``, ``md``...)."""

    doc_id: str
    text: str
    title: str = ""
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    sections: tuple[Section, ...] = ()
    format: str = ""

    @classmethod
    def from_sections(cls, doc_id: str, sections: list[Section], **kwargs: Any) -> Document:
        """A document whose text is its sections' texts joined (empty sections dropped)."""
        kept = tuple(s for s in sections if s.text.strip())
        return cls(doc_id=doc_id, text=SECTION_SEPARATOR.join(s.text for s in kept), sections=kept, **kwargs)

    @property
    def doc_hash(self) -> str:
        """Hash of everything that shapes the stored passages (title, text, places and metadata)."""
        h = hashlib.sha256()
        h.update(self.title.encode("utf-8"))
        h.update(b"\x1f")
        h.update(self.text.encode("utf-8"))
        h.update(b"\x1f")
        h.update(json.dumps(self.metadata, sort_keys=True, default=str).encode("utf-8"))
        if self.sections or self.format:  # documents without structure keep the hash they always had
            h.update(b"\x1f")
            places = [[list(s.heading), s.page, s.page_end, len(s.text)] for s in self.sections]
            h.update(json.dumps([self.format, places]).encode("utf-8"))
        return h.hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "doc_id": self.doc_id,
            "title": self.title,
            "text": self.text,
            "source": self.source,
            "metadata": self.metadata,
        }
        if self.sections:
            out["sections"] = [s.to_json() for s in self.sections]
        if self.format:
            out["format"] = self.format
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Document:
        return cls(
            doc_id=str(data["doc_id"]),
            text=str(data["text"]),
            title=str(data.get("title") or ""),
            source=str(data.get("source") or ""),
            metadata=dict(data.get("metadata") or {}),
            sections=tuple(Section.from_json(s) for s in data.get("sections") or ()),
            format=str(data.get("format") or ""),
        )


@dataclass(frozen=True)
class DocumentFailure:
    source: str  # the file, or ``file:line`` for a row
    reason: str  # unreadable | binary | empty | encoding | oversized | invalid_json | invalid_unicode | corrupt | ...
    error: str
    doc_id: str = ""  # the row's id, when it was read before the row failed

    def to_json(self) -> dict[str, str]:
        out = {"source": self.source, "reason": self.reason, "error": self.error}
        if self.doc_id:
            out["doc_id"] = self.doc_id
        return out

    @classmethod
    def from_error(cls, e: DocumentError, doc_id: str = "") -> DocumentFailure:
        return cls(source=e.source, reason=e.reason, error=str(e), doc_id=doc_id)


@dataclass(frozen=True)
class Skipped:
    source: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "reason": self.reason}


Item = Document | DocumentFailure | Skipped


def safe_text(value: str) -> str:
    """``value`` as valid Unicode: bytes a file name smuggles in as surrogate escapes (a name that is not UTF-8)
    are written ``\\xe9``, any other lone surrogate ``\\ud800``. Valid text comes back unchanged."""
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


class IdLedger:
    """The ids one run has read, and where, so a second document under a taken id fails (``duplicate_id``) instead
    of silently replacing the first. Memory grows with the number of documents read (one dict entry: the id and
    one int, ~100 bytes plus the id); sources are kept once each."""

    def __init__(self) -> None:
        self._where: dict[str, int] = {}
        self._sources: list[str] = []
        self._source_index: dict[str, int] = {}

    def claim(self, doc_id: str, source: str, line: int = 0) -> str | None:
        """Take ``doc_id`` for ``source`` (and ``line``); if it was taken already, where it was (nothing changes)."""
        seen = self._where.get(doc_id)
        if seen is not None:
            where = self._sources[seen >> 32]
            return f"{where}:{seen & 0xFFFFFFFF}" if seen & 0xFFFFFFFF else where
        index = self._source_index.get(source)
        if index is None:
            index = self._source_index[source] = len(self._sources)
            self._sources.append(source)
        self._where[doc_id] = (index << 32) | (line & 0xFFFFFFFF)
        return None

    def __len__(self) -> int:
        return len(self._where)


def duplicate(doc_id: str, source: str, first: str) -> DocumentFailure:
    """The failure of a document whose id ``first`` already holds (the first one read is kept)."""
    return DocumentFailure(
        source,
        "duplicate_id",
        f"{source}: id {doc_id!r} was already read at {first}; ids must be unique in one input (7 and \"7\" are "
        "the same id): give this document its own id or remove one of the two",
        doc_id=doc_id,
    )
