"""Zip containers (DOCX, PPTX, ODT, EPUB) opened safely, and XML parsed safely, for the zip + lxml readers.

A zip bomb is refused before anything is inflated: the declared sizes in the central directory must add up to at
most ``max_uncompressed_bytes`` and no entry over 1 MiB may claim a ratio above ``max_compression_ratio``; then
every entry is inflated through a bounded read that stops at its declared size (a lying header cannot inflate
more), with a running total capped the same way. XML is parsed without entities, DTDs or network access, so an
entity bomb ("billion laughs") or an external entity reads nothing.
"""

from __future__ import annotations

import posixpath
import zipfile
from collections.abc import Iterable
from pathlib import Path

from lxml import etree

from services.core.settings import DocumentSettings
from services.readers.protocol import ParseFailure

_LARGE_ENTRY = 1 << 20
_XML = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False,
                       remove_comments=True, remove_pis=True)
_HTML = etree.HTMLParser(no_network=True, remove_comments=True, remove_pis=True)


class SafeZip:
    """A zip read within ``limits``; ``read(name)`` inflates one entry (bounded), ``ParseFailure`` otherwise."""

    def __init__(self, path: Path, limits: DocumentSettings, what: str) -> None:
        self.limits = limits
        self.what = what
        self.inflated = 0
        try:
            self.zip = zipfile.ZipFile(path)
            infos = self.zip.infolist()
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise ParseFailure("corrupt", f"is not a readable {what} (the zip is damaged: {e}); re-save or "
                               "re-export it") from e
        declared = sum(i.file_size for i in infos)
        if declared > limits.max_uncompressed_bytes:
            raise self._bomb(f"its parts declare {declared:,} bytes uncompressed")
        for i in infos:
            if i.file_size > _LARGE_ENTRY and i.file_size > limits.max_compression_ratio * max(i.compress_size, 1):
                raise self._bomb(f"part {i.filename!r} inflates {i.file_size / max(i.compress_size, 1):,.0f}x "
                                 f"({i.compress_size:,} -> {i.file_size:,} bytes)")
        self.names = {i.filename for i in infos}

    def _bomb(self, detail: str) -> ParseFailure:
        return ParseFailure(
            "zip_bomb",
            f"looks like a zip bomb: {detail}, over the limits (DPR_DOCUMENTS__MAX_UNCOMPRESSED_BYTES="
            f"{self.limits.max_uncompressed_bytes:,}, DPR_DOCUMENTS__MAX_COMPRESSION_RATIO="
            f"{self.limits.max_compression_ratio:g}); if the {self.what} is genuine, raise them",
        )

    def read(self, name: str) -> bytes:
        try:
            info = self.zip.getinfo(name)
        except KeyError as e:
            raise ParseFailure("corrupt", f"is not a complete {self.what}: part {name!r} is missing; re-save "
                               "or re-export it") from e
        budget = self.limits.max_uncompressed_bytes - self.inflated
        try:
            with self.zip.open(info) as f:
                data = f.read(min(info.file_size, budget) + 1)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
            raise ParseFailure("corrupt", f"is not a readable {self.what} (part {name!r}: {e}); re-save or "
                               "re-export it") from e
        if len(data) > min(info.file_size, budget):
            raise self._bomb(f"part {name!r} inflates past its declared size or the total budget")
        self.inflated += len(data)
        return data

    def xml(self, name: str) -> etree._Element:
        return parse_xml(self.read(name), f"part {name!r} of this {self.what}")

    def dc_title(self, name: str) -> str:
        """The Dublin Core title in the part ``name`` (DOCX ``docProps/core.xml``, ODT ``meta.xml``), or ''."""
        if name not in self.names:
            return ""
        for el in self.xml(name).iter("{http://purl.org/dc/elements/1.1/}title"):
            return " ".join((el.text or "").split())
        return ""

    def __enter__(self) -> SafeZip:
        return self

    def __exit__(self, *exc: object) -> None:
        self.zip.close()


def parse_xml(data: bytes, what: str) -> etree._Element:
    try:
        root = etree.fromstring(data, _XML)
    except etree.XMLSyntaxError as e:
        raise ParseFailure("corrupt", f"{what} is not well-formed XML ({e}); re-save or re-export it") from e
    if root is None:
        raise ParseFailure("corrupt", f"{what} is empty; re-save or re-export it")
    return root


def parse_html(data: bytes) -> etree._Element | None:
    try:
        return etree.fromstring(data, _HTML)
    except (etree.XMLSyntaxError, ValueError):
        return None


def resolve(base: str, href: str) -> str:
    """A relationship or manifest target relative to the part ``base`` -> a zip entry name."""
    href = href.split("#", 1)[0]
    if href.startswith("/"):
        return href.lstrip("/")
    return posixpath.normpath(posixpath.join(posixpath.dirname(base), href))


def local(tag: object) -> str:
    """An element's tag without its namespace ('' for comments and processing instructions)."""
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def table_text(rows: Iterable[list[str]]) -> str:
    """A table as text, one line a row: ``cell | cell | cell``; empty rows are left out."""
    lines = []
    for row in rows:
        cells = [" ".join(c.split()) for c in row]
        if any(cells):
            lines.append(" | ".join(cells))
    return "\n".join(lines)
