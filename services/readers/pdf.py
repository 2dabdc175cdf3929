"""PDF -> one section per page (``page`` 1-based), under the heading path the outline (bookmarks) gives that page.

Parser: pypdfium2 (PDFium, Apache-2.0/BSD; native), chosen by measurement over pypdf and pdfminer.six
(benchmarks/results/ingest-speed/parsers.md). Pages are opened, read and closed one at a time, so memory follows the
page, not the file; PDFium reads the file on demand. A page that raises is counted in ``Info.pages_failed`` and the
others are kept; pages over ``max_pages`` are not read (``pages_skipped``). A document with pages but no text at all is
a scan: ``no_text_layer`` (OCR is not enabled). A password-protected document is ``encrypted``."""

from __future__ import annotations

import contextlib
import io
import mmap
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from services.core.settings import DocumentSettings
from services.readers.protocol import Info, ParseFailure, Part
from services.readers.records import Section

_MAX_OUTLINE = 20_000
_SPACES = re.compile(r"[ \t\f\v]+")


def read(path: Path, limits: DocumentSettings) -> Iterator[Part]:
    import pypdfium2 as pdfium  # native code: imported in the parser's own process only

    salvaged = False
    with tempfile.TemporaryDirectory(prefix="dpr-pdf-") as tmp:
        try:
            pdf = pdfium.PdfDocument(str(path))
        except pdfium.PdfiumError as e:
            failure = _open_failure(str(e))
            repaired = Path(tmp) / "salvaged.pdf"
            if failure.reason != "corrupt" or not salvage(path, repaired):
                raise failure from e
            try:
                pdf = pdfium.PdfDocument(str(repaired))
            except pdfium.PdfiumError:
                raise failure from e
            salvaged = True
        yield from _pages(pdf, limits, salvaged)


def _pages(pdf: Any, limits: DocumentSettings, salvaged: bool) -> Iterator[Part]:
    with pdf:
        total = len(pdf)
        info = Info(title=_title(pdf), pages_total=total, pages_skipped=max(0, total - limits.max_pages))
        if salvaged:
            info.metadata["salvaged"] = True
        headings = _page_headings(pdf, min(total, limits.max_pages))
        read_any = False
        for index in range(min(total, limits.max_pages)):
            try:
                text = page_text(pdf, index)
            except Exception:  # noqa: BLE001 - one damaged page costs that page: reported, the rest go on
                info.pages_failed.append(index + 1)
                continue
            if not text.strip() and limits.ocr:
                text = ocr_page(pdf, index, limits)
                if text.strip():
                    info.metadata["pages_ocr"] = info.metadata.get("pages_ocr", 0) + 1
            if not text.strip():
                info.pages_empty += 1
                continue
            read_any = True
            yield Section(text, heading=headings.get(index, ()), page=index + 1)
        if total and not read_any and not info.pages_failed:
            if limits.ocr:
                raise ParseFailure("no_text_layer", f"has {total:,} pages, no text layer, and OCR "
                                   f"(tesseract -l {limits.ocr_language}) found no text on them; check the scan")
            raise ParseFailure(
                "no_text_layer",
                f"has {total:,} pages but no text layer (a scan, or pages of images); OCR is not enabled: set "
                "DPR_DOCUMENTS__OCR=true (needs Debian's tesseract-ocr), or run it through an OCR tool first and "
                "ingest the result",
            )
        yield info


_OBJ = re.compile(rb"(\d{1,10})\s+(\d{1,5})\s+obj\b")
_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")


def salvage(path: Path, out: Path) -> bool:
    """A damaged PDF (truncated: no trailer, no cross-reference table) -> a copy at ``out`` with a new page tree of
    every complete page object found in the bytes, a catalog and a cross-reference table appended, so the pages
    that survive can be read. False when no page object is found (object streams hide them, or nothing is left)."""
    offsets: dict[int, tuple[int, int]] = {}
    pages: dict[int, int] = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        starts = [(mo.start(), int(mo.group(1)), int(mo.group(2))) for mo in _OBJ.finditer(m)]
        for i, (pos, num, gen) in enumerate(starts):
            end = starts[i + 1][0] if i + 1 < len(starts) else len(m)
            if m.find(b"endobj", pos, end) < 0:
                continue  # cut off mid-object
            offsets[num] = (pos, gen)
            if _PAGE.search(m, pos, min(end, pos + 4096)):
                pages[num] = gen
    if not pages:
        return False
    shutil.copyfile(path, out)
    pages_num = max(offsets) + 1
    catalog = pages_num + 1
    kids = b" ".join(b"%d %d R" % (n, g) for n, g in pages.items())
    with open(out, "ab") as w:
        base = w.tell()
        tree = b"\n%d 0 obj\n<< /Type /Pages /Kids [%s] /Count %d >>\nendobj\n" % (pages_num, kids, len(pages))
        root = b"%d 0 obj\n<< /Type /Catalog /Pages %d 0 R >>\nendobj\n" % (catalog, pages_num)
        offsets[pages_num] = (base + 1, 0)
        offsets[catalog] = (base + len(tree), 0)
        rows = [b"0000000000 65535 f \n"]
        for n in range(1, catalog + 1):
            pos, gen = offsets.get(n, (0, 65535))
            rows.append(b"%010d %05d %s \n" % (pos, gen, b"n" if n in offsets else b"f"))
        w.write(tree + root + b"xref\n0 %d\n" % (catalog + 1) + b"".join(rows))
        w.write(b"trailer\n<< /Root %d 0 R /Size %d >>\nstartxref\n%d\n%%%%EOF\n"
                % (catalog, catalog + 1, base + len(tree) + len(root)))
    return True


def ocr_page(pdf: Any, index: int, limits: DocumentSettings) -> str:
    """The text tesseract reads on page ``index`` rendered at ``ocr_dpi`` ('' when it reads none)."""
    command = shutil.which("tesseract")
    if command is None:
        raise ParseFailure("ocr_unavailable", "has pages without text and DPR_DOCUMENTS__OCR is on, but tesseract "
                           "is not installed; apt-get install tesseract-ocr tesseract-ocr-eng, or turn OCR off")
    with contextlib.closing(pdf[index]) as page:
        image = page.render(scale=limits.ocr_dpi / 72).to_pil()
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    try:
        done = subprocess.run([command, "stdin", "stdout", "-l", limits.ocr_language], input=buffer.getvalue(),
                              capture_output=True, timeout=limits.parse_timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return ""
    if done.returncode != 0:
        raise ParseFailure("ocr_unavailable", f"OCR failed (tesseract: {done.stderr.decode(errors='replace')[-200:]}"
                           f"); check DPR_DOCUMENTS__OCR_LANGUAGE={limits.ocr_language!r} is installed")
    lines = (_SPACES.sub(" ", line).strip() for line in done.stdout.decode("utf-8", "replace").splitlines())
    return "\n".join(line for line in lines if line)


def page_text(pdf: object, index: int) -> str:
    with (contextlib.closing(pdf[index]) as page,  # type: ignore[index]
          contextlib.closing(page.get_textpage()) as textpage):
        raw: str = textpage.get_text_bounded()
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
