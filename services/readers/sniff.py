"""What a file holds, by its bytes (magic numbers), never by its suffix alone.

``sniff(path)`` reads at most the first 8 KiB, plus, for a zip, its central directory and the small ``mimetype``
entry (nothing is inflated but that one stored entry), and answers one ``Kind``:
- ``pdf``: ``%PDF-`` in the first 1 KiB (PDF readers accept leading junk there);
- ``docx`` / ``pptx`` / ``xlsx``: a zip with ``[Content_Types].xml`` and ``word/`` / ``ppt/`` / ``xl/`` parts;
- ``odt`` / ``odp`` / ``ods`` / ``epub``: a zip whose ``mimetype`` entry names the OpenDocument or EPUB type;
- ``zip``: any other zip; ``ole``: a legacy Office file (``.doc``, ``.ppt``, ``.xls``);
- ``html``: markup that opens like HTML (a doctype, ``<html``, ``<head``, ``<body``) after any BOM and whitespace;
- ``binary``: NUL bytes or a known binary magic (images, archives); ``text``: anything else.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Literal

Kind = Literal["pdf", "docx", "pptx", "xlsx", "odt", "odp", "ods", "epub", "zip", "ole", "html", "text", "binary"]

# What each kind read here is called in messages, and the kinds a binary reader reads.
READ_KINDS = ("pdf", "docx", "pptx", "odt", "epub")
_HEAD = 8192
_MIMETYPES = {
    "application/epub+zip": "epub",
    "application/vnd.oasis.opendocument.text": "odt",
    "application/vnd.oasis.opendocument.presentation": "odp",
    "application/vnd.oasis.opendocument.spreadsheet": "ods",
}
_BINARY_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"7z\xbc\xaf", b"Rar!",
                 b"\x7fELF", b"(\xb5/\xfd", b"RIFF", b"OggS", b"ID3", b"fLaC", b"\x00\x00\x01\x00")
_HTML_OPEN = re.compile(rb"^(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html|head|body)[\s>]",
                        re.IGNORECASE | re.DOTALL)


def sniff(path: Path) -> Kind:
    """The kind of ``path`` by content; ``OSError`` if it cannot be read."""
    with open(path, "rb") as f:
        head = f.read(_HEAD)
    return sniff_bytes(head, path)


def sniff_bytes(head: bytes, path: Path | None = None) -> Kind:
    """The kind of a file that starts with ``head`` (a zip is looked into through ``path``)."""
    if b"%PDF-" in head[:1024]:
        return "pdf"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return _zip_kind(path) if path is not None else "zip"
    if head.startswith(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"):
        return "ole"
    if head.startswith(_BINARY_MAGIC):
        return "binary"
    text = head.lstrip(b"\xef\xbb\xbf").lstrip()
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16: look at the ASCII letters only
        text = head[2:].replace(b"\x00", b"").lstrip()
    elif b"\x00" in head:
        return "binary"
    if _HTML_OPEN.match(text[:2048]):
        return "html"
    return "text"


def _zip_kind(path: Path) -> Kind:
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if "mimetype" in names:
                info = z.getinfo("mimetype")
                if info.file_size <= 200:  # a tiny stored entry; anything bigger is not an ODF/EPUB mimetype
                    kind = _MIMETYPES.get(z.read(info).decode("ascii", "replace").strip())
                    if kind:
                        return kind  # type: ignore[return-value]
            if "[Content_Types].xml" in names:
                if "word/document.xml" in names:
                    return "docx"
                if "ppt/presentation.xml" in names:
                    return "pptx"
                if "xl/workbook.xml" in names:
                    return "xlsx"
            if "META-INF/container.xml" in names and any(n.endswith(".opf") for n in names):
                return "epub"
    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError):
        return "zip"
    return "zip"
