"""The reader layer: files, folders, JSONL and BEIR corpora for ingest (one module for now)."""

from __future__ import annotations

from services.readers.files import (
    Document,
    DocumentFailure,
    InputFormat,
    Item,
    Skipped,
    decode_text,
    detect_format,
    guess_title,
    html_to_text,
    iter_documents,
    parse_json_row,
)

__all__ = [
    "Document",
    "DocumentFailure",
    "InputFormat",
    "Item",
    "Skipped",
    "decode_text",
    "detect_format",
    "guess_title",
    "html_to_text",
    "iter_documents",
    "parse_json_row",
]
