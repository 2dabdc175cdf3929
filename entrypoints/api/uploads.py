"""One uploaded file (multipart ``file`` field) -> items, in bounded memory.

The body never sits in memory whole: starlette's form parser spools the file part to a temporary file (the
``BodyLimit`` middleware caps the body at ``DPR_API__MAX_REQUEST_BYTES``), and it is copied in 1 MiB blocks,
counted again, into a private temporary directory. ``services.readers.iter_documents`` then reads it as
``dpr ingest FILE --format FMT`` would (streaming, each document capped at ``DPR_MAX_DOCUMENT_BYTES``), and
the limits apply while reading: more than ``DPR_API__MAX_DOCUMENTS`` items, or more text than
``DPR_API__MAX_REQUEST_BYTES`` (a compressed upload expands), stops the reading with a 413.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from entrypoints.api.errors import ApiError
from services.core.errors import DocumentError
from services.core.settings import Settings
from services.ingest.language import LANGUAGE_CHOICES
from services.readers import Document, DocumentFailure, Item, iter_documents
from services.readers.filesig import FileRef, spool
from services.readers.quarantine import limits_for

UPLOAD_FORMATS = ("auto", "files", "jsonl", "beir")
UPLOAD_FIELDS = ("file", "format", "language")  # the multipart body's fields (its schema's properties)
COPY_BLOCK = 1 << 20
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


MAX_JSON_DEPTH = 64  # a document's JSON nesting (its metadata values are scalars or lists of them: depth 3)


def split_too_deep(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> tuple[bytes, list[int], int]:
    """A ``{"documents": [...]}`` body without its documents nested deeper than ``max_depth`` levels, their
    indices and how many documents are left, found by one pass over the bytes (no recursion, so no parser limit is
    reached). Parsers stop at a recursion limit (pydantic's JSON at ~128 levels, ``json`` at ~1,000) and then
    refuse the whole batch: cut out, such a document fails on its own (``too_deep_failure``) and the others are
    written. A body that is not that shape comes back as it is (the parser then says what is wrong)."""
    depth, key, last_string, in_string, escaped = 0, None, None, False, False
    array_start = array_end = -1
    elements: list[tuple[int, int, int]] = []  # (start, end, deepest level inside), in the documents array
    start, deepest, string_start = -1, 0, 0
    for i, byte in enumerate(raw):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
                last_string = raw[string_start:i]
            continue
        if byte == 0x22:  # a string: at depth 1 it may be a key
            in_string, string_start = True, i + 1
            if depth == 2 and array_start >= 0 and start < 0:
                start = i
            continue
        if byte in (0x20, 0x09, 0x0A, 0x0D):
            continue
        if byte == 0x3A and depth == 1:  # ':' after a key of the root object
            key = last_string
            continue
        if depth == 2 and array_start >= 0 and array_end < 0 and start < 0 and byte not in (0x2C, 0x5D):
            start, deepest = i, 2
        if byte in (0x7B, 0x5B):  # { [
            depth += 1
            if depth == 2 and byte == 0x5B and key == b"documents" and array_start < 0:
                array_start = i
                continue
            deepest = max(deepest, depth)
        elif byte in (0x7D, 0x5D):  # } ]
            if depth == 2 and array_start >= 0 and array_end < 0:
                if start >= 0:
                    elements.append((start, i, deepest))
                    start = -1
                array_end = i
            depth -= 1
        elif byte == 0x2C and depth == 2 and array_start >= 0 and array_end < 0 and start >= 0:  # ','
            elements.append((start, i, deepest))
            start = -1
    deep = [n for n, (_, _, d) in enumerate(elements) if d - 2 > max_depth]
    if not deep or array_end < 0:
        return raw, [], len(elements)
    kept = [raw[a:b] for n, (a, b, _) in enumerate(elements) if n not in set(deep)]
    return raw[: array_start + 1] + b",".join(kept) + raw[array_end:], deep, len(kept)


def too_deep_failure(index: int, max_depth: int = MAX_JSON_DEPTH) -> DocumentFailure:
    source = f"request.documents[{index}]"
    return DocumentFailure.from_error(DocumentError(
        source, "too_deep", f"nests its JSON more than {max_depth} levels deep, which no document needs (metadata "
        "values are scalars or lists of scalars); flatten it and send it again",
    ))


def too_many(limit: int) -> ApiError:
    return ApiError(
        413, "too_large", f"more than {limit:,} documents in one request is over the limit; split the batch or "
        "raise DPR_API__MAX_DOCUMENTS",
    )


def too_much_text(limit: int) -> ApiError:
    return ApiError(
        413, "too_large", f"the upload expands to more than {limit:,} bytes of text (the request limit also "
        "caps what a compressed file expands to); split the file or raise DPR_API__MAX_REQUEST_BYTES",
    )


def safe_filename(name: str | None) -> str:
    base = Path(name or "").name
    base = _SAFE_NAME.sub("_", base).strip("._") or "upload.txt"
    return base[:200]


def collect(items: Iterable[Item], max_documents: int, max_text_bytes: int) -> list[Item]:
    """``items`` as a list, stopping (413) at the first item over ``max_documents`` or the first document that
    takes the text over ``max_text_bytes``: nothing past a limit is read."""
    out: list[Item] = []
    text_bytes = 0
    for item in items:
        if len(out) >= max_documents:
            raise too_many(max_documents)
        if isinstance(item, Document):
            text_bytes += _utf8_len(item.text) + _utf8_len(item.title)
            if text_bytes > max_text_bytes:
                raise too_much_text(max_text_bytes)
        out.append(item)
    return out


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _copy_capped(source: IO[bytes], path: Path, max_bytes: int) -> int:
    size = 0
    with path.open("wb") as out:
        while block := source.read(COPY_BLOCK):
            size += len(block)
            if size > max_bytes:
                raise ApiError(
                    413, "too_large", f"the uploaded file is over the {max_bytes:,}-byte limit; split it or raise "
                    "DPR_API__MAX_REQUEST_BYTES",
                )
            out.write(block)
    return size


def _renamed(item: Item, tmp: str, filename: str) -> Item:
    """The item with the temporary path replaced by ``upload:NAME`` (the client never sees server paths)."""
    if isinstance(item, Document):
        return dataclasses.replace(item, source=f"upload:{filename}")
    prefix = tmp + "/"
    item = dataclasses.replace(item, source=item.source.replace(prefix, "upload:"))
    if isinstance(item, DocumentFailure):
        item = dataclasses.replace(item, error=item.error.replace(prefix, "upload:"))
    return item


def parse_upload(source: IO[bytes], filename: str, fmt: str, settings: Settings, to_workers: bool = False
                 ) -> list[Item]:
    """The uploaded file, copied (capped) to a private directory and read with the limits applied while reading.

    A PDF / DOCX / PPTX / ODT / EPUB parses in this process's parser sandbox (a child), within the document limits;
    with ``to_workers`` (the service runs Celery workers) it is not parsed here but handed to a worker as
    ``dpr ingest`` hands a file over: its bytes inline up to ``DPR_CELERY__INLINE_FILE_BYTES``, else moved to
    ``DATA_DIR/uploads/`` for the worker to read by path (and remove once its batch ends)."""
    limits = settings.api
    with tempfile.TemporaryDirectory(prefix="dpr-upload-") as tmp:
        path = Path(tmp) / filename
        _copy_capped(source, path, limits.max_request_bytes)  # an empty file fails alone, as in `dpr ingest`
        items = iter_documents([path], fmt=fmt, max_bytes=settings.max_document_bytes,  # type: ignore[arg-type]
                               limits=limits_for(settings), defer_binary=to_workers)
        renamed = (_handed_over(_renamed(item, tmp, filename), settings) for item in items)
        return collect(renamed, limits.max_documents, limits.max_request_bytes)


def _handed_over(item: Item, settings: Settings) -> Item:
    """An unparsed binary file made ready for a worker before the private directory goes: inline, or spooled."""
    if not isinstance(item, FileRef):
        return item
    ref = item.with_bytes(settings.celery.inline_file_bytes)
    if ref.inline is not None:
        return ref
    spooled = spool(Path(ref.path), settings.data_dir)
    return dataclasses.replace(ref, path=str(spooled.resolve()), spooled=True)


def _check_format(fmt: object) -> str:
    """The ``format`` field (the schema's enum). ``auto`` reads a file by its name as ``dpr ingest`` does: a
    ``.jsonl`` file as records, anything else as one document known by its content (a file no reader knows is
    reported as skipped in the job, with the reason)."""
    if not isinstance(fmt, str) or fmt not in UPLOAD_FORMATS:
        raise ApiError(422, "validation", f"format {fmt!r} is not known; use one of {', '.join(UPLOAD_FORMATS)}")
    return fmt


def _check_language(language: object) -> str:
    if not isinstance(language, str) or language not in LANGUAGE_CHOICES:
        raise ApiError(422, "validation", f"language {language!r} is not known; use one of "
                       f"{', '.join(LANGUAGE_CHOICES)}")
    return language


async def read_upload(request: Request, settings: Settings, to_workers: bool = False) -> list[Item]:
    try:
        form = await request.form(max_files=1, max_fields=len(UPLOAD_FIELDS),
                                   max_part_size=settings.api.max_request_bytes)
    except ApiError:
        raise
    except Exception as e:  # malformed multipart, or more parts than the fields it may have: starlette's errors
        raise ApiError(400, "bad_request", f"cannot read the multipart body ({e}); send a 'file' field and, "
                       f"optionally, 'format' and 'language', nothing else") from None
    try:
        unknown = sorted(set(form.keys()) - set(UPLOAD_FIELDS))
        if unknown:
            raise ApiError(422, "validation", f"multipart field(s) {', '.join(map(repr, unknown))} are not known; "
                           f"send only {', '.join(UPLOAD_FIELDS)}")
        if len(form.getlist("file")) > 1:
            raise ApiError(422, "validation", "send one 'file' field; one upload is one file")
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise ApiError(422, "validation", "multipart body has no 'file' field with a file in it; add one")
        filename = safe_filename(upload.filename)
        fmt = _check_format(form.get("format", "auto"))
        _check_language(form.get("language", "auto"))
        return await run_in_threadpool(parse_upload, upload.file, filename, fmt, settings, to_workers)
    except (ApiError, DocumentError):
        raise
    except (ValueError, OSError, EOFError, zlib.error) as e:  # e.g. a corrupt or truncated .gz
        raise ApiError(422, "validation", f"cannot read the uploaded file: {e}; check the file") from None
    finally:
        await form.close()
