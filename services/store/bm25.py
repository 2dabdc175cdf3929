"""BM25 length normalisation from the collection's own statistics, per generation (the store's half of BM25).

The engine's IDF modifier supplies BM25's IDF from the generation's own document frequencies; the other half,
the saturated and length-normalised term frequency ``tf * (k + 1) / (tf + k * (1 - b + b * len / avg_len))``, is
baked into each stored document vector. ``avg_len`` must be the generation's own average passage length (in the
tokens the sparse vectors use), so the store keeps it:

- every sparse vector made by ``services.store.sparse.Bm25Embedder.embed_document`` carries its raw term counts
  (``SparseVector.counts``); the passage length is their sum;
- ``Store.upsert`` records each point's length in its payload (``bm25_len``) and keeps a small stats record in
  the generation's spec (``settings["bm25_stats"]``: the generation's name, total tokens, passage count),
  subtracting the lengths of the points a write overwrites or deletes; ``delete_documents`` / ``delete_stale``
  subtract theirs;
- before writing, ``Store.upsert`` re-weights the batch's vectors with the generation's average length *including
  the batch* (``renormalized``), so the first batch of a new collection is normalised with its own average and
  not a fixed prior.

Points keep the average of the moment they were written (``bm25_avg`` in the payload): when a collection's
average moves later, older points drift from the exact BM25. The stats record keeps the range of averages the
generation's points were weighted with (``low``/``high``); ``Store.bm25_renormalize`` (run by ``optimize``, and on
the embedded engine by ``maybe_optimize`` at the end of every ingest job and re-embed) re-weights the points whose
average is more than ``DRIFT`` off the current one, from their stored vectors (``recover_counts`` gives back the
integer term counts), so no text is tokenised again and no dense vector is recomputed. Points written before this record
existed (no ``bm25_len``: weighted with the 256-token prior) are counted and re-weighted the same way on the
first ``dpr optimize`` (the record's ``complete`` is False until then).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.store.points import CollectionSpec, SparseVector

STATS_KEY = "bm25_stats"  # the stats record inside CollectionSpec.settings
LENGTH_FIELD = "bm25_len"  # a point's passage length in BM25 tokens, in its payload
AVG_FIELD = "bm25_avg"  # the average length its stored weights were computed with, in its payload
DRIFT = 0.05  # a point weighted with an average more than 5% off the generation's is re-weighted by optimize
CONFIG_KEY = "bm25"  # the tokenisation / weighting configuration inside CollectionSpec.settings (services.store.sparse)
DEFAULT_K = 1.2
DEFAULT_B = 0.75


@dataclasses.dataclass(frozen=True)
class Bm25Stats:
    """Total tokens and passage count of one generation's points that carry a length."""

    generation: str
    tokens: float = 0.0
    passages: int = 0
    low: float | None = None  # the lowest / highest average the generation's points were weighted with
    high: float | None = None
    complete: bool = True  # False: the generation holds points from before the record (not counted yet)

    @property
    def avg_len(self) -> float | None:
        return self.tokens / self.passages if self.passages > 0 else None

    def add(self, lengths: Iterable[float], sign: int = 1) -> Bm25Stats:
        values = list(lengths)
        return dataclasses.replace(
            self, tokens=max(0.0, self.tokens + sign * sum(values)), passages=max(0, self.passages + sign * len(values))
        )

    def weighted_with(self, avg: float) -> Bm25Stats:
        return dataclasses.replace(self, low=avg if self.low is None else min(self.low, avg),
                                   high=avg if self.high is None else max(self.high, avg))

    def drifted(self, tolerance: float = DRIFT) -> bool:
        """Some point may be weighted with an average more than ``tolerance`` off the current one."""
        avg = self.avg_len
        if not self.complete:
            return True
        if avg is None or self.low is None or self.high is None:
            return False
        return off(self.low, avg, tolerance) or off(self.high, avg, tolerance)

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "tokens": self.tokens, "passages": self.passages,
                "avg_len": None if self.avg_len is None else round(self.avg_len, 4), "low": self.low,
                "high": self.high, "complete": self.complete}


def off(used: float, avg: float, tolerance: float = DRIFT) -> bool:
    return abs(used / avg - 1.0) > tolerance if avg > 0 else False


def read_stats(spec: CollectionSpec, generation: str) -> Bm25Stats:
    """The generation's stats record; empty when there is none or it was copied from another generation."""
    data = spec.settings.get(STATS_KEY)
    if not isinstance(data, Mapping) or data.get("generation") != generation:
        return Bm25Stats(generation)

    def number(key: str) -> float | None:
        value = data.get(key)
        return float(value) if isinstance(value, int | float) else None

    return Bm25Stats(generation, float(data.get("tokens", 0.0)), int(data.get("passages", 0)), number("low"),
                     number("high"), bool(data.get("complete", True)))


def has_stats(spec: CollectionSpec, generation: str) -> bool:
    data = spec.settings.get(STATS_KEY)
    return isinstance(data, Mapping) and data.get("generation") == generation


def prior(spec: CollectionSpec) -> float:
    """The average length vectors made without the store's re-weighting used (the configured ``avg_len``)."""
    return float((spec.settings.get(CONFIG_KEY) or {}).get("avg_len", 256.0))


def params(spec: CollectionSpec) -> tuple[float, float]:
    """``(k, b)`` the generation's vectors are weighted with."""
    config = spec.settings.get(CONFIG_KEY) or {}
    return float(config.get("k", DEFAULT_K)), float(config.get("b", DEFAULT_B))


def weights(counts: Sequence[float], avg_len: float, k: float, b: float) -> list[float]:
    """BM25's term-frequency half for one passage: ``tf * (k + 1) / (tf + k * (1 - b + b * len / avg_len))``."""
    length = float(sum(counts))
    norm = 1.0 - b + b * length / avg_len if avg_len > 0 else 1.0
    return [tf * (k + 1.0) / (tf + k * norm) for tf in counts]


def recover_counts(values: Sequence[float], used: float, k: float, b: float, length: float | None = None
                   ) -> list[float]:
    """The integer term counts behind stored weights computed with average ``used`` (inverting ``weights``):
    ``tf = w k N / (k + 1 - w)`` with ``N = 1 - b + b len / used``; without ``length`` it is solved from the
    weights themselves (``S = sum(k w / (k + 1 - w)) = len / N``, so ``len = S (1 - b) / (1 - S b / used)``)."""
    ratios = [k * w / (k + 1.0 - w) if w < k + 1.0 else 0.0 for w in values]
    if length is None:
        total = sum(ratios)
        length = total * (1.0 - b) / max(1e-9, 1.0 - total * b / used)
    norm = 1.0 - b + b * length / used
    return [float(max(1, round(r * norm))) for r in ratios]


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
