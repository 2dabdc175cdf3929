"""Files and folders -> ``Document`` records with stable ids (plus the one gzip-aware text opener).

Reading never raises for one bad file: it yields a ``DocumentFailure`` naming the source, the reason and the fix,
and goes on with the next one. Files of a type we do not read are yielded as ``Skipped``.
"""

from __future__ import annotations

import gzip
import html
import html.parser
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from services.errors import DocumentError
from services.readers.records import Document, DocumentFailure, Item, Skipped

log = logging.getLogger(__name__)

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".html", ".htm"}


def open_text(path: Path) -> TextIO:
    """A UTF-8 text file, transparently gunzipped when its name ends in ``.gz``."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


# --- text decoding and cleaning -------------------------------------------------------------------------------


def decode_text(source: str, data: bytes, max_bytes: int) -> str:
    """Bytes -> text, or DocumentError with the reason (binary, oversized, encoding, empty)."""
    if len(data) > max_bytes:
        raise DocumentError(
            source,
            "oversized",
            f"{len(data):,} bytes is over the {max_bytes:,}-byte limit; split the document or raise "
            "DPR_MAX_DOCUMENT_BYTES",
        )
    if b"\x00" in data[:8192]:
        raise DocumentError(source, "binary", "looks binary (NUL bytes); convert it to text first")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DocumentError(
            source,
            "encoding",
            f"is not valid UTF-8 (byte {e.start}: {data[e.start:e.start + 1]!r}); re-encode it as UTF-8",
        ) from e
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


def read_file(path: Path, doc_id: str, max_bytes: int) -> Document:
    source = str(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise DocumentError(
                source,
                "oversized",
                f"{size:,} bytes is over the {max_bytes:,}-byte limit; split the document or raise "
                "DPR_MAX_DOCUMENT_BYTES",
            )
        data = path.read_bytes()
    except OSError as e:
        raise DocumentError(source, "unreadable", f"cannot be read ({e.strerror}); check its permissions") from e
    text = decode_text(source, data, max_bytes)
    if path.suffix.lower() in {".html", ".htm"}:
        title, text = html_to_text(text)
        if not text:
            raise DocumentError(source, "empty", "has no visible text; remove it or add content")
        title = title or guess_title(path, "")
    else:
        title = guess_title(path, text)
    return Document(doc_id=doc_id, text=text, title=title, source=source)


def iter_files(root: Path, max_bytes: int) -> Iterator[Item]:
    """Every file under ``root`` (or ``root`` itself) in a stable order. Doc id: path relative to root's parent."""
    if root.is_file():
        files = [root]
        base = root.parent
    else:
        files = sorted(p for p in root.rglob("*") if p.is_file() and not _hidden(p.relative_to(root)))
        base = root.parent
    for path in files:
        if path.suffix.lower() not in TEXT_SUFFIXES:
            yield Skipped(str(path), f"unsupported file type {path.suffix or '(none)'!r}; supported: "
                          + " ".join(sorted(TEXT_SUFFIXES)))
            continue
        doc_id = path.resolve().relative_to(base.resolve()).as_posix()
        try:
            yield read_file(path, doc_id, max_bytes)
        except DocumentError as e:
            yield DocumentFailure.from_error(e)


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)
