"""Split a document into passages by the passage tower's own tokenizer.

A passage is a window of at most ``window`` tokens of the document text, cut at token boundaries (snapped back to
the start of a word where possible), with ``overlap`` tokens shared by consecutive windows. The passage tower reads
``title + "\n" + passage``; the window is sized so that this never exceeds the tower's max length, so nothing is
silently truncated. A title longer than ``max_title_tokens`` is shortened, and that is counted and reported; a
title is also shortened so that at least ``MIN_WINDOW`` content tokens fit beside it, so the budget always holds.
Each chunk carries its character span in the document: consecutive spans meet or overlap, and together they cover
every token of the text (nothing is lost between windows).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from services.core.errors import DocumentError
from services.readers.records import SECTION_SEPARATOR, Section

# Token budget kept free for re-tokenisation effects at window edges (a window may start inside a word).
SAFETY_TOKENS = 4
MIN_WINDOW = 8  # content tokens a window always has room for
HEADING_SEPARATOR = " › "  # between the title and the headings of the line the tower reads: "Guide › Installing"

Offsets = list[tuple[int, int]]


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str  # the passage's own text: ``document[start:end]``
    title: str  # the (possibly shortened) title carried with it
    start: int = 0  # character span of ``text`` in the document
    end: int = 0
    tokens: int = 0  # passage-tower tokens of ``encoder_text`` (title + text, no special tokens): length bucketing
    heading: tuple[str, ...] = ()  # heading path the tower reads with it, outermost first (sections only)
    page: int | None = None  # first page of the text (paged formats)
    page_end: int | None = None  # last page when the chunk runs over several pages; None: ``page``

    @property
    def context(self) -> str:
        """The line the tower reads above the passage: the title, then the heading path (``context_line``)."""
        return context_line(self.title, self.heading)

    @property
    def encoder_text(self) -> str:
        """What the passage tower reads."""
        line = self.context
        return f"{line}\n{self.text}" if line else self.text


def context_line(title: str, heading: Sequence[str]) -> str:
    """``title › heading › path`` (a first heading the title already says is said once); the title alone
    without headings, so a document without sections reads exactly as it always has."""
    parts = list(heading)
    if parts and title and _repeats(title, parts[0]):
        parts = parts[1:]
    return HEADING_SEPARATOR.join([title, *parts] if title else parts)


@dataclass(frozen=True)
class ChunkedDocument:
    chunks: list[Chunk]
    title_truncated: bool


def window_size(max_passage_tokens: int, max_tokens: int | None, title_tokens: int) -> int:
    """Content tokens per window once the title and its separator are accounted for."""
    limit = max_passage_tokens if max_tokens is None else min(max_tokens, max_passage_tokens)
    size = limit - title_tokens - (1 if title_tokens else 0) - SAFETY_TOKENS
    return max(size, MIN_WINDOW)


def chunk_text(text: str, title: str, **options: Any) -> ChunkedDocument:
    """Token windows over plain ``text``: ``chunk_sections`` over one untitled section (the same options)."""
    return chunk_sections([Section(text)], title, **options)


def _repeats(title: str, heading: str) -> bool:
    """Whether the title says the heading already: the same words, or the heading and more ("Input and Output —
    Python 3.11 documentation" over its page's first heading "Input and Output")."""
    t, h = title.casefold(), " ".join(heading.split()).casefold()
    return t.startswith(h) and (len(t) == len(h) or not t[len(h)].isalnum())


def _windows(text: str, offsets: Offsets, size: int, overlap: int) -> Iterator[tuple[int, int, int]]:
    """(start, end, tokens) of each window over ``text``: at most ``size`` tokens, ``overlap`` shared by
    consecutive windows, ends snapped back to a word start where possible, spans stripped of outer whitespace."""
    starts = _word_starts(text, offsets)
    start = 0
    n = len(offsets)
    while True:
        end = min(start + size, n)
        if end < n:
            # Prefer to end the window before a word that would otherwise be split across windows.
            snapped = _snap_back(starts, end, floor=start + size // 2)
            end = snapped if snapped > start else end
        a, b = offsets[start][0], offsets[end - 1][1]
        piece = text[a:b]
        stripped = piece.strip()
        if stripped:
            a += len(piece) - len(piece.lstrip())
            yield a, a + len(stripped), end - start
        if end >= n:
            break
        nxt = max(end - overlap, start + 1)
        snapped_start = _snap_back(starts, nxt, floor=start + 1)
        start = snapped_start if snapped_start > start else nxt


def chunk_sections(
    sections: Sequence[Section],
    title: str,
    *,
    offsets_of: Callable[[str], Offsets],
    max_passage_tokens: int,
    max_tokens: int | None = None,
    overlap: int = 32,
    max_title_tokens: int = 32,
    source: str = "",
) -> ChunkedDocument:
    """Token windows over a document's sections, section by section: a window never runs over a section's end, so
    every chunk has one place. Consecutive sections with the same heading path and adjacent pages (or none) are
    packed whole into one window while they fit (a few short pages become one passage ``pp. 12-13``); a section
    longer than a window is cut alone. The tower reads ``title › heading path`` above each passage, and the
    window is sized for that line. Spans are character offsets in the sections' texts joined by
    ``SECTION_SEPARATOR`` (``Document.text`` of a structured reader)."""
    limit = title_budget(max_passage_tokens, max_tokens)
    title, title_tokens, title_truncated = _fit_title(title, offsets_of, min(max_title_tokens, limit))
    heading_cap = min(limit, title_tokens + max_title_tokens) if max_title_tokens else 0
    positions, pos = [], 0  # where each section's text starts in the joined text (no copy of it is made)
    for s in sections:
        positions.append(pos)
        pos += len(s.text) + len(SECTION_SEPARATOR)

    chunks: list[Chunk] = []
    fitted: dict[tuple[str, ...], tuple[tuple[str, ...], int]] = {}
    for run in _runs(sections):
        path = sections[run[0]].heading
        if path not in fitted:
            fitted[path] = _fit_heading(title, title_tokens, path, offsets_of, heading_cap)
        heading, prefix_tokens = fitted[path]
        size = window_size(max_passage_tokens, max_tokens, prefix_tokens)
        run_overlap = overlap if overlap < size else size // 4
        for pack, known in _packs(run, sections, offsets_of, size):
            a0 = positions[pack[0]]
            text = SECTION_SEPARATOR.join(sections[i].text for i in pack)
            offsets = known if known is not None else offsets_of(text)
            if not offsets:
                continue
            for a, b, n in _windows(text, offsets, size, run_overlap):
                page, page_end = _pages([sections[i] for i in pack if _overlaps(positions[i] - a0,
                                                                                  sections[i].text, a, b)])
                chunks.append(Chunk(index=len(chunks), text=text[a:b], title=title, start=a0 + a, end=a0 + b,
                                    tokens=n + prefix_tokens, heading=heading, page=page, page_end=page_end))
    if not chunks:
        raise DocumentError(source or "document", "empty", "has no tokens after cleaning; remove it or add text")
    return ChunkedDocument(chunks=chunks, title_truncated=title_truncated)


def _runs(sections: Sequence[Section]) -> Iterator[list[int]]:
    """Indexes of consecutive sections that share a heading path and whose pages follow on (or have none)."""
    run: list[int] = []
    for i, s in enumerate(sections):
        if run:
            prev = sections[run[-1]]
            last = prev.page_end if prev.page_end is not None else prev.page
            follows = (s.page is None and last is None) or (
                s.page is not None and last is not None and last <= s.page <= last + 1
            )
            if s.heading != prev.heading or not follows:
                yield run
                run = []
        run.append(i)
    if run:
        yield run


def _packs(run: list[int], sections: Sequence[Section], offsets_of: Callable[[str], Offsets],
           size: int) -> Iterator[tuple[list[int], Offsets | None]]:
    """The run cut into packs: whole consecutive sections while their tokens fit one window; a longer one alone.
    With each pack, its token offsets when it is one section whose offsets were counted (else None)."""
    if len(run) == 1:
        yield run, None
        return
    pack: list[int] = []
    used = 0
    last: Offsets | None = None
    for i in run:
        offsets = offsets_of(sections[i].text)
        if pack and used + len(offsets) > size:
            yield pack, last if len(pack) == 1 else None
            pack, used = [], 0
        pack.append(i)
        used += len(offsets)
        last = offsets
    if pack:
        yield pack, last if len(pack) == 1 else None


def _overlaps(start: int, text: str, a: int, b: int) -> bool:
    """Whether the text of a section at ``start`` has a non-blank character inside ``[a, b)``."""
    lo, hi = max(start, a), min(start + len(text), b)
    return lo < hi and bool(text[lo - start : hi - start].strip())


def _pages(touched: list[Section]) -> tuple[int | None, int | None]:
    """(first page, last page or None when the same) of the sections a chunk's text comes from."""
    pages = [p for s in touched for p in (s.page, s.page_end) if p is not None]
    if not pages:
        return None, None
    first, last = min(pages), max(pages)
    return first, (last if last != first else None)


def _fit_heading(title: str, title_tokens: int, heading: tuple[str, ...], offsets_of: Callable[[str], Offsets],
                 cap: int) -> tuple[tuple[str, ...], int]:
    """The heading path that fits ``cap`` tokens of context line beside the title (outer headings are dropped
    first, then the innermost one is cut), and the line's token count."""
    path = tuple(" ".join(h.split()) for h in heading if h.strip())
    while path:
        n = len(offsets_of(context_line(title, path)))
        if n <= cap:
            return path, n
        if len(path) > 1:
            path = path[1:]
            continue
        room = cap - title_tokens - len(offsets_of(HEADING_SEPARATOR.strip()))
        cut, cut_tokens, _ = _fit_title(path[0], offsets_of, max(room, 0))
        if not cut or cut == path[0]:
            break
        path = (cut,)
        if len(offsets_of(context_line(title, path))) > cap:
            break
    return (), title_tokens


def title_budget(max_passage_tokens: int, max_tokens: int | None) -> int:
    """The most title tokens that still leave ``MIN_WINDOW`` content tokens within the budget."""
    limit = max_passage_tokens if max_tokens is None else min(max_tokens, max_passage_tokens)
    return max(limit - 1 - SAFETY_TOKENS - MIN_WINDOW, 0)


def _fit_title(title: str, offsets_of: Callable[[str], Offsets], max_tokens: int) -> tuple[str, int, bool]:
    """(title on one line, cut to ``max_tokens`` tokens; its token count; whether it was cut)."""
    title = " ".join(title.split())
    offsets = offsets_of(title) if title else []
    if len(offsets) <= max_tokens:
        return title, len(offsets), False
    title = title[: offsets[max_tokens - 1][1]].rstrip() if max_tokens else ""
    return title, min(len(offsets), max_tokens) if title else 0, True


def _word_starts(text: str, offsets: Offsets) -> list[bool]:
    """True where a token begins a new word (preceded by whitespace or the start of text)."""
    flags = []
    prev_end = -1
    for a, _b in offsets:
        flags.append(a == 0 or a != prev_end or text[a - 1 : a].isspace())
        prev_end = _b
    return flags


def _snap_back(starts: list[bool], pos: int, floor: int) -> int:
    """The nearest token index <= pos that starts a word, not below ``floor``; else ``pos``."""
    i = pos
    while i > floor:
        if starts[i]:
            return i
        i -= 1
    return pos
