"""Building sections under a heading path, the helpers the readers share: ``HeadingSections`` for the
heading-structured binary formats (DOCX, ODT, EPUB), ``SectionBuilder`` for the markup readers (``markdown``,
``rst``, ``html``: paragraphs, finished lines, verbatim blocks, tables as rows)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from services.readers.records import Section


class HeadingSections:
    """Collects paragraphs; a heading of level N closes the current section and sets the path's N-th entry."""

    def __init__(self) -> None:
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
            yield Section("\n".join(self.parts), heading=tuple(t for _, t in self.path))
        self.parts = []


_SPACE = re.compile(r"\s+")


def one_line(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


@dataclass
class SectionBuilder:
    """Sections by heading path: ``text`` adds to the paragraph being read (``end_line`` ends it: ``clean``
    removes its inline markup, whitespace is collapsed), ``line`` adds a finished line, ``block`` verbatim text
    (code), ``heading`` closes the current section and opens one at ``level``."""

    clean: Callable[[str], str] | None = None
    sections: list[Section] = field(default_factory=list)
    stack: list[tuple[int, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    inline: list[str] = field(default_factory=list)

    def text(self, piece: str) -> None:
        self.inline.append(piece)

    def end_line(self) -> None:
        raw = "".join(self.inline)
        self.inline.clear()
        line = one_line(self.clean(raw) if self.clean is not None and raw.strip() else raw)
        if line:
            self.lines.append(line)

    def line(self, text: str) -> None:
        self.end_line()
        line = one_line(text)
        if line:
            self.lines.append(line)

    def block(self, text: str) -> None:
        self.end_line()
        text = text.strip("\n").rstrip()
        if text.strip():
            self.lines.append(text)

    def heading(self, level: int, title: str) -> None:
        self.flush()
        title = one_line(title)
        while self.stack and self.stack[-1][0] >= level:
            self.stack.pop()
        if title:
            self.stack.append((level, title))

    def flush(self) -> None:
        self.end_line()
        text = "\n".join(self.lines).strip()
        self.lines.clear()
        if text:
            self.sections.append(Section(text, heading=tuple(t for _, t in self.stack)))
