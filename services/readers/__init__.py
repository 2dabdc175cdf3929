"""The one reader layer: files, folders, JSONL, BEIR and SQuAD, for ingest, training and evaluation alike.

- ``records``: what ingest reads (``Document``, ``DocumentFailure``, ``Skipped``).
- ``files``: one text file (text, Markdown, reST, HTML), and the gzip-aware text opener; ``markdown``, ``rst`` and
  ``html`` read the markup into sections by heading path (``sections``: the section builders every reader shares).
- ``folders``: the folder walk (every entry a document, a failure or a skip with the reason).
- ``sniff``: a file's kind by its bytes; ``binary``: PDF, DOCX, PPTX, ODT, EPUB through ``sandbox`` (the parser's
  child process) and the readers behind ``protocol`` (``pdf``, ``docx``, ``pptx``, ``odt``, ``epub``).
- ``lines``: bounded line reading (a line over the limit is read past, never held).
- ``jsonl``: JSONL rows, with one rule for ids and empty text whoever reads them.
- ``beir``, ``squad``, ``labelled``: data sets and training pairs -> ``encoders.data`` records.
- ``sources``: what a path holds and the one entry to read it (``iter_documents``, ``load_dataset``).
"""

from __future__ import annotations

from services.core.errors import DataError
from services.readers.beir import beir_corpus_path, load_beir, load_corpus, load_qrels, load_queries
from services.readers.files import TEXT_SUFFIXES, decode_text, guess_title, html_to_text, read_file
from services.readers.folders import iter_files
from services.readers.jsonl import MAX_ID_CHARS, RECORD_SUFFIXES, Row, iter_jsonl, parse_json_row, read_row, read_rows
from services.readers.labelled import load_pairs_jsonl
from services.readers.records import Document, DocumentFailure, IdLedger, Item, Section, Skipped, safe_text
from services.readers.sandbox import ParserSandbox
from services.readers.sniff import sniff
from services.readers.sources import (
    DatasetFormat,
    InputFormat,
    dataset_format,
    detect_format,
    iter_documents,
    load_dataset,
    load_dev_split,
)
from services.readers.squad import SquadSplit, load_squad, squad_article_split

__all__ = [
    "MAX_ID_CHARS",
    "RECORD_SUFFIXES",
    "TEXT_SUFFIXES",
    "DataError",
    "DatasetFormat",
    "Document",
    "DocumentFailure",
    "IdLedger",
    "InputFormat",
    "Item",
    "ParserSandbox",
    "Row",
    "Skipped",
    "Section",
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
    "load_dev_split",
    "load_pairs_jsonl",
    "load_qrels",
    "load_queries",
    "load_squad",
    "parse_json_row",
    "read_file",
    "read_row",
    "read_rows",
    "safe_text",
    "sniff",
    "squad_article_split",
]
