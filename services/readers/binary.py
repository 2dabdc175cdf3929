"""One binary document (PDF, DOCX, PPTX, ODT, EPUB) -> its ``Document`` and what could not be read.

The kind comes from the bytes (``services.readers.sniff``); the parsing runs in the parser sandbox
(``services.readers.sandbox``). What comes out:
- the ``Document`` (``format`` = the kind; sections with their page or heading path; metadata ``pages`` and, when
  some were lost, ``pages_failed`` / ``pages_skipped`` counts), and after it, when part of the document was not
  read, a ``DocumentFailure`` for that part (``pages_failed``: damaged pages; ``too_many_pages``: over the cap),
  so the user sees it while the pages that read are searchable;
- or one ``DocumentFailure`` for the whole document (``encrypted``, ``corrupt``, ``no_text_layer``, ``zip_bomb``,
  ``timeout``, ``parser_crashed``, ``too_large``, ``oversized``, ``empty``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from services.core.settings import DocumentSettings
from services.readers.files import oversized
from services.readers.records import Document, DocumentFailure, Item, safe_text
from services.readers.sandbox import ParserSandbox, shared_sandbox
from services.readers.sniff import READ_KINDS

KIND_NAMES = {"pdf": "PDF", "docx": "DOCX", "pptx": "PPTX", "odt": "ODT", "epub": "EPUB"}
BINARY_SUFFIXES = (".pdf", ".docx", ".pptx", ".odt", ".epub")


def read_binary(
    path: Path, kind: str, doc_id: str, max_bytes: int, limits: DocumentSettings | None = None,
    sandbox: ParserSandbox | None = None,
) -> Iterator[Item]:
    """``path`` read as ``kind`` (one of ``READ_KINDS``); never raises for the document's sake."""
    limits = limits or DocumentSettings()
    source = safe_text(str(path))
    name = KIND_NAMES.get(kind, kind)
    if kind not in READ_KINDS:  # pragma: no cover - the dispatch sends only these
        yield DocumentFailure(source, "unsupported", f"{source}: {kind} is not read", doc_id=doc_id)
        return
    try:
        size = path.stat().st_size
    except OSError as e:
        yield DocumentFailure(source, "unreadable", f"{source}: cannot be read ({e.strerror or e}); check its "
                              "permissions", doc_id=doc_id)
        return
    if size > limits.max_file_bytes:
        yield DocumentFailure(source, "oversized", f"{source}: {size:,} bytes is over the {limits.max_file_bytes:,}"
                              f"-byte limit for a {name} file; split it or raise DPR_DOCUMENTS__MAX_FILE_BYTES",
                              doc_id=doc_id)
        return
    parsed = (sandbox or shared_sandbox(limits)).parse(kind, path)
    if parsed.failed:
        yield DocumentFailure(source, parsed.reason, f"{source}: {parsed.message}", doc_id=doc_id)
        return
    info = parsed.info
    text_bytes = sum(len(s.text.encode("utf-8", "surrogatepass")) + 2 for s in parsed.sections)
    if text_bytes > max_bytes:
        too_big = oversized(source, text_bytes, max_bytes)
        yield DocumentFailure(source, too_big.reason, f"{too_big} (the text extracted from this {name})",
                              doc_id=doc_id)
        return
    metadata: dict[str, int | bool] = {}
    if info.pages_total:
        metadata["pages"] = info.pages_total
    if info.pages_failed:
        metadata["pages_failed"] = len(info.pages_failed)
    if info.pages_skipped:
        metadata["pages_skipped"] = info.pages_skipped
    if info.metadata.get("salvaged"):
        metadata["salvaged"] = True
    if info.metadata.get("pages_ocr"):
        metadata["pages_ocr"] = int(info.metadata["pages_ocr"])
    title = safe_text(info.title) or path.name.split(".")[0].replace("_", " ").replace("-", " ").strip()
    doc = Document.from_sections(doc_id, parsed.sections, title=title, source=source, format=kind,
                                 metadata=metadata)
    unit = "slides" if kind == "pptx" else "pages"
    if not doc.text.strip():
        why = (f" ({len(info.pages_failed)} of its {info.pages_total} {unit} could not be read)"
               if info.pages_failed else "")
        yield DocumentFailure(source, "corrupt" if info.pages_failed else "empty",
                              f"{source}: has no text{why}; check the file opens, or remove it", doc_id=doc_id)
        return
    yield doc
    if info.pages_failed:
        shown = ", ".join(str(p) for p in info.pages_failed[:10]) + (", ..." if len(info.pages_failed) > 10 else "")
        yield DocumentFailure(
            source, "pages_failed",
            f"{source}: {len(info.pages_failed)} of {info.pages_total} {unit} could not be read (damaged: {shown}); "
            f"the other {info.pages_total - len(info.pages_failed) - info.pages_skipped} were ingested; repair the "
            "file (for a PDF: `qpdf in.pdf out.pdf`) or re-create it and ingest it again", doc_id=doc_id)
    if info.metadata.get("salvaged"):
        yield DocumentFailure(
            source, "damaged",
            f"{source}: is damaged (truncated, or its cross-reference table is lost); {info.pages_total:,} pages "
            "were recovered and ingested, any others are lost; re-download or re-create it and ingest it again",
            doc_id=doc_id)
    if info.pages_skipped:
        yield DocumentFailure(
            source, "too_many_pages",
            f"{source}: has {info.pages_total:,} {unit}; only the first {limits.max_pages:,} were read "
            f"(DPR_DOCUMENTS__MAX_PAGES); raise it or split the file", doc_id=doc_id)
