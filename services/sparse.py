"""BM25 sparse vectors for hybrid retrieval, the same at ingest time and at query time, for both store adapters.

Wraps the BM25 embedder built into qdrant-edge (``qdrant_edge.Bm25``): pure Rust, no model download, no server
round trip, ~15 µs per passage. Both adapters store the result in the ``bm25`` named sparse vector with the IDF
modifier, so the *engine* supplies the IDF part from the collection's own statistics; this module only
produces the term-frequency half:

- document side (``embed_document``): BM25 term-frequency weights ``tf * (k + 1) / (tf + k * (1 - b + b * len /
  avg_len))`` with ``k=1.2``, ``b=0.75``, ``avg_len=256`` tokens;
- query side (``embed_query``): every distinct query token gets weight 1.0.

Tokenisation (``Bm25Config`` defaults of qdrant-edge 0.9.0, measured): the ``Word`` tokenizer (Unicode word
boundaries), lower-casing on, English stopwords removed ("the", "and", "are", ...), English Snowball stemming
("foxes" -> "fox", "JUMPING" -> "jump"), no ASCII folding ("café" and "cafe" are different tokens), no token
length limits. Each token is hashed to a 32-bit index, so there is no vocabulary file to keep in sync.

A text made only of stopwords embeds to an empty vector; adapters store such a point without a sparse vector.
Documents and queries must go through the *same* configuration, otherwise query tokens hash to indices no
document carries: build one ``Bm25Embedder`` per process (``default_embedder()``) and keep its ``config()``
with the collection (e.g. in ``CollectionSpec.settings["bm25"]``) if you change the defaults.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from typing import Any

from qdrant_edge import Bm25, Bm25Config

from services.errors import ConfigError
from services.store.points import SparseVector

log = logging.getLogger(__name__)

DEFAULT_LANGUAGE = "english"
DEFAULT_K = 1.2
DEFAULT_B = 0.75
DEFAULT_AVG_LEN = 256.0


class Bm25Embedder:
    """BM25 term weights as ``SparseVector``: ``embed_document`` at ingest, ``embed_query`` at query time."""

    def __init__(
        self,
        *,
        language: str = DEFAULT_LANGUAGE,
        k: float = DEFAULT_K,
        b: float = DEFAULT_B,
        avg_len: float = DEFAULT_AVG_LEN,
    ) -> None:
        self._config = {"language": language, "k": float(k), "b": float(b), "avg_len": float(avg_len)}
        try:
            self._bm25 = Bm25(Bm25Config(k=k, b=b, avg_len=avg_len, language=language))
        except ValueError as e:
            raise ConfigError(
                f"invalid BM25 configuration {self._config}: {e}; use a supported language such as 'english', "
                "0 <= b <= 1, k >= 0 and avg_len > 0"
            ) from e

    def config(self) -> dict[str, Any]:
        """The tokenisation and weighting parameters, JSON-ready (store them with the collection)."""
        return dict(self._config)

    def embed_document(self, text: str) -> SparseVector:
        """Passage side: BM25 term-frequency weights (the engine applies IDF)."""
        return _convert(self._bm25.embed_document(text))

    def embed_documents(self, texts: Iterable[str]) -> list[SparseVector]:
        return [self.embed_document(t) for t in texts]

    def embed_query(self, text: str) -> SparseVector:
        """Question side: weight 1.0 per distinct token, same tokenisation as the documents."""
        return _convert(self._bm25.embed_query(text))


@functools.cache
def default_embedder() -> Bm25Embedder:
    """One embedder with the default configuration per process."""
    return Bm25Embedder()


def _convert(vector: Any) -> SparseVector:
    return SparseVector(indices=list(vector.indices), values=[float(v) for v in vector.values])
