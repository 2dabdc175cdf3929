"""Documents in: files, folders, JSONL and BEIR corpora -> ``Document`` records with stable ids.

Reading never raises for one bad document: it yields a ``DocumentFailure`` naming the source, the reason and the
fix, and goes on with the next one. Files of a type we do not read are yielded as ``Skipped``.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import html.parser
import json
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from services.errors import ConfigError, DocumentError

log = logging.getLogger(__name__)

InputFormat = Literal["auto", "files", "jsonl", "beir"]

TEXT_SUFFIXES = {".txt", ".md", ".markdown", ".rst", ".html", ".htm"}
MAX_ID_CHARS = 512


@dataclass(frozen=True)
class Document:
    doc_id: str
    text: str
    title: str = ""
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def doc_hash(self) -> str:
        """Hash of everything that shapes the stored passages (title and text)."""
        h = hashlib.sha256()
        h.update(self.title.encode("utf-8"))
        h.update(b"\x1f")
        h.update(self.text.encode("utf-8"))
        h.update(b"\x1f")
        h.update(json.dumps(self.metadata, sort_keys=True, default=str).encode("utf-8"))
        return h.hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "title": self.title,
            "text": self.text,
            "source": self.source,
            "metadata": self.metadata,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Document:
        return cls(
            doc_id=str(data["doc_id"]),
            text=str(data["text"]),
            title=str(data.get("title") or ""),
            source=str(data.get("source") or ""),
            metadata=dict(data.get("metadata") or {}),
        )


@dataclass(frozen=True)
class DocumentFailure:
    source: str
    reason: str  # unreadable | binary | empty | encoding | oversized | invalid_json | missing_field | ...
    error: str

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "reason": self.reason, "error": self.error}

    @classmethod
    def from_error(cls, e: DocumentError) -> DocumentFailure:
        return cls(source=e.source, reason=e.reason, error=str(e))


@dataclass(frozen=True)
class Skipped:
    source: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"source": self.source, "reason": self.reason}


Item = Document | DocumentFailure | Skipped


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


def _open_text(path: Path) -> Iterator[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        yield from f


def iter_jsonl(path: Path, max_bytes: int) -> Iterator[Item]:
    """JSONL rows ``{id|_id, title?, text, ...}``; other scalar fields become payload metadata."""
    try:
        lines = _open_text(path)
        for lineno, line in enumerate(lines, start=1):
            source = f"{path}:{lineno}"
            if not line.strip():
                continue
            try:
                yield parse_json_row(line, source, max_bytes, source_name=str(path))
            except DocumentError as e:
                yield DocumentFailure.from_error(e)
    except UnicodeDecodeError as e:
        yield DocumentFailure(str(path), "encoding", f"{path}: is not valid UTF-8; re-encode it as UTF-8")
        log.warning("stopped reading a JSONL file", extra={"source": str(path), "error": str(e)})
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        yield DocumentFailure(str(path), "unreadable", f"{path}: cannot be read ({e}); check the file")


def parse_json_row(line: str, source: str, max_bytes: int, source_name: str = "") -> Document:
    if len(line) > max_bytes:
        raise DocumentError(source, "oversized", f"row is over the {max_bytes:,}-byte limit; split it")
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise DocumentError(source, "invalid_json", f"is not valid JSON ({e.msg}); one JSON object per line") from e
    if not isinstance(row, dict):
        raise DocumentError(source, "invalid_json", "is not a JSON object; expected {\"id\": ..., \"text\": ...}")
    raw_id = row.get("id", row.get("_id"))
    if raw_id is None or str(raw_id).strip() == "":
        raise DocumentError(source, "missing_field", "has no 'id' or '_id'; give every row a unique id")
    doc_id = str(raw_id)
    if len(doc_id) > MAX_ID_CHARS:
        raise DocumentError(source, "invalid_id", f"id is longer than {MAX_ID_CHARS} characters; shorten it")
    text = row.get("text")
    if not isinstance(text, str):
        raise DocumentError(source, "missing_field", "has no string 'text' field; add the document text")
    if not text.strip():
        raise DocumentError(source, "empty", "has an empty 'text'; remove the row or add content")
    title = row.get("title") or ""
    if not isinstance(title, str):
        title = str(title)
    metadata = {
        k: v
        for k, v in row.items()
        if k not in {"id", "_id", "text", "title", "metadata"} and isinstance(v, str | int | float | bool)
    }
    if isinstance(row.get("metadata"), dict):
        metadata.update({k: v for k, v in row["metadata"].items() if isinstance(v, str | int | float | bool)})
    return Document(doc_id=doc_id, text=text, title=title, source=source_name or source, metadata=metadata)


def beir_corpus_path(folder: Path) -> Path | None:
    for name in ("corpus.jsonl", "corpus.jsonl.gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def detect_format(path: Path) -> InputFormat:
    if path.is_dir():
        return "beir" if beir_corpus_path(path) is not None else "files"
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return "beir" if name.startswith("corpus.jsonl") else "jsonl"
    return "files"


def iter_documents(
    paths: Iterable[str | Path], fmt: InputFormat = "auto", max_bytes: int = 20_000_000
) -> Iterator[Item]:
    """Every document (or failure, or skip) under ``paths``, in a stable order."""
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ConfigError(f"{path}: no such file or directory; check the path")
        kind = detect_format(path) if fmt == "auto" else fmt
        if kind == "files":
            yield from iter_files(path, max_bytes)
        elif kind == "jsonl":
            if path.is_dir():
                raise ConfigError(f"{path}: --format jsonl needs a .jsonl file, not a folder")
            yield from iter_jsonl(path, max_bytes)
        elif kind == "beir":
            corpus = beir_corpus_path(path) if path.is_dir() else path
            if corpus is None:
                raise ConfigError(f"{path}: no corpus.jsonl or corpus.jsonl.gz here; is it a BEIR folder?")
            yield from iter_jsonl(corpus, max_bytes)
        else:  # pragma: no cover - typer validates the choice
            raise ConfigError(f"unknown format {fmt!r}; use auto, files, jsonl or beir")
