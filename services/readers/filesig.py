"""Binary documents parsed where the batch runs, and not at all when the store already holds their bytes
(docs/documents.md, "Parsing with workers", says how and why).

``FileRef``: a PDF, DOCX, PPTX, ODT or EPUB not yet parsed, a ``Document`` with no text, so the job machinery
(batches, ids, re-sends, stale-document sync) treats it as one. The folder walk yields one when asked to
(``iter_documents(..., defer_binary=True)``); the batch's runner parses it in its parser sandbox. Its bytes reach
a worker inline (at most ``DPR_CELERY__INLINE_FILE_BYTES``), else by path (rewritten by ``DPR_CELERY__PATH_MAP``);
an API upload that does not travel inline is spooled under ``DATA_DIR/uploads`` (``spool``, ``release_spooled``).

``signature``: the sha256 of the bytes, their size and a key of the chunking that shapes the passages, stored on
every passage of the document (payload ``file_sig``), so every worker sees it; a file whose signature and model
match the store's is counted unchanged without being parsed. The mtime never decides "unchanged".
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.readers.records import Document, DocumentFailure, safe_text


@dataclass(frozen=True)
class FileRef(Document):
    """A binary document to parse where its batch runs: ``path`` (absolute, as the submitter saw it), its sniffed
    ``kind``, and the size/mtime seen when it was listed. ``inline`` holds its bytes when they travel with the
    task. ``text`` is empty until it is parsed."""

    path: str = ""
    kind: str = ""
    size: int = 0
    mtime_ns: int = 0
    inline: bytes | None = None
    spooled: bool = False  # an API upload kept under DATA_DIR/uploads for the worker: removed once its batch ends

    @classmethod
    def of(cls, path: Path, kind: str, doc_id: str) -> FileRef:
        st = path.stat()
        return cls(doc_id=doc_id, text="", source=safe_text(str(path)), format=kind, path=str(path.resolve()),
                   kind=kind, size=st.st_size, mtime_ns=st.st_mtime_ns)

    def with_bytes(self, limit: int) -> FileRef:
        """This reference carrying the file's bytes when they are at most ``limit`` (else unchanged)."""
        if limit <= 0 or self.size > limit:
            return self
        try:
            with open(self.path, "rb") as f:
                data = f.read(limit + 1)
        except OSError:
            return self  # the worker reports it, naming the path
        if len(data) > limit:
            return self
        return FileRef(doc_id=self.doc_id, text="", source=self.source, format=self.kind, path=self.path,
                       kind=self.kind, size=len(data), mtime_ns=self.mtime_ns, inline=data, spooled=self.spooled)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"doc_id": self.doc_id, "source": self.source, "path": self.path, "kind": self.kind,
                               "size": self.size, "mtime_ns": self.mtime_ns}
        if self.inline is not None:
            out["inline_b64"] = base64.b64encode(self.inline).decode("ascii")
        if self.spooled:
            out["spooled"] = True
        return {"file": out}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileRef:
        f = data["file"]
        inline = base64.b64decode(f["inline_b64"], validate=True) if f.get("inline_b64") is not None else None
        kind = str(f["kind"])
        return cls(doc_id=str(f["doc_id"]), text="", source=str(f.get("source") or f["path"]), format=kind,
                   path=str(f["path"]), kind=kind, size=int(f.get("size") or 0),
                   mtime_ns=int(f.get("mtime_ns") or 0), inline=inline, spooled=f.get("spooled") is True)


UPLOADS = "uploads"  # DATA_DIR/uploads/<random>/<name>: API uploads waiting for a worker (``spool``)


def spool(path: Path, data_dir: Path) -> Path:
    """Move an uploaded file into ``DATA_DIR/uploads/<random>/`` (same name), where workers read it by path."""
    (data_dir / UPLOADS).mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="upload-", dir=data_dir / UPLOADS))
    target = folder / path.name
    shutil.move(path, target)
    return target


