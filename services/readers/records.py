"""What the readers yield for ingest: a ``Document``, a ``DocumentFailure`` (one bad input, with the reason and
the fix) or a ``Skipped`` file. Training and evaluation data are ``encoders.data`` records instead."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from services.errors import DocumentError


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str
    title: str = ""
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def doc_hash(self) -> str:
        """Hash of everything that shapes the stored passages (title and text)."""
        h = hashlib.sha256()
        h.update(self.title.encode("utf-8"))
        h.update(b"\x1f")
        h.update(self.text.encode("utf-8"))
        h.update(b"\x1f")
        h.update(json.dumps(self.metadata, sort_keys=True, default=str).encode("utf-8"))
        return h.hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "title": self.title,
            "text": self.text,
            "source": self.source,
            "metadata": self.metadata,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Document:
        return cls(
            doc_id=str(data["doc_id"]),
            text=str(data["text"]),
            title=str(data.get("title") or ""),
            source=str(data.get("source") or ""),
            metadata=dict(data.get("metadata") or {}),
        )


@dataclass(frozen=True)
class DocumentFailure:
    source: str
    reason: str  # unreadable | binary | empty | encoding | oversized | invalid_json | missing_field | ...
    error: str

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "reason": self.reason, "error": self.error}

    @classmethod
    def from_error(cls, e: DocumentError) -> DocumentFailure:
        return cls(source=e.source, reason=e.reason, error=str(e))


@dataclass(frozen=True)
class Skipped:
    source: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "reason": self.reason}


Item = Document | DocumentFailure | Skipped
