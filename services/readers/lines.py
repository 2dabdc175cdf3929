"""Bounded reading: lines of a (possibly gzipped) file, never more than the limit held in memory.

A decompression bomb (a 1 MB ``.gz`` of one 1 GB line) costs at most ``max_bytes + 1`` bytes of buffer: a line
over the limit is read past in small chunks and reported by its size, never joined. A gzip body that breaks
(bad CRC, truncated, garbage) raises ``CORRUPT`` errors only when the reader reaches the break, so the lines
before it have been yielded already.
"""

from __future__ import annotations

import gzip
import io
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# What a compressed body that breaks raises while it is read (gzip.BadGzipFile is an OSError: listed first).
CORRUPT = (gzip.BadGzipFile, EOFError, zlib.error)
_SKIP_CHUNK = 1 << 20  # the piece size in which an over-long line is read past

BOMS = {
    b"\xff\xfe\x00\x00": "utf-32",
    b"\x00\x00\xfe\xff": "utf-32",
    b"\xff\xfe": "utf-16",
    b"\xfe\xff": "utf-16",
}


def open_bytes(path: Path) -> io.BufferedIOBase:
    """A file's bytes, transparently gunzipped (streaming) when its name ends in ``.gz``."""
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def wide_encoding(head: bytes) -> str | None:
    """``utf-16`` / ``utf-32`` when ``head`` starts with that encoding's byte order mark, else None."""
    return next((enc for bom, enc in BOMS.items() if head.startswith(bom)), None)


@dataclass(frozen=True)
class Line:
    number: int  # 1-based
    data: bytes | None  # without the line break; None when the line is over the limit (it was read past)
    size: int  # bytes of the line without its break, counted even when it was read past


def bounded_lines(f: io.BufferedIOBase, max_bytes: int) -> Iterator[Line]:
    """Every ``\\n``-terminated line of ``f``; a line longer than ``max_bytes`` comes with ``data=None``."""
    number = 0
    while True:
        data = f.readline(max_bytes + 1)
        if not data:
            return
        number += 1
        if data.endswith(b"\n") or len(data) <= max_bytes:
            body = data.rstrip(b"\r\n")
            yield Line(number, body, len(body))
            continue
        size = len(data)
        while not data.endswith(b"\n"):
            data = f.readline(_SKIP_CHUNK)
            if not data:
                break
            size += len(data)
        yield Line(number, None, size - (1 if data.endswith(b"\n") else 0))


def read_bounded(path: Path, max_bytes: int) -> bytes | None:
    """The whole (possibly gzipped) file, or None when it is over ``max_bytes`` (at most that much is read)."""
    with open_bytes(path) as f:
        data = f.read(max_bytes + 1)
    return None if len(data) > max_bytes else data
