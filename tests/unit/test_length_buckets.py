"""Length bucketing: the passages of a whole ingest batch are encoded in batches of similar token length, and the
vectors land on the passages they belong to."""

from __future__ import annotations

import numpy as np
import pytest
from kit.fakes import FakeRuntime, HashTowers

from services.chunking import chunk_text
from services.ingest import encode_by_length
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
    assert [len(c) for c in towers.calls] == [2, 2, 2, 1]
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
        report = pipeline.ingest(docs)
        assert report.chunks == 6 and not report.failed
        assert towers.calls == [[31, 30], [29, 6], [5, 4]]  # one ingest batch, bucketed across its documents
        hits = runtime.search("t3w7", QueryOptions(k=1, mode="dense"))
        assert hits[0].passage.doc_id == "d3"  # each vector stored on its own passage
