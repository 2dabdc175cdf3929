"""One text file -> a ``Document`` (text, Markdown, reST, HTML), and the one gzip-aware text opener.

Markdown, reStructuredText and HTML are read into sections by heading path without their markup
(``services.readers.markdown``, ``rst``, ``html``: ``format`` md, rst, html); a plain text file is one document
text, as it always was.

Reading never raises for one bad file: ``read_file`` raises ``DocumentError`` naming the source, the reason and
the fix, which the folder walk (``services.readers.folders``) yields as a ``DocumentFailure`` before going on.

Text rules: UTF-8 (a BOM is dropped); UTF-16 and UTF-32 with a byte order mark are decoded; a NUL anywhere, in
the bytes or in the decoded text, means binary and fails the file (never stored, never stripped silently).
"""

from __future__ import annotations

import gzip
import html
import html.parser
import re
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from services.core.errors import DocumentError
from services.readers.html import html_sections
from services.readers.lines import read_bounded, wide_encoding
from services.readers.markdown import markdown_sections
from services.readers.records import Document, Section, safe_text
from services.readers.rst import rst_sections

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".html", ".htm"}


def open_text(path: Path) -> TextIO:
    """A UTF-8 text file, transparently gunzipped when its name ends in ``.gz``."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


# --- text decoding and cleaning -------------------------------------------------------------------------------


def oversized(source: str, size: int, max_bytes: int) -> DocumentError:
    return DocumentError(
        source,
        "oversized",
        f"{size:,} bytes is over the {max_bytes:,}-byte limit (UTF-8 bytes); split the document or raise "
        "DPR_MAX_DOCUMENT_BYTES",
    )


def decode_text(source: str, data: bytes, max_bytes: int) -> str:
    """Bytes -> text, or DocumentError with the reason (binary, oversized, encoding, empty)."""
    if len(data) > max_bytes:
        raise oversized(source, len(data), max_bytes)
    wide = wide_encoding(data[:4])
    if wide is None and b"\x00" in data:
        raise DocumentError(source, "binary", "looks binary (NUL bytes); convert it to text first")
    try:
        text = data.decode(wide or "utf-8-sig")
    except UnicodeDecodeError as e:
        name = (wide or "UTF-8").upper()
        raise DocumentError(
            source,
            "encoding",
            f"is not valid {name} (byte {e.start}: {data[e.start:e.start + 1]!r}); re-encode it as UTF-8",
        ) from e
    if wide is not None:
        text = text.lstrip("\ufeff")
        if "\x00" in text:
            raise DocumentError(source, "binary", f"holds NUL characters once decoded as {wide}; convert it to text")
    if not text.strip():
        raise DocumentError(source, "empty", "has no text; remove it or add content")
    return text


class _HTMLText(html.parser.HTMLParser):
    _SKIP = {"script", "style", "noscript", "template", "svg", "head"}
    _BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "section", "article", "dt", "dd"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title = ""
        self._skip = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in self._SKIP:
            self._skip += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in self._SKIP and self._skip:
            self._skip -= 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._skip:
            self.parts.append(data)


def html_to_text(markup: str) -> tuple[str, str]:
    """(title, text) of an HTML page, without scripts, styles and tags."""
    parser = _HTMLText()
    parser.feed(markup)
    parser.close()
    text = html.unescape("".join(parser.parts))
    text = re.sub(r"[ \t\r\f\v]+", " ", text)
    text = re.sub(r"\n\s*\n+", "\n\n", text)
    return " ".join(parser.title.split()), text.strip()


_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>:_.])\1{2,}\s*$")


def guess_title(path: Path, text: str) -> str:
    """First Markdown '# ' heading, first reST underlined heading, else the file name."""
    lines = text.splitlines()[:60]
    name = path.name.lower()
    if name.endswith((".md", ".markdown")):
        for line in lines:
            if line.startswith("# "):
                return line[2:].strip()
    if name.endswith((".rst", ".rst.txt", ".txt")):
        for i in range(1, len(lines)):
            prev = lines[i - 1].strip()
            if prev and _RST_UNDERLINE.match(lines[i]) and not _RST_UNDERLINE.match(prev):
                return prev.strip("*` ")
    stem = path.name.split(".")[0]
    return stem.replace("_", " ").replace("-", " ").strip()


# --- readers ---------------------------------------------------------------------------------------------------


def read_file(path: Path, doc_id: str, max_bytes: int, markup: str | None = None) -> Document:
    """One regular file; at most ``max_bytes + 1`` bytes are read. Markdown, reST and HTML (by name, or as
    ``markup`` says: ``md``, ``rst``, ``html``, e.g. a web page saved as ``guide.pdf``) become sections; an HTML
    page with a title and no visible text is its title (searchable text); with neither it is empty."""
    source = safe_text(str(path))
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise oversized(source, size, max_bytes)
        data = read_bounded(path, max_bytes)
    except OSError as e:
        raise DocumentError(source, "unreadable", f"cannot be read ({e.strerror or e}); check its permissions") from e
    if data is None:  # grew past the limit since stat
        raise oversized(source, max_bytes + 1, max_bytes)
    text = decode_text(source, data, max_bytes)
    markup = markup or markup_format(path)
    reader = SECTION_READERS.get(markup or "")
    if markup is None or reader is None:  # plain text: read as it always was (same text, same hash)
        return Document(doc_id=doc_id, text=text, title=safe_text(guess_title(path, text)), source=source)
    title, sections = reader(text)
    if not sections:
        if not title:
            raise DocumentError(source, "empty", "has no visible text and no title; remove it or add content")
        sections = [Section(title)]  # a page with only a title: the title is its searchable text
    return Document.from_sections(doc_id, sections, title=safe_text(title or guess_title(path, "")), source=source,
                                  format=markup)


def markup_format(path: Path) -> str | None:
    """``md``, ``rst`` or ``html`` for a file whose markup is read into sections (Sphinx's ``.rst.txt`` is reST);
    None for plain text."""
    name = path.name.lower()
    if name.endswith((".md", ".markdown")):
        return "md"
    if name.endswith((".rst", ".rst.txt")):
        return "rst"
    if name.endswith((".html", ".htm")):
        return "html"
    return None


SECTION_READERS: dict[str, Callable[[str], tuple[str, list[Section]]]] = {
    "md": markdown_sections,
    "rst": rst_sections,
    "html": html_sections,
}
