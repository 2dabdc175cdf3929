"""BM25 (bm25s) over a corpus: the lexical baseline and the source of hard negatives.

Tokenisation follows ``BM25Config.language``: ``en`` (English stopwords, Snowball stemming) or ``ko`` (Kiwi content
morphemes, ``encoders.korean``: particles and endings dropped, no stopword list, no stemming); the caller decides
the language (``services.language``).

Hard negatives for a question are BM25's top-ranked passages inside a rank window that are not labelled relevant,
are not the positive itself and (for SQuAD-style data) do not contain a gold answer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from encoders.data import CorpusDoc, TrainPair
from encoders.metrics import has_answer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BM25Config:
    k1: float = 1.5
    b: float = 0.75
    stopwords: str | None = "en"
    stemmer: str | None = "english"  # Snowball via PyStemmer; None: no stemming
    language: str = "en"  # "ko": Kiwi morphemes instead of word tokens (stopwords and stemmer are not used)

    @classmethod
    def for_language(cls, language: str) -> BM25Config:
        """The defaults for ``en``, or Korean morphemes for ``ko``."""
        if language == "ko":
            return cls(stopwords=None, stemmer=None, language="ko")
        if language != "en":
            raise ValueError(f"BM25 language {language!r} is not supported here; use en or ko")
        return cls()

    def describe(self) -> str:
        words = "Kiwi content morphemes" if self.language == "ko" else (
            f"word tokens, stopwords {self.stopwords or 'none'}, Snowball stemming {self.stemmer or 'off'}")
        return f"bm25s ({self.language}: {words}), k1 {self.k1:g}, b {self.b:g}"


class BM25Index:
    """bm25s over ``docs`` (title + text). ``search`` returns (doc id, score) lists, best first."""

    def __init__(self, docs: Sequence[CorpusDoc], config: BM25Config | None = None) -> None:
        import bm25s
        from bm25s.tokenization import Tokenizer

        if not docs:
            raise ValueError("BM25 needs at least one document")
        self.config = config or BM25Config()
        self.doc_ids = [d.doc_id for d in docs]
        if self.config.language == "ko":
            from encoders.korean import korean_terms

            self._tokenizer = Tokenizer(lower=False, splitter=korean_terms, stopwords=[], stemmer=None)
        else:
            self._tokenizer = Tokenizer(stopwords=self.config.stopwords or [], stemmer=_stemmer(self.config.stemmer))
        corpus_tokens = self._tokenizer.tokenize(
            [d.passage for d in docs], update_vocab=True, return_as="tuple", show_progress=False
        )
        self._retriever = bm25s.BM25(k1=self.config.k1, b=self.config.b)
        self._retriever.index(corpus_tokens, show_progress=False)

    def search(self, queries: Sequence[str], k: int = 100) -> list[list[tuple[str, float]]]:
        if not queries:
            return []
        k = min(k, len(self.doc_ids))
        ids = self._tokenizer.tokenize(list(queries), update_vocab=False, return_as="ids", show_progress=False)
        # A query with no known token gets one unknown id; bm25s then scores every document 0.
        ids = [q if q else [0] for q in ids]
        results, scores = self._retriever.retrieve(ids, k=k, show_progress=False, n_threads=1)  # (n_queries, k)
        out: list[list[tuple[str, float]]] = []
        for row_ids, row_scores in zip(results, scores, strict=True):
            out.append([(self.doc_ids[int(i)], float(s)) for i, s in zip(row_ids, row_scores, strict=True)])
        return out


def _stemmer(name: str | None):  # type: ignore[no-untyped-def]
    if not name:
        return None
    try:
        import Stemmer
    except ImportError as e:
        raise RuntimeError("BM25 stemming needs PyStemmer: pip install PyStemmer (or set stemmer=None)") from e
    return Stemmer.Stemmer(name)  # bm25s uses its stemWord method


@dataclass(frozen=True)
class MiningConfig:
    num_negatives: int = 1
    rank_start: int = 0  # first BM25 rank (0-based) searched; > 0 skips the very top (likely false negatives)
    rank_end: int = 30  # ranks [rank_start, rank_end) are searched


def mine_hard_negatives(
    pairs: Sequence[TrainPair],
    index: BM25Index,
    corpus: dict[str, CorpusDoc],
    config: MiningConfig | None = None,
) -> list[TrainPair]:
    """Return ``pairs`` with ``config.num_negatives`` BM25 negatives each (fewer when the window runs dry).

    A candidate is skipped if it is labelled relevant (``relevant_ids``), is the positive passage, or contains a gold
    answer of the question. Existing negatives are kept and count toward the number.
    """
    config = config or MiningConfig()
    if config.num_negatives <= 0:
        return list(pairs)
    if not 0 <= config.rank_start < config.rank_end:
        raise ValueError(f"rank window [{config.rank_start}, {config.rank_end}) is empty")
    questions = sorted({p.question for p in pairs})
    ranked = dict(zip(questions, index.search(questions, k=config.rank_end), strict=True))
    mined: list[TrainPair] = []
    short = 0
    for pair in pairs:
        negatives = list(pair.negatives)
        seen = set(negatives)
        for doc_id, _score in ranked[pair.question][config.rank_start : config.rank_end]:
            if len(negatives) >= config.num_negatives:
                break
            if doc_id in pair.relevant_ids or doc_id == pair.positive_id:
                continue
            text = corpus[doc_id].passage
            if text == pair.positive or text in seen:
                continue
            if pair.answers and has_answer(text, pair.answers):
                continue
            negatives.append(text)
            seen.add(text)
        if len(negatives) < config.num_negatives:
            short += 1
        mined.append(replace(pair, negatives=tuple(negatives)))
    if short:
        log.info("some questions got fewer hard negatives than asked", extra={"questions": short})
    return mined
