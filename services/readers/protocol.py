"""The one protocol every binary-format reader follows (``pdf``, ``docx``, ``pptx``, ``odt``, ``epub``).

A reader is a function ``read(path, limits) -> Iterator[Part]``: it yields the document's ``Section``s one at a
time, in order (a page, a slide, the text under one heading), so nothing but the current page is held, and ends
with one ``Info`` (title, metadata, the pages it could not read). A document it cannot read at all raises
``ParseFailure`` with a reason code and a message that names the fix. Readers run inside the parser sandbox
(``services.readers.sandbox``); they never see the pipeline, and the pipeline never sees the format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.core.settings import DocumentSettings
from services.readers.records import Section


@dataclass
class Info:
    """What a reader knows once it has read the document."""

    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    pages_failed: list[int] = field(default_factory=list)  # 1-based pages (slides) that raised while read
    pages_total: int = 0  # pages (slides) in the document, 0 when the format has none
    pages_skipped: int = 0  # pages over ``max_pages``, not read
    pages_empty: int = 0  # pages that read but hold no text (an image, a scan)


Part = Section | Info


class ParseFailure(Exception):
    """The whole document cannot be read: ``reason`` (a short code) and ``message`` (what happened, the fix)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason, message)
        self.reason = reason
        self.message = message


Reader = Callable[[Path, DocumentSettings], Iterator[Part]]
