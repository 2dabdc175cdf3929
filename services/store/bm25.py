"""BM25 length normalisation from the collection's own statistics, per generation (the store's half of BM25).

The engine's IDF modifier supplies BM25's IDF from the generation's own document frequencies; the other half,
the saturated and length-normalised term frequency ``tf * (k + 1) / (tf + k * (1 - b + b * len / avg_len))``, is
baked into each stored document vector. ``avg_len`` must be the generation's own average passage length (in the
tokens the sparse vectors use), so the store keeps it:

- every sparse vector made by ``services.sparse.Bm25Embedder.embed_document`` carries its raw term counts
  (``SparseVector.counts``); the passage length is their sum;
- ``Store.upsert`` records each point's length in its payload (``bm25_len``) and keeps a small stats record in
  the generation's spec (``settings["bm25_stats"]``: the generation's name, total tokens, passage count),
  subtracting the lengths of the points a write overwrites or deletes; ``delete_documents`` / ``delete_stale``
  subtract theirs;
- before writing, ``Store.upsert`` re-weights the batch's vectors with the generation's average length *including
  the batch* (``renormalized``), so the first batch of a new collection is normalised with its own average and
  not a fixed prior.

Points keep the average of the moment they were written: when a collection's average moves later, older points
drift from the exact BM25 by the ratio of the two averages (bounded; measured in docs/hybrid.md). A re-embed
(`dpr reembed`) rebuilds every point at the current average. Points written before this record existed carry no
``bm25_len`` and are not counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.store.points import CollectionSpec, SparseVector

STATS_KEY = "bm25_stats"  # the stats record inside CollectionSpec.settings
LENGTH_FIELD = "bm25_len"  # a point's passage length in BM25 tokens, in its payload
CONFIG_KEY = "bm25"  # the tokenisation / weighting configuration inside CollectionSpec.settings (services.sparse)
DEFAULT_K = 1.2
DEFAULT_B = 0.75


@dataclasses.dataclass(frozen=True)
class Bm25Stats:
    """Total tokens and passage count of one generation's points that carry a length."""

    generation: str
    tokens: float = 0.0
    passages: int = 0

    @property
    def avg_len(self) -> float | None:
        return self.tokens / self.passages if self.passages > 0 else None

    def add(self, lengths: Iterable[float], sign: int = 1) -> Bm25Stats:
        values = list(lengths)
        return dataclasses.replace(
            self, tokens=max(0.0, self.tokens + sign * sum(values)), passages=max(0, self.passages + sign * len(values))
        )

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "tokens": self.tokens, "passages": self.passages,
                "avg_len": None if self.avg_len is None else round(self.avg_len, 4)}


def read_stats(spec: CollectionSpec, generation: str) -> Bm25Stats:
    """The generation's stats record; empty when there is none or it was copied from another generation."""
    data = spec.settings.get(STATS_KEY)
    if not isinstance(data, Mapping) or data.get("generation") != generation:
        return Bm25Stats(generation)
    return Bm25Stats(generation, float(data.get("tokens", 0.0)), int(data.get("passages", 0)))


def params(spec: CollectionSpec) -> tuple[float, float]:
    """``(k, b)`` the generation's vectors are weighted with."""
    config = spec.settings.get(CONFIG_KEY) or {}
    return float(config.get("k", DEFAULT_K)), float(config.get("b", DEFAULT_B))


def weights(counts: Sequence[float], avg_len: float, k: float, b: float) -> list[float]:
    """BM25's term-frequency half for one passage: ``tf * (k + 1) / (tf + k * (1 - b + b * len / avg_len))``."""
    length = float(sum(counts))
    norm = 1.0 - b + b * length / avg_len if avg_len > 0 else 1.0
    return [tf * (k + 1.0) / (tf + k * norm) for tf in counts]


def length(vector: SparseVector | None) -> float | None:
    """The passage length a vector was made from (None: a vector without counts, e.g. a test double's)."""
    if vector is None or vector.counts is None:
        return None
    return float(sum(vector.counts))


def renormalized(vector: SparseVector, avg_len: float, k: float, b: float) -> SparseVector:
    """``vector`` re-weighted for ``avg_len`` from its raw counts (as it is when it has none)."""
    if vector.counts is None:
        return vector
    return dataclasses.replace(vector, values=weights(vector.counts, avg_len, k, b), avg_len=avg_len)
