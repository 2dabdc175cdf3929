"""The passage tower over passages, one way for ingest and re-embed alike: ``passage_points`` (the tower by token
length, ``encode_by_length``, and BM25) pairs each passage with its vectors as the point the store writes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from encoders.batching import length_slices
from encoders.towers import DualEncoder
from services.store.points import Passage, PassagePoint
from services.store.sparse import SparseEncoder

if TYPE_CHECKING:
    import numpy as np


def encode_by_length(towers: DualEncoder, texts: list[str], lengths: list[int] | None, batch_size: int
                     ) -> np.ndarray:
    """The passage tower over ``texts`` in batches of similar token length, vectors back in the input order.

    A batch pads to its longest passage, so the passages of the whole ingest batch (every document in it) are
    sorted by ``lengths`` (longest first) and cut where padding would cost more than another call
    (``encoders.batching.length_slices``, at most ``batch_size`` rows); each backend gets batches it cannot pad
    much, whether or not it sorts on its own. Without ``lengths`` (a re-embed: the stored text, not yet tokenised
    by the new tower) the tower gets them all at once and cuts its own batches by length (ONNX / OpenVINO:
    ``length_slices`` over its own encodings; sentence-transformers sorts by length): no second tokenising."""
    import numpy as np

    if lengths is None:
        return towers.encode_documents(texts, batch_size=batch_size)
    slices = length_slices(lengths, batch_size)
    order = [i for s in slices for i in s]
    parts = [
        towers.encode_documents([texts[i] for i in s], batch_size=batch_size) for s in slices
    ]  # each (<= batch_size, dim)
    if not parts:
        return towers.encode_documents([], batch_size=batch_size)
    ordered = np.concatenate(parts)  # (n, dim), longest first
    vectors = np.empty_like(ordered)
    vectors[order] = ordered
    return vectors


def passage_points(
    passages: Sequence[Passage], texts: list[str], lengths: list[int] | None, *, towers: DualEncoder,
    sparse: SparseEncoder | None, batch_size: int, seconds: dict[str, float] | None = None,
) -> list[PassagePoint]:
    """Each passage with its dense vector (the passage tower over ``texts``, what the tower reads of each: title ›
    heading path + text; ``lengths``: their tokens, if known) and its BM25 vector when ``sparse``. ``seconds`` gets the
    time spent in the tower (``encode``) and in BM25 (``sparse``)."""
    t0 = time.perf_counter()
    vectors = encode_by_length(towers, texts, lengths, batch_size)  # (n_passages, dim)
    t1 = time.perf_counter()
    sparse_vectors = [sparse.embed_document(t) for t in texts] if sparse is not None else None
    if seconds is not None:
        seconds["encode"], seconds["sparse"] = t1 - t0, time.perf_counter() - t1
    # a row of the float32 matrix, not a list: the store only takes its length and turns each engine batch into
    # floats (``points.point_vectors``), so a 2,400-page document never holds every vector as Python floats at
    # once (~14 KB a passage as a list, ~100 bytes as a row)
    return [PassagePoint(passage=p, dense=cast("list[float]", vectors[i]),
                         sparse=sparse_vectors[i] if sparse_vectors is not None else None)
            for i, p in enumerate(passages)]
