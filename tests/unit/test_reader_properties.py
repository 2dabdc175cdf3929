"""Property-based suite (hypothesis) over the readers and the chunker: whatever arrives (arbitrary bytes, names,
JSON nesting, unicode including lone surrogates), the readers never raise and account for every item in strict
UTF-8 JSON; the chunker never loses a token and never exceeds the token budget."""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.core.errors import DocumentError
from services.ingest.chunking import chunk_text
from services.readers import Document, DocumentFailure, Item, Skipped, iter_documents

pytestmark = pytest.mark.unit

FAST = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

# Every code point, with lone surrogates, NUL, BOM and whitespace made common (hypothesis rarely draws them).
ANY_CHAR = st.one_of(
    st.characters(codec=None, exclude_categories=()),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, codec=None, exclude_categories=()),
    st.sampled_from(["\x00", "\ufeff", "\n", " ", "\u2028", "a", "\u00e9"]),
)
SUFFIXES = [".txt", ".md", ".rst", ".html", ".jsonl", ".ndjson", ".jsonl.gz", ".png", "", ".tar.gz", ".zip"]


def _accounted(items: list[Item]) -> None:
    for item in items:
        assert isinstance(item, Document | DocumentFailure | Skipped)
        json.dumps(item.to_json(), ensure_ascii=False).encode("utf-8")  # strict: no surrogate reaches a record
        if isinstance(item, Document):
            assert item.text.strip() and "\x00" not in item.text
            item.doc_hash  # noqa: B018 - hashing needs valid UTF-8 too


@FAST
@given(files=st.lists(st.tuples(st.sampled_from(SUFFIXES), st.binary(max_size=600)), min_size=1, max_size=6))
def test_arbitrary_bytes_as_files_never_raise_and_each_file_is_one_record(files: list[tuple[str, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "docs"
        root.mkdir()
        for i, (suffix, data) in enumerate(files):
            (root / f"f{i}{suffix}").write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
        items = list(iter_documents([root], max_bytes=400))
    _accounted(items)
    sources = {re.split(r"\.(?:jsonl|ndjson)(?:\.gz)?:", it.source)[0] for it in items}  # a JSONL's lines: one file
    assert len(sources) <= len(files)
    plain = [f for f in files if not f[0].startswith((".jsonl", ".ndjson"))]
    assert len([it for it in items if not re.search(r"\.(jsonl|ndjson)", it.source)]) == len(plain)


NAME = st.binary(min_size=1, max_size=60).filter(lambda b: b"/" not in b and b"\x00" not in b)


@FAST
@given(names=st.lists(NAME, min_size=1, max_size=8, unique=True))
def test_arbitrary_names_never_raise_and_every_entry_is_accounted(names: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(os.fsencode(tmp), b"docs")
        os.mkdir(root)
        for name in names:
            with open(os.path.join(root, name + b".txt"), "wb") as f:
                f.write(b"some text")
        items = list(iter_documents([os.fsdecode(root)]))
    _accounted(items)
    assert len(items) == len(names)  # one record per entry: read, hidden, or (a second name with the same safe id)
    ids = [i.doc_id for i in items if isinstance(i, Document)]
    assert len(ids) == len(set(ids))


JSON_SCALAR = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(ANY_CHAR, max_size=20)
JSON = st.recursive(
    JSON_SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(ANY_CHAR, max_size=8), inner, max_size=4),
    max_leaves=12,
)
ROW = st.fixed_dictionaries(
    {},
    optional={"id": st.integers() | st.text(ANY_CHAR, max_size=12) | JSON, "_id": JSON,
              "text": st.text(ANY_CHAR, max_size=40) | JSON, "title": JSON, "metadata": JSON, "extra": JSON},
)


@FAST
@given(rows=st.lists(ROW | JSON, min_size=1, max_size=12), gz=st.booleans())
def test_arbitrary_json_rows_never_raise_and_every_row_is_one_record(rows: list[Any], gz: bool) -> None:
    body = "".join(json.dumps(r) + "\n" for r in rows).encode("ascii")  # \\u escapes carry any surrogate through
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("rows.jsonl.gz" if gz else "rows.jsonl")
        path.write_bytes(gzip.compress(body) if gz else body)
        items = list(iter_documents([path], max_bytes=300))
    _accounted(items)
    assert len(items) == len(rows)  # no line of json.dumps output is blank
    assert all(it.source.endswith(f":{n}") for n, it in enumerate(items, start=1) if not isinstance(it, Document))


@FAST
@given(data=st.binary(max_size=2000), gz=st.booleans(), cut=st.integers(min_value=0, max_value=4000))
def test_arbitrary_bytes_as_records_never_raise(data: bytes, gz: bool, cut: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("x.jsonl.gz" if gz else "x.jsonl")
        path.write_bytes(gzip.compress(data)[:cut] if gz else data)
        items = list(iter_documents([path], max_bytes=200))
    _accounted(items)
    assert len(items) <= data.count(b"\n") + 2


def word_offsets(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]


@settings(max_examples=150, deadline=None, database=None)
@given(
    text=st.text(ANY_CHAR, max_size=600),
    title=st.text(ANY_CHAR, max_size=120),
    budget=st.integers(min_value=16, max_value=80),
    max_tokens=st.none() | st.integers(min_value=16, max_value=80),
    overlap=st.integers(min_value=0, max_value=40),
    max_title=st.integers(min_value=0, max_value=60),
)
def test_chunks_cover_every_token_and_keep_the_budget(
    text: str, title: str, budget: int, max_tokens: int | None, overlap: int, max_title: int
) -> None:
    try:
        result = chunk_text(text, title, offsets_of=word_offsets, max_passage_tokens=budget, max_tokens=max_tokens,
                            overlap=overlap, max_title_tokens=max_title)
    except DocumentError as e:
        assert e.reason == "empty" and not word_offsets(text)
        return
    limit = budget if max_tokens is None else min(budget, max_tokens)
    chunks = result.chunks
    assert [c.index for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        assert text[c.start : c.end] == c.text
        assert len(word_offsets(c.encoder_text)) <= limit
    for a, b in zip(chunks, chunks[1:], strict=False):
        assert a.start < b.start and not text[a.end : b.start].strip()  # windows meet or overlap
    for start, end in word_offsets(text):  # nothing lost: every token lies in some chunk
        assert any(c.start <= start and end <= c.end for c in chunks)
