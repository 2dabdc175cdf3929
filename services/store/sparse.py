"""BM25 sparse vectors for hybrid retrieval, the same at ingest time and at query time, for both store adapters,
in the collection's language.

Wraps the BM25 embedder built into qdrant-edge (``qdrant_edge.Bm25``): pure Rust, no model download, no server
round trip, ~15 µs per passage. Both adapters store the result in the ``bm25`` named sparse vector with the IDF
modifier, so the *engine* supplies the IDF part from the collection's own statistics; this module only
produces the term-frequency half:

- document side (``embed_document``): BM25 term-frequency weights ``tf * (k + 1) / (tf + k * (1 - b + b * len /
  avg_len))`` with ``k=1.2``, ``b=0.75``; the vector also carries its raw term counts (``SparseVector.counts``),
  and the store re-weights it with the generation's *own* average passage length before writing it
  (``services.store.bm25``: a stats record per generation, kept current on upsert and delete). ``avg_len`` here
  (256 tokens by default) is only the prior a vector has before it reaches a store;
- query side (``embed_query``): every distinct query token weighted by how often the question has it, so the
  score sums over the question's tokens, repeats included, as Lucene's and bm25s' BM25 do (a long question that
  says "retrieval" three times weighs it three times; CISI's paragraph-long questions gain most).

Tokenisation is a per-collection language choice (``services.ingest.language`` decides it when a collection is created):

- ``en`` (the default, and what every collection without a stored configuration uses): the engine's ``Word``
  tokenizer (Unicode word boundaries), lower-casing, English stopwords removed ("the", "and", ...), English
  Snowball stemming ("foxes" -> "fox"), no ASCII folding ("café" and "cafe" differ), no length limits. Another
  Snowball language name (``german``, ...) works the same way with that language's rules.
- ``ko``: Kiwi morphological analysis (``encoders.korean.korean_terms``: nouns, verb/adjective stems, roots,
  foreign words, numbers, Hanja; particles, endings and punctuation dropped; Latin lower-cased), the terms
  joined by spaces and fed to the engine's ``Whitespace`` tokenizer with no stopwords and no stemming.

Either way each token is hashed by the engine to a 32-bit index (the same token gets the same index in every
process and both languages), so there is no vocabulary file to keep in sync.

A text made only of stopwords embeds to an empty vector; adapters store such a point without a sparse vector.
Documents and queries must go through the *same* configuration, otherwise query tokens hash to indices no
document carries: the configuration is stored with the collection (``CollectionSpec.settings["bm25"]``, written
by ``services.ingest.language.collection_spec``) and ``for_spec`` gives the embedder a collection was built
with; ingest, query and re-embed all go through it. ``default_embedder()`` (what a Runtime uses) has no language
chosen: the collection it creates gets the detected one.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from services.core.errors import ConfigError
from services.store.bm25 import weights
from services.store.points import CollectionSpec, SparseVector

log = logging.getLogger(__name__)

BM25_KEY = "bm25"  # the BM25 configuration inside CollectionSpec.settings
DEFAULT_LANGUAGE = "en"
DEFAULT_K = 1.2
DEFAULT_B = 0.75
DEFAULT_AVG_LEN = 256.0  # the prior only: the store re-weights with the generation's own average (store.bm25)
COUNT_K = 1000.0  # the counting engine's k; with b = 0 its weight w = tf (k + 1) / (tf + k), so tf = k w / (k + 1 - w)
ALIASES = {"english": "en", "korean": "ko"}  # long names accepted, stored as the short code


class SparseEncoder(Protocol):
    """What ingest, query and re-embed need of a sparse encoder (``Bm25Embedder`` is the one the product has)."""

    def embed_document(self, text: str) -> SparseVector: ...

    def embed_query(self, text: str) -> SparseVector: ...


def canonical_language(language: str) -> str:
    """``en`` / ``ko`` for their long names; another Snowball language name as given (lower case)."""
    lang = language.strip().lower()
    return ALIASES.get(lang, lang)


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
        from qdrant_edge import Bm25, Bm25Config, DisabledStemmer, StopwordsSet, TokenizerType  # on first use only

        lang = canonical_language(language)
        self._config = {"language": lang, "k": float(k), "b": float(b), "avg_len": float(avg_len)}
        self._korean = lang == "ko"
        self._avg_len, self._k, self._b = float(avg_len), float(k), float(b)
        try:
            def make(k: float, b: float) -> Any:
                if self._korean:  # the terms come from Kiwi: the engine only splits on spaces and hashes
                    return Bm25Config(k=k, b=b, avg_len=avg_len, tokenizer=TokenizerType.Whitespace, lowercase=True,
                                      stopwords=StopwordsSet(languages=set(), custom=set()),
                                      stemmer=DisabledStemmer())
                return Bm25Config(k=k, b=b, avg_len=avg_len, language="english" if lang == "en" else lang)

            Bm25(make(k, b))  # the engine checks k, b and avg_len (weights() computes the document side)
            self._counter = Bm25(make(COUNT_K, 0.0))  # the same tokens and hashes, weights that give back tf
        except ValueError as e:
            raise ConfigError(
                f"invalid BM25 configuration {self._config}: {e}; use language 'en', 'ko' or another Snowball "
                "language such as 'german', 0 <= b <= 1, k >= 0 and avg_len > 0"
            ) from e

    @property
    def language(self) -> str:
        return str(self._config["language"])

    def config(self) -> dict[str, Any]:
        """The tokenisation and weighting parameters, JSON-ready (stored with the collection)."""
        return dict(self._config)

    def _text(self, text: str) -> str:
        if self._korean:
            from encoders.korean import korean_terms

            return " ".join(korean_terms(text))
        return text

    def embed_document(self, text: str) -> SparseVector:
        """Passage side: BM25 term-frequency weights (the engine applies IDF) with this embedder's ``avg_len``,
        and the raw term counts, so a store can re-weight it with its own average length."""
        indices, counts = self._counts(text)
        avg_len, k, b = self._avg_len, self._k, self._b
        return SparseVector(indices=indices, values=weights(counts, avg_len, k, b), counts=counts, avg_len=avg_len)

    def _counts(self, text: str) -> tuple[list[int], list[float]]:
        """Token indices and how often ``text`` has each (the counting engine's weights turned back into tf)."""
        counted = self._counter.embed_document(self._text(text))
        return list(counted.indices), [float(max(1, round(COUNT_K * w / (COUNT_K + 1.0 - w)))) for w in counted.values]

    def term_counts(self, text: str) -> dict[int, int]:
        """Token index -> count in ``text``, as the document vectors see it (e.g. for a reference BM25)."""
        indices, counts = self._counts(text)
        return {i: int(c) for i, c in zip(indices, counts, strict=True)}

    def embed_query(self, text: str) -> SparseVector:
        """Question side: each distinct token weighted by its count in the question (same tokenisation as the
        documents; the engine multiplies by IDF and the document's weight and sums)."""
        indices, counts = self._counts(text)
        return SparseVector(indices=indices, values=counts)


class AutoBm25(Bm25Embedder):
    """The English defaults, with the language not chosen: a collection created through it gets the language
    detected on the documents that create it (``services.ingest.language.for_new_collection``); an existing collection's
    stored language wins as always (``for_spec``)."""


@functools.cache
def default_embedder() -> Bm25Embedder:
    """The process's embedder when no language was chosen (``AutoBm25``: English; detection on creation)."""
    return AutoBm25()


def embedder_for(config: Mapping[str, Any] | str | None) -> Bm25Embedder:
    """The process's embedder for a stored configuration (or a bare language); None: the defaults."""
    if isinstance(config, str):
        config = {"language": config}
    full = normalized_config(config)
    return _cached(full["language"], full["k"], full["b"], full["avg_len"])


def normalized_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """A stored configuration with the defaults filled in and the language in its short form."""
    config = dict(config or {})
    return {
        "language": canonical_language(str(config.get("language") or DEFAULT_LANGUAGE)),
        "k": float(config.get("k", DEFAULT_K)),
        "b": float(config.get("b", DEFAULT_B)),
        "avg_len": float(config.get("avg_len", DEFAULT_AVG_LEN)),
    }


@functools.cache
def _cached(language: str, k: float, b: float, avg_len: float) -> Bm25Embedder:
    return Bm25Embedder(language=language, k=k, b=b, avg_len=avg_len)


def spec_config(spec: CollectionSpec) -> dict[str, Any]:
    """The BM25 configuration a collection was built with (none stored: a collection from before languages, so
    the English defaults it was built with)."""
    return normalized_config(spec.settings.get(BM25_KEY))


def spec_language(spec: CollectionSpec) -> str:
    return str(spec_config(spec)["language"])


def for_spec(spec: CollectionSpec, given: Any) -> Any:
    """The sparse encoder to use on a collection built as ``spec``: ``given`` when it is that configuration (or
    is not a ``Bm25Embedder``: a test double, or None), else the process's embedder for the stored one."""
    if not isinstance(given, Bm25Embedder):
        return given
    wanted = spec_config(spec)
    return given if given.config() == wanted else embedder_for(wanted)
