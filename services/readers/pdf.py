"""PDF -> one section per page (``page`` 1-based), under the heading path the outline (bookmarks) gives that page.

Parser: pypdfium2 (PDFium, Apache-2.0/BSD; native), chosen by measurement over pypdf and pdfminer.six
(benchmarks/results/parsers.md). Pages are opened, read and closed one at a time, so memory follows the page, not
the file; PDFium reads the file on demand. A page that raises is counted in ``Info.pages_failed`` and the others
are kept; pages over ``max_pages`` are not read (``pages_skipped``). A document with pages but no text at all is
a scan: ``no_text_layer`` (OCR is not enabled). A password-protected document is ``encrypted``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from services.readers.protocol import Info, ParseFailure, Part
from services.readers.records import Section
from services.settings import DocumentSettings

_MAX_OUTLINE = 20_000
_SPACES = re.compile(r"[ \t\f\v]+")


def read(path: Path, limits: DocumentSettings) -> Iterator[Part]:
    import pypdfium2 as pdfium  # native code: imported in the parser's own process only

    try:
        pdf = pdfium.PdfDocument(str(path))
    except pdfium.PdfiumError as e:
        raise _open_failure(str(e)) from e
    try:
        total = len(pdf)
        info = Info(title=_title(pdf), pages_total=total, pages_skipped=max(0, total - limits.max_pages))
        headings = _page_headings(pdf, min(total, limits.max_pages))
        read_any = False
        for index in range(min(total, limits.max_pages)):
            try:
                text = page_text(pdf, index)
            except Exception:  # noqa: BLE001 - one damaged page costs that page: reported, the rest go on
                info.pages_failed.append(index + 1)
                continue
            if not text.strip():
                info.pages_empty += 1
                continue
            read_any = True
            yield Section(text, heading=headings.get(index, ()), page=index + 1)
        if total and not read_any and not info.pages_failed:
            raise ParseFailure(
                "no_text_layer",
                f"has {total:,} pages but no text layer (a scan, or pages of images); OCR is not enabled: run it "
                "through an OCR tool first (e.g. Debian's ocrmypdf with tesseract) and ingest the result",
            )
        yield info
    finally:
        pdf.close()


def page_text(pdf: object, index: int) -> str:
    page = pdf[index]  # type: ignore[index]
    try:
        textpage = page.get_textpage()
        try:
            raw: str = textpage.get_text_bounded()
        finally:
            textpage.close()
    finally:
        page.close()
    lines = (_SPACES.sub(" ", line).strip() for line in raw.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    return "\n".join(line for line in lines if line)


def _open_failure(message: str) -> ParseFailure:
    low = message.lower()
    if "password" in low:
        return ParseFailure("encrypted", "is encrypted (it needs a password to open); save a copy without the "
                            "password (e.g. `qpdf --decrypt --password=PW in.pdf out.pdf`) and ingest that")
    if "security" in low:
        return ParseFailure("encrypted", "uses an unsupported security handler; save a decrypted copy and ingest it")
    return ParseFailure("corrupt", f"is not a readable PDF ({message}); re-download or re-create it (a damaged "
                        "file can often be repaired with `qpdf in.pdf out.pdf`)")


def _title(pdf: object) -> str:
    try:
        meta = pdf.get_metadata_dict(skip_empty=True)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - metadata is optional
        return ""
    return " ".join(str(meta.get("Title", "")).split())


def _page_headings(pdf: object, pages: int) -> dict[int, tuple[str, ...]]:
    """Page index -> the outline's heading path in force on that page (the last bookmark at or before it)."""
    marks: list[tuple[int, tuple[str, ...]]] = []
    path: list[str] = []
    try:
        for n, item in enumerate(pdf.get_toc(max_depth=8)):  # type: ignore[attr-defined]
            if n >= _MAX_OUTLINE:
                break
            del path[item.level:]
            path.append(" ".join(str(item.get_title() or "").split()))
            dest = item.get_dest()
            index = dest.get_index() if dest is not None else None
            if index is not None and 0 <= index < pages:
                marks.append((index, tuple(path)))
    except Exception:  # noqa: BLE001 - a damaged outline only costs the headings
        return {}
    marks.sort(key=lambda m: m[0])  # stable: bookmarks of one page keep their order, the last wins
    out: dict[int, tuple[str, ...]] = {}
    current: tuple[str, ...] = ()
    it = iter(marks)
    nxt = next(it, None)
    for index in range(pages):
        while nxt is not None and nxt[0] <= index:
            current = nxt[1]
            nxt = next(it, None)
        if current:
            out[index] = current
    return out
