"""Test-only readers for the parser sandbox: they crash or hang the child process on purpose when the file's
name says so (``crash``: SIGSEGV, ``abort``: os.abort(), ``hang``: sleeps), else read the PDF for real."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from services.core.settings import DocumentSettings
from services.readers import pdf
from services.readers.protocol import Part


def by_name(path: Path, limits: DocumentSettings) -> Iterator[Part]:
    if "crash" in path.name:
        os.kill(os.getpid(), signal.SIGSEGV)
    if "abort" in path.name:
        os.abort()
    if "hang" in path.name:
        time.sleep(3600)
    yield from pdf.read(path, limits)
