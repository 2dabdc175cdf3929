"""Length bucketing: the passages of a whole ingest batch are encoded in batches of similar token length, and the
vectors land on the passages they belong to."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kit.fakes import FakeRuntime, HashTowers, ingest_items

from encoders.batching import CALL_TOKENS, length_slices
from services.ingest.chunking import chunk_text
from services.ingest.encoding import encode_by_length
from services.query import QueryOptions
from services.readers import Document

pytestmark = pytest.mark.unit


class BatchRecordingTowers(HashTowers):
    """Hashing towers that remember the token lengths of every passage-tower call."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.calls: list[list[int]] = []

    def encode_documents(self, passages: list[str], batch_size: int = 32) -> np.ndarray:
        self.calls.append([len(self.passage_token_offsets(p)) for p in passages])
        return super().encode_documents(passages, batch_size)


def test_vectors_come_back_in_input_order() -> None:
    towers = BatchRecordingTowers()
    texts = [" ".join(f"w{i}x{j}" for j in range(n)) for i, n in enumerate([3, 40, 7, 25, 1, 12, 30])]
    lengths = [len(towers.passage_token_offsets(t)) for t in texts]
    vectors = encode_by_length(towers, texts, lengths, batch_size=2)
    assert vectors.shape == (len(texts), towers.dim)
    np.testing.assert_array_equal(vectors, HashTowers().encode_documents(texts))
    assert [len(c) for c in towers.calls] == [1, 2, 2, 2]  # the longest alone: it would double its partner
    flat = [n for call in towers.calls for n in call]
    assert flat == sorted(lengths, reverse=True)  # longest first, so each batch pads to its own length


def test_empty_input_gives_an_empty_matrix() -> None:
    assert encode_by_length(HashTowers(dim=8), [], [], batch_size=4).shape == (0, 8)


def test_chunks_carry_their_token_count() -> None:
    towers = HashTowers(max_passage_tokens=24)
    text = " ".join(f"word{i}" for i in range(70)) + ", the end."
    result = chunk_text(text, "A title, short", offsets_of=towers.passage_token_offsets,
                        max_passage_tokens=towers.max_passage_tokens, overlap=4)
    assert len(result.chunks) > 2
    for c in result.chunks:
        assert c.tokens == len(towers.passage_token_offsets(c.encoder_text))


def test_ingest_buckets_across_documents() -> None:
    towers = BatchRecordingTowers(max_passage_tokens=40)
    lengths = [5, 30, 6, 29, 4, 31]  # one passage per document, short and long interleaved
    docs = [Document(doc_id=f"d{i}", text=" ".join(f"t{i}w{j}" for j in range(n)), source=f"d{i}")
            for i, n in enumerate(lengths)]
    with FakeRuntime(towers=towers) as runtime:
        pipeline = runtime.pipeline
        pipeline.batch_size = 2
        report = ingest_items(pipeline, docs)
        assert report.chunks == 6 and not report.failed
        assert towers.calls == [[31, 30], [29, 6], [5, 4]]  # one ingest batch, bucketed across its documents
        hits = runtime.search("t3w7", QueryOptions(k=1, mode="dense"))
        assert hits[0].passage.doc_id == "d3"  # each vector stored on its own passage


def _cost(slices: list[list[int]], lengths: list[int], call: int) -> int:
    return sum(call + len(s) * max(max(1, lengths[i]) for i in s) for s in slices)


def _brute_force(lengths: list[int], cap: int, call: int) -> int:
    """The cheapest contiguous cut of the longest-first order, by trying every cut."""
    width = sorted((max(1, n) for n in lengths), reverse=True)
    best = {len(width): 0}
    for a in range(len(width) - 1, -1, -1):
        best[a] = min(call + (b - a) * width[a] + best[b] for b in range(a + 1, min(len(width), a + cap) + 1))
    return best[0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=40), st.integers(1, 12), st.integers(0, 400))
def test_length_slices_are_a_cheapest_cover(lengths: list[int], cap: int, call: int) -> None:
    slices = length_slices(lengths, cap, call_tokens=call)
    assert sorted(i for s in slices for i in s) == list(range(len(lengths)))  # every passage exactly once
    assert all(1 <= len(s) <= cap for s in slices)
    flat = [lengths[i] for s in slices for i in s]
    assert flat == sorted(lengths, reverse=True)
    assert _cost(slices, lengths, call) == _brute_force(lengths, cap, call)


def test_a_long_passage_does_not_pad_the_short_ones() -> None:
    lengths = [256] + [20] * 31  # one full chunk and the short tails of other documents
    fixed = _cost([list(range(32))], lengths, CALL_TOKENS)
    slices = length_slices(lengths, 32)
    assert [len(s) for s in slices] == [1, 31]
    assert _cost(slices, lengths, CALL_TOKENS) < fixed / 4
    assert [len(s) for s in length_slices([200] * 70, 32)] == [32, 32, 6]  # equal lengths: full batches
