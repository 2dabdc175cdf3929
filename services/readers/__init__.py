"""The one reader layer: files, folders, JSONL, BEIR and SQuAD, for ingest, training and evaluation alike.

- ``records``: what ingest reads (``Document``, ``DocumentFailure``, ``Skipped``).
- ``files``: files and folders (text, Markdown, reST, HTML), and the gzip-aware text opener.
- ``jsonl``: JSONL rows, with one rule for ids and empty text whoever reads them.
- ``beir``, ``squad``, ``labelled``: data sets and training pairs -> ``encoders.data`` records.
- ``sources``: what a path holds and the one entry to read it (``iter_documents``, ``load_dataset``).
"""

from __future__ import annotations

from services.errors import DataError
from services.readers.beir import beir_corpus_path, load_beir, load_corpus, load_qrels, load_queries
from services.readers.files import TEXT_SUFFIXES, decode_text, guess_title, html_to_text, iter_files, read_file
from services.readers.jsonl import MAX_ID_CHARS, Row, iter_jsonl, parse_json_row, read_row, read_rows
from services.readers.labelled import load_pairs_jsonl
from services.readers.records import Document, DocumentFailure, Item, Skipped
from services.readers.sources import (
    DatasetFormat,
    InputFormat,
    dataset_format,
    detect_format,
    iter_documents,
    load_dataset,
)
from services.readers.squad import SquadSplit, load_squad, squad_article_split

__all__ = [
    "MAX_ID_CHARS",
    "TEXT_SUFFIXES",
    "DataError",
    "DatasetFormat",
    "Document",
    "DocumentFailure",
    "InputFormat",
    "Item",
    "Row",
    "Skipped",
    "SquadSplit",
    "beir_corpus_path",
    "dataset_format",
    "decode_text",
    "detect_format",
    "guess_title",
    "html_to_text",
    "iter_documents",
    "iter_files",
    "iter_jsonl",
    "load_beir",
    "load_corpus",
    "load_dataset",
    "load_pairs_jsonl",
    "load_qrels",
    "load_queries",
    "load_squad",
    "parse_json_row",
    "read_file",
    "read_row",
    "read_rows",
    "squad_article_split",
]
