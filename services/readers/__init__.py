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
from services.readers.beir import load_beir, load_corpus
from services.readers.files import guess_title, html_to_text
from services.readers.jsonl import MAX_ID_CHARS, parse_json_row
from services.readers.labelled import load_pairs_jsonl
from services.readers.records import Document, DocumentFailure, IdLedger, Item, Section, Skipped
from services.readers.sniff import sniff
from services.readers.sources import (
    DatasetFormat,
    dataset_format,
    detect_format,
    iter_documents,
    load_dataset,
    load_dev_split,
)
from services.readers.squad import load_squad, squad_article_split

__all__ = [
    "MAX_ID_CHARS",
    "DataError",
    "DatasetFormat",
    "Document",
    "DocumentFailure",
    "IdLedger",
    "Item",
    "Skipped",
    "Section",
    "dataset_format",
    "detect_format",
    "guess_title",
    "html_to_text",
    "iter_documents",
    "load_beir",
    "load_corpus",
    "load_dataset",
    "load_dev_split",
    "load_pairs_jsonl",
    "load_squad",
    "parse_json_row",
    "sniff",
    "squad_article_split",
]
