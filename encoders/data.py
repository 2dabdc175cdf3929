"""Training and evaluation data in memory: corpus documents, queries, relevance judgments, training pairs.

The ML works on these records only; reading them from files (BEIR, SQuAD, JSONL) is ``services.readers``' job,
which returns them. Nothing here touches a file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CorpusDoc:
    doc_id: str
    title: str
    text: str

    @property
    def passage(self) -> str:
        """The text a passage tower sees for this document during training and in-memory evaluation."""
        return passage_text(self.title, self.text)


Corpus = dict[str, CorpusDoc]  # doc id -> document
Queries = dict[str, str]  # query id -> question
Qrels = dict[str, dict[str, int]]  # query id -> {doc id: relevance > 0}

# the seed of the dev questions `dpr train`, `dpr tune-hybrid`, `dpr eval --dev-queries` and the benchmarks hold out
DEV_SPLIT_SEED = 13


@dataclass
class RetrievalDataset:
    """Queries, a corpus and relevance judgments (qrels); answers for SQuAD-style data."""

    name: str
    corpus: Corpus
    queries: Queries
    qrels: Qrels
    answers: dict[str, list[str]] = field(default_factory=dict)  # query id -> gold answer strings

    def subset(self, query_ids: list[str], name: str | None = None) -> RetrievalDataset:
        """The same corpus with only ``query_ids`` as queries."""
        keep = [q for q in query_ids if q in self.queries]
        return RetrievalDataset(
            name=name or self.name,
            corpus=self.corpus,
            queries={q: self.queries[q] for q in keep},
            qrels={q: self.qrels[q] for q in keep if q in self.qrels},
            answers={q: self.answers[q] for q in keep if q in self.answers},
        )

    def held_out(self, n_dev: int, seed: int = DEV_SPLIT_SEED) -> tuple[RetrievalDataset, RetrievalDataset]:
        """(the rest, ``n_dev`` held-out queries named ``NAME-devN``) over the same corpus: the dev split
        (``split_dev_queries``); the dev part is empty when ``n_dev`` is 0."""
        rest, dev = split_dev_queries(sorted(self.queries), n_dev, seed=seed)
        return self.subset(rest), self.subset(dev, name=f"{self.name}-dev{len(dev)}")

    def fingerprint(self) -> str:
        """A short hash of queries, qrels and corpus ids (identifies the training data in a model card)."""
        h = hashlib.sha256()
        for qid in sorted(self.queries):
            h.update(f"q\x1f{qid}\x1f{self.queries[qid]}\n".encode())
            for did, rel in sorted(self.qrels.get(qid, {}).items()):
                h.update(f"r\x1f{did}\x1f{rel}\n".encode())
        for did in sorted(self.corpus):
            h.update(f"d\x1f{did}\x1f{len(self.corpus[did].text)}\n".encode())
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class TrainPair:
    """One training example: a question, its positive passage and optional hard-negative passages (texts).

    ``relevant_ids``: every corpus id labelled relevant to the question (never mined as a negative).
    ``answers``: gold answer strings (SQuAD-style); a passage containing one is never mined as a negative.
    """

    question: str
    positive: str
    positive_id: str | None = None
    negatives: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()
    relevant_ids: frozenset[str] = frozenset()


def passage_text(title: str, text: str) -> str:
    """Title and body as one passage (the title on its own line, as chunks carry it)."""
    title = title.strip()
    text = text.strip()
    if title and text:
        return f"{title}\n{text}"
    return title or text


def labelled_pairs(dataset: RetrievalDataset) -> list[TrainPair]:
    """One pair per (query, relevant document), in a stable order."""
    pairs = []
    for qid in sorted(dataset.queries):
        rels = dataset.qrels.get(qid, {})
        relevant = frozenset(rels)
        for did in sorted(rels):
            pairs.append(
                TrainPair(
                    question=dataset.queries[qid],
                    positive=dataset.corpus[did].passage,
                    positive_id=did,
                    answers=tuple(dataset.answers.get(qid, ())),
                    relevant_ids=relevant,
                )
            )
    return pairs


def split_dev_queries(query_ids: list[str], n_dev: int, seed: int = DEV_SPLIT_SEED) -> tuple[list[str], list[str]]:
    """Deterministically hold out ``n_dev`` query ids (ranked by a seeded hash) for hyper-parameter choice."""
    if n_dev <= 0:
        return sorted(query_ids), []
    ranked = sorted(query_ids, key=lambda q: hashlib.sha256(f"{seed}\x1f{q}".encode()).hexdigest())
    n_dev = min(n_dev, max(0, len(ranked) - 1))
    return sorted(ranked[n_dev:]), sorted(ranked[:n_dev])
