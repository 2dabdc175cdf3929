"""Building sections under a heading path: the one helper the heading-structured readers (DOCX, ODT, EPUB) share."""

from __future__ import annotations

from collections.abc import Iterator

from services.readers.records import Section


class HeadingSections:
    """Collects paragraphs; a heading of level N closes the current section and sets the path's N-th entry."""

    def __init__(self, prefix: tuple[str, ...] = ()) -> None:
        self.prefix = prefix
        self.path: list[tuple[int, str]] = []
        self.parts: list[str] = []

    def heading(self, level: int, text: str) -> Iterator[Section]:
        text = " ".join(text.split())
        yield from self.flush()
        if not text:
            return
        self.path = [(lvl, t) for lvl, t in self.path if lvl < level] + [(level, text)]
        self.parts.append(text)  # the heading's words are searchable text of its section

    def add(self, text: str) -> None:
        if text.strip():
            self.parts.append(text.strip())

    def flush(self) -> Iterator[Section]:
        if self.parts:
            heading = self.prefix + tuple(t for _, t in self.path)
            yield Section("\n".join(self.parts), heading=heading)
        self.parts = []
