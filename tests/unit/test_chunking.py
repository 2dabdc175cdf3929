from __future__ import annotations

import re

import pytest

from services.core.errors import DocumentError
from services.ingest.chunking import SAFETY_TOKENS, chunk_text, window_size

pytestmark = pytest.mark.unit


def word_offsets(text: str) -> list[tuple[int, int]]:
    """A stand-in tokenizer for unit tests: one token per word or punctuation mark."""
    return [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]


def test_windows_respect_budget_overlap_and_cover_the_text() -> None:
    words = [f"w{i}" for i in range(1000)]
    text = " ".join(words)
    result = chunk_text(text, "", offsets_of=word_offsets, max_passage_tokens=100, overlap=10)
    size = window_size(100, None, 0)
    assert size == 100 - SAFETY_TOKENS
    for c in result.chunks:
        assert len(word_offsets(c.encoder_text)) <= 100
    # every word is in some chunk, in order, and consecutive chunks overlap by the configured tokens
    seen = [w for c in result.chunks for w in c.text.split()]
    assert sorted(set(seen), key=lambda w: int(w[1:])) == words
    first, second = result.chunks[0].text.split(), result.chunks[1].text.split()
    assert first[-10:] == second[:10]
    assert [c.index for c in result.chunks] == list(range(len(result.chunks)))


def test_title_is_carried_and_counted_in_the_budget() -> None:
    text = " ".join(f"w{i}" for i in range(300))
    result = chunk_text(text, "A short title", offsets_of=word_offsets, max_passage_tokens=64, overlap=0)
    assert all(c.title == "A short title" for c in result.chunks)
    assert all(c.encoder_text.startswith("A short title\n") for c in result.chunks)
    assert all(len(word_offsets(c.encoder_text)) <= 64 for c in result.chunks)
    assert not result.title_truncated


def test_long_title_is_shortened_and_reported() -> None:
    title = " ".join(f"t{i}" for i in range(50))
    result = chunk_text("body text", title, offsets_of=word_offsets, max_passage_tokens=64, max_title_tokens=8)
    assert result.title_truncated
    assert result.chunks[0].title == " ".join(f"t{i}" for i in range(8))


def test_configured_window_smaller_than_model_limit() -> None:
    text = " ".join(f"w{i}" for i in range(100))
    result = chunk_text(text, "", offsets_of=word_offsets, max_passage_tokens=500, max_tokens=30, overlap=5)
    assert all(len(c.text.split()) <= 30 for c in result.chunks)
    assert len(result.chunks) > 3


def test_windows_end_at_word_boundaries() -> None:
    # "abc-def" is one word made of three tokens; a window should not end inside it when it can avoid it
    text = " ".join(["abc-def"] * 100)
    result = chunk_text(text, "", offsets_of=word_offsets, max_passage_tokens=24, overlap=0)
    for c in result.chunks:
        assert c.text.startswith("abc") and c.text.endswith("def")


def test_short_document_is_one_chunk_and_empty_one_fails() -> None:
    assert [c.text for c in chunk_text("hello world", "", offsets_of=word_offsets, max_passage_tokens=64).chunks] == [
        "hello world"
    ]
    with pytest.raises(DocumentError) as e:
        chunk_text("   ", "", offsets_of=word_offsets, max_passage_tokens=64, source="x.txt")
    assert e.value.reason == "empty"