def release_spooled(items: Iterable[object], path_map: str = "") -> int:
    """Remove the spooled uploads (``FileRef.spooled``) among ``items`` once their batch has ended (written or
    failed for good); only a file in its own ``uploads/upload-*`` folder is touched. Returns how many."""
    pairs = parse_path_map(path_map) if path_map else []
    removed = 0
    for item in items:
        if not isinstance(item, FileRef) or not item.spooled:
            continue
        path = Path(mapped_path(item.path, pairs))
        if path.parent.parent.name != UPLOADS or not path.parent.name.startswith("upload-"):
            continue
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
        except OSError:
            continue
        with contextlib.suppress(OSError):
            path.parent.rmdir()
    return removed


def is_file_task(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("file"), dict)


def parse_path_map(spec: str) -> list[tuple[str, str]]:
    """``/a=/b;/c=/d`` -> [("/a", "/b"), ("/c", "/d")], longest prefix first."""
    pairs = []
    for part in (spec or "").split(";"):
        if not part.strip():
            continue
        src, sep, dst = part.partition("=")
        if not sep or not src.strip():
            raise ValueError(f"DPR_CELERY__PATH_MAP entry {part!r} is not PREFIX=PREFIX")
        pairs.append((src.strip().rstrip("/") or "/", dst.strip().rstrip("/") or "/"))
    return sorted(pairs, key=lambda p: len(p[0]), reverse=True)


def mapped_path(path: str, pairs: list[tuple[str, str]]) -> str:
    """``path`` with the first matching prefix rewritten (whole path components only)."""
    for src, dst in pairs:
        if path == src or path.startswith(src.rstrip("/") + "/"):
            return dst.rstrip("/") + path[len(src.rstrip("/")):]
    return path


def signature(digest: str, size: int, chunk_key: str) -> str:
    return f"{digest[:40]}:{size}:{chunk_key}"


def chunk_key(*parts: object) -> str:
    """A short hash of what shapes a document's passages besides its bytes (chunk settings, passage budget)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:8]


@dataclass
class LocalFile:
    """Where the runner reads a ``FileRef``'s bytes: the shared path, or a temporary copy of the inline bytes
    (removed by ``close``)."""

    path: Path
    temporary: bool = False

    def close(self) -> None:
        if self.temporary:
            for remove, target in ((os.unlink, self.path), (os.rmdir, self.path.parent)):
                with contextlib.suppress(OSError):
                    remove(target)


def local_file(ref: FileRef, pairs: list[tuple[str, str]], host: str) -> LocalFile | DocumentFailure:
    """The file behind ``ref`` on this machine, or why it cannot be read here."""
    if ref.inline is not None:  # a private folder, the file under its own name (a title may come from it)
        path = Path(tempfile.mkdtemp(prefix="dpr-inline-")) / (Path(ref.path).name or f"document.{ref.kind}")
        path.write_bytes(ref.inline)
        return LocalFile(path, temporary=True)
    where = mapped_path(ref.path, pairs)
    path = Path(where)
    if not path.is_file():
        via = f" (mapped from {ref.path})" if where != ref.path else ""
        return DocumentFailure(
            ref.source, "unreachable",
            f"{ref.source}: {host} cannot read {where}{via} (moved or deleted since it was listed? on workers: a "
            "file over DPR_CELERY__INLINE_FILE_BYTES is read by path: mount its folder at the same path on every "
            "worker, or set DPR_CELERY__PATH_MAP=/client/prefix=/worker/prefix on the workers)", doc_id=ref.doc_id)
    return LocalFile(path)


@dataclass
class ParseLog:
    """Test hook: when ``DPR_PARSE_LOG`` names a file, every parse appends ``pid<TAB>doc_id`` to it, so a test can
    tell which process parsed what (and that an unchanged file was parsed by nobody)."""

    @staticmethod
    def note(doc_id: str) -> None:
        target = os.environ.get("DPR_PARSE_LOG")
        if not target:
            return
        with open(target, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\t{doc_id}\n")

