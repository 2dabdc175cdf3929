"""BM25 (bm25s) over a corpus: the lexical baseline and the source of hard negatives.

Tokenisation follows ``BM25Config.language``: ``en`` (English stopwords, Snowball stemming) or ``ko`` (Kiwi content
morphemes, ``encoders.korean``: particles and endings dropped, no stopword list, no stemming); the caller decides
the language (``services.ingest.language``).

Hard negatives for a question are the top-ranked passages inside a rank window that are not labelled relevant,
are not the positive itself and (for SQuAD-style data) do not contain a gold answer. The ranking comes from BM25
(``BM25Index``) or from dense towers (``DenseIndex``: a second mining round from a trained model, as ANCE does).
With ``MiningConfig.denoise`` a dense scorer also drops likely false negatives, positive-aware (NV-Retriever's
"TopK-PercPos"): a candidate the towers score at ``denoise`` x the positive's score or higher is probably another
unlabelled positive or a near-duplicate of it, and training against it teaches the towers the wrong thing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from encoders.data import CorpusDoc, TrainPair
from services.lab.shared.metrics import has_answer

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


class Ranker(Protocol):
    def search(self, queries: Sequence[str], k: int = 100) -> list[list[tuple[str, float]]]: ...


class DenseIndex:
    """Dense towers over ``docs`` (exact inner product, in memory): ``search`` ranks the corpus for questions like
    ``BM25Index.search``; ``scores`` gives the towers' score of given (question, passage) pairs (denoising)."""

    def __init__(self, docs: Sequence[CorpusDoc], towers: Any, batch_size: int = 32) -> None:
        if not docs:
            raise ValueError("dense mining needs at least one document")
        self.towers = towers
        self.batch_size = batch_size
        self.doc_ids = [d.doc_id for d in docs]
        self._texts = {d.passage: i for i, d in enumerate(docs)}
        self._vectors = np.asarray(towers.encode_documents([d.passage for d in docs], batch_size=batch_size),
                                   dtype=np.float32)  # (docs, dim)
        self._questions: dict[str, np.ndarray] = {}

    def _encode_questions(self, queries: Sequence[str]) -> np.ndarray:
        missing = sorted({q for q in queries if q not in self._questions})
        if missing:
            vectors = self.towers.encode_queries(missing, batch_size=self.batch_size)
            self._questions.update(zip(missing, np.asarray(vectors, dtype=np.float32), strict=True))
        return np.stack([self._questions[q] for q in queries]) if queries else np.zeros((0, self._vectors.shape[1]))

    def search(self, queries: Sequence[str], k: int = 100) -> list[list[tuple[str, float]]]:
        if not queries:
            return []
        k = min(k, len(self.doc_ids))
        scores = self._encode_questions(queries) @ self._vectors.T  # (queries, docs)
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        out = []
        for row, idx in zip(scores, top, strict=True):
            best = idx[np.argsort(-row[idx], kind="stable")]
            out.append([(self.doc_ids[int(i)], float(row[i])) for i in best])
        return out

    def scores(self, questions: Sequence[str], passages: Sequence[str]) -> np.ndarray:
        """The towers' score of each (question, passage) pair; passages of the corpus reuse their vectors."""
        q = self._encode_questions(questions)
        known = [self._texts.get(p) for p in passages]
        new = sorted({p for p, i in zip(passages, known, strict=True) if i is None})
        extra = dict(zip(new, np.asarray(self.towers.encode_documents(new, batch_size=self.batch_size),
                                         dtype=np.float32), strict=True)) if new else {}
        p = np.stack([self._vectors[i] if i is not None else extra[t] for t, i in zip(passages, known, strict=True)])
        return (q * p).sum(axis=1)


@dataclass(frozen=True)
class MiningConfig:
    num_negatives: int = 1
    rank_start: int = 0  # first rank (0-based) searched; > 0 skips the very top (likely false negatives)
    rank_end: int = 30  # ranks [rank_start, rank_end) are searched
    source: str = "bm25"  # what ranks the candidates: bm25, or dense (the towers named by ``model``)
    model: str | None = None  # dense source / denoising towers (None: the model training starts from)
    denoise: float | None = None  # drop candidates the towers score >= denoise x the positive's score (0.95)


def mine_hard_negatives(
    pairs: Sequence[TrainPair],
    index: Ranker,
    corpus: dict[str, CorpusDoc],
    config: MiningConfig,
    scorer: DenseIndex | None = None,
) -> list[TrainPair]:
    """Return ``pairs`` with ``config.num_negatives`` negatives each from ``index``'s ranking (fewer when the window
    runs dry).

    A candidate is skipped if it is labelled relevant (``relevant_ids``), is the positive passage, contains a gold
    answer of the question, or (``config.denoise`` with a ``scorer``) scores at least ``denoise`` x the positive's
    score. Existing negatives are kept and count toward the number.
    """
    if config.num_negatives <= 0:
        return list(pairs)
    if not 0 <= config.rank_start < config.rank_end:
        raise ValueError(f"rank window [{config.rank_start}, {config.rank_end}) is empty")
    if config.denoise is not None and scorer is None:
        raise ValueError("denoising needs dense towers to score the candidates (a scorer)")
    questions = sorted({p.question for p in pairs})
    ranked = dict(zip(questions, index.search(questions, k=config.rank_end), strict=True))
    ceilings = _denoise_ceilings(pairs, scorer, config.denoise)
    mined: list[TrainPair] = []
    short = dropped = 0
    for n, pair in enumerate(pairs):
        negatives = list(pair.negatives)
        seen = set(negatives)
        needed = config.num_negatives - len(negatives)
        candidates: list[str] = []
        for doc_id, _score in ranked[pair.question][config.rank_start : config.rank_end]:
            if ceilings is None and len(candidates) >= needed:
                break  # without denoising the first allowed ones are the negatives
            if doc_id in pair.relevant_ids or doc_id == pair.positive_id:
                continue
            text = corpus[doc_id].passage
            if text == pair.positive or text in seen or (pair.answers and has_answer(text, pair.answers)):
                continue
            candidates.append(text)
            seen.add(text)
        if ceilings is not None and candidates:
            assert scorer is not None
            keep = scorer.scores([pair.question] * len(candidates), candidates) < ceilings[n]
            dropped += int((~keep).sum())
            candidates = [c for c, k in zip(candidates, keep, strict=True) if k]
        negatives += candidates[: max(0, needed)]
        if len(negatives) < config.num_negatives:
            short += 1
        mined.append(replace(pair, negatives=tuple(negatives)))
    if short:
        log.info("some questions got fewer hard negatives than asked", extra={"questions": short})
    if dropped:
        log.info("dropped likely false negatives", extra={"candidates": dropped, "denoise": config.denoise})
    return mined


def _denoise_ceilings(pairs: Sequence[TrainPair], scorer: DenseIndex | None,
                      denoise: float | None) -> np.ndarray | None:
    """Per pair, the score a candidate must stay under: ``denoise`` x the towers' score of the positive."""
    if denoise is None or scorer is None:
        return None
    if not 0 < denoise <= 1:
        raise ValueError(f"denoise must be in (0, 1] (a fraction of the positive's score), got {denoise}")
    positive = scorer.scores([p.question for p in pairs], [p.positive for p in pairs])
    # a negative positive score (rare: the towers rank the positive below orthogonal) keeps every candidate that
    # scores below the positive itself
    return np.where(positive > 0, positive * denoise, positive)
