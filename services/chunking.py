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

from collections.abc import Callable
from dataclasses import dataclass

from services.errors import DocumentError

# Token budget kept free for re-tokenisation effects at window edges (a window may start inside a word).
SAFETY_TOKENS = 4
MIN_WINDOW = 8  # content tokens a window always has room for

Offsets = list[tuple[int, int]]


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str  # the passage's own text: ``document[start:end]``
    title: str  # the (possibly shortened) title carried with it
    start: int = 0  # character span of ``text`` in the document
    end: int = 0
    tokens: int = 0  # passage-tower tokens of ``encoder_text`` (title + text, no special tokens): length bucketing

    @property
    def encoder_text(self) -> str:
        """What the passage tower reads."""
        return f"{self.title}\n{self.text}" if self.title else self.text


@dataclass(frozen=True)
class ChunkedDocument:
    chunks: list[Chunk]
    title_truncated: bool


def window_size(max_passage_tokens: int, max_tokens: int | None, title_tokens: int) -> int:
    """Content tokens per window once the title and its separator are accounted for."""
    limit = max_passage_tokens if max_tokens is None else min(max_tokens, max_passage_tokens)
    size = limit - title_tokens - (1 if title_tokens else 0) - SAFETY_TOKENS
    return max(size, MIN_WINDOW)


def chunk_text(
    text: str,
    title: str,
    *,
    offsets_of: Callable[[str], Offsets],
    max_passage_tokens: int,
    max_tokens: int | None = None,
    overlap: int = 32,
    max_title_tokens: int = 32,
    source: str = "",
) -> ChunkedDocument:
    """Token windows over ``text``. ``offsets_of`` returns the tokenizer's character spans (no special tokens)."""
    title, title_tokens, title_truncated = _fit_title(
        title, offsets_of, min(max_title_tokens, title_budget(max_passage_tokens, max_tokens))
    )
    size = window_size(max_passage_tokens, max_tokens, title_tokens)
    if overlap >= size:
        overlap = size // 4  # a configured overlap larger than the window would never advance

    offsets = offsets_of(text)
    if not offsets:
        raise DocumentError(source or "document", "empty", "has no tokens after cleaning; remove it or add text")

    starts = _word_starts(text, offsets)
    chunks: list[Chunk] = []
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
            chunks.append(Chunk(index=len(chunks), text=stripped, title=title, start=a, end=a + len(stripped),
                                tokens=end - start + title_tokens))
        if end >= n:
            break
        nxt = max(end - overlap, start + 1)
        snapped_start = _snap_back(starts, nxt, floor=start + 1)
        start = snapped_start if snapped_start > start else nxt
    return ChunkedDocument(chunks=chunks, title_truncated=title_truncated)


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
