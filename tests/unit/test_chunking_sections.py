"""Chunking a document section by section: every chunk has one place, and no text is lost or duplicated across
page and section boundaries beyond the configured overlap (property tests over random sections)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.errors import DocumentError
from services.ingest.chunking import HEADING_SEPARATOR, chunk_sections, context_line
from services.readers.records import SECTION_SEPARATOR, Document, Section

pytestmark = pytest.mark.unit


def word_offsets(text: str) -> list[tuple[int, int]]:
    """A stand-in tokenizer: one token per word or punctuation mark."""
    return [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]


HEADINGS = [(), ("Intro",), ("Installing",), ("Installing", "On Windows"), ("Installing", "On Linux")]


@st.composite
def documents(draw: st.DrawFn) -> list[Section]:
    n = draw(st.integers(1, 8))
    page: int | None = draw(st.sampled_from([None, 1, 5]))
    sections = []
    word = 0
    for _ in range(n):
        count = draw(st.integers(0, 90))
        words = [f"w{word + i}" for i in range(count)]  # every word is unique: where it went can be checked
        word += count
        if not words:
            continue
        heading = draw(st.sampled_from(HEADINGS))
        span = draw(st.integers(0, 1)) if page is not None else 0
        sections.append(Section(" ".join(words), heading=heading, page=page,
                                page_end=page + span if span else None))
        if page is not None:
            page += span + draw(st.integers(0, 2))  # same page again, the next one, or a gap
    return sections


def _word_spans(sections: list[Section]) -> dict[str, tuple[int, int]]:
    """Each word -> (section index, character offset in the joined text)."""
    out, pos = {}, 0
    for i, s in enumerate(sections):
        for m in re.finditer(r"\S+", s.text):
            out[m.group()] = (i, pos + m.start())
        pos += len(s.text) + len(SECTION_SEPARATOR)
    return out


@settings(max_examples=150, deadline=None)
@given(documents(), st.integers(16, 60), st.integers(0, 12), st.sampled_from(["", "Guide", "Intro"]))
def test_chunks_keep_one_place_and_lose_nothing(sections: list[Section], window: int, overlap: int,
                                                title: str) -> None:
    if not sections:
        return
    joined = SECTION_SEPARATOR.join(s.text for s in sections)
    result = chunk_sections(sections, title, offsets_of=word_offsets, max_passage_tokens=window, overlap=overlap)
    chunks = result.chunks
    assert [c.index for c in chunks] == list(range(len(chunks)))
    where = _word_spans(sections)
    owners: dict[str, list[int]] = {}
    for c in chunks:
        assert joined[c.start : c.end] == c.text  # the span is the text
        assert len(word_offsets(c.encoder_text)) <= window  # the tower's budget holds with the headings
        touched = sorted({where[w][0] for w in c.text.split()})
        # one place: every section it reads has its heading path, and its pages are exactly theirs
        assert all(sections[i].heading == sections[touched[0]].heading for i in touched)
        full = sections[touched[0]].heading  # what the tower reads: the path, or its inner end in a small budget
        assert c.heading == full[len(full) - len(c.heading):] or (len(c.heading) == 1 and full[-1].startswith(
            c.heading[0]))
        pages = [p for i in touched for p in (sections[i].page, sections[i].page_end) if p is not None]
        if pages:
            assert (c.page, c.page_end or c.page) == (min(pages), max(pages))
            # merged sections are adjacent pages: the range holds no page another section holds
            assert all(c.page <= (s.page or 0) <= (c.page_end or c.page) for s in (sections[i] for i in touched))
        else:
            assert c.page is None and c.page_end is None
        assert touched == list(range(touched[0], touched[-1] + 1))
        for w in c.text.split():
            owners.setdefault(w, []).append(c.index)
    # nothing lost: every word of every section is in a chunk
    assert set(owners) == set(where)
    # nothing duplicated beyond the overlap: a word is only in consecutive chunks (those of one section run),
    # consecutive chunks share at most ``overlap`` words, and each chunk reads at least one word the last did not
    for w, idx in owners.items():
        assert idx == list(range(idx[0], idx[0] + len(idx))), (w, idx)
    for a, b in zip(chunks, chunks[1:], strict=False):
        shared = set(a.text.split()) & set(b.text.split())
        assert len(shared) <= overlap and set(b.text.split()) - shared
        if shared:
            assert (a.heading, a.page is None) == (b.heading, b.page is None)


def test_section_boundaries_are_kept_and_the_tower_reads_the_heading_path() -> None:
    sections = [
        Section("Run the installer and follow the steps.", heading=("Installing", "On Windows"), page=12),
        Section("Use the package manager.", heading=("Installing", "On Linux"), page=12),
        Section(" ".join(f"w{i}" for i in range(120)), heading=("Reference",), page=13, page_end=14),
    ]
    chunks = chunk_sections(sections, "Guide", offsets_of=word_offsets, max_passage_tokens=64, overlap=4).chunks
    assert chunks[0].text == sections[0].text and chunks[1].text == sections[1].text  # not merged: other headings
    assert chunks[0].encoder_text == f"Guide{HEADING_SEPARATOR}Installing{HEADING_SEPARATOR}On Windows\n" \
                                     "Run the installer and follow the steps."
    assert (chunks[0].page, chunks[0].page_end, chunks[2].page, chunks[2].page_end) == (12, None, 13, 14)
    assert all(c.heading == ("Reference",) for c in chunks[2:]) and len(chunks) > 3


def test_short_pages_under_one_heading_merge_into_a_page_range() -> None:
    sections = [Section("alpha beta", heading=("Setup",), page=3), Section("gamma", heading=("Setup",), page=4),
                Section("delta", heading=("Setup",), page=7)]  # a gap: page 7 does not follow page 4
    chunks = chunk_sections(sections, "", offsets_of=word_offsets, max_passage_tokens=64).chunks
    assert [(c.text, c.page, c.page_end) for c in chunks] == [
        (f"alpha beta{SECTION_SEPARATOR}gamma", 3, 4), ("delta", 7, None)
    ]


def test_long_heading_paths_drop_outer_headings_first_and_fit_the_budget() -> None:
    heading = tuple(f"Level {i} heading with several words" for i in range(8))
    section = Section(" ".join(f"w{i}" for i in range(200)), heading=heading)
    result = chunk_sections([section], "T", offsets_of=word_offsets, max_passage_tokens=48, max_title_tokens=8)
    for c in result.chunks:
        assert c.heading == heading[-len(c.heading):] and c.heading  # the innermost heading is kept
        assert len(word_offsets(c.encoder_text)) <= 48


def test_a_title_repeated_as_the_first_heading_is_said_once() -> None:
    assert context_line("Tutorial", ("Tutorial", "Reading files")) == f"Tutorial{HEADING_SEPARATOR}Reading files"
    assert context_line("", ("A", "B")) == f"A{HEADING_SEPARATOR}B"
    assert context_line("T", ()) == "T"


def test_sections_without_tokens_are_an_empty_document() -> None:
    doc = Document.from_sections("d", [Section("..."), Section("?")])
    with pytest.raises(DocumentError, match="no tokens"):
        chunk_sections([Section("   ")], "", offsets_of=lambda t: [], max_passage_tokens=64, source="d")
    assert doc.text == f"...{SECTION_SEPARATOR}?"
