"""The ML pieces of `dpr adapt` (label-free adaptation of the towers to a corpus; ``services.lab.adaptation.recipe``
runs the stages; docs/adapt.md describes each): pseudo-questions split into train and dev by source document, candidates
from hybrid search (BM25 + the current towers, fused by reciprocal rank), the hybrid-agreement teacher that labels
them (a high candidate that is not the source is a hard negative unless it is a likely false negative: within
``duplicate_similarity`` of the positive, or ranked above the source by both BM25 and the towers, ``agreement``),
the distillation teacher (``TeacherConfig.distill``: the question tower learns the ranking hybrid search gives
each probe's candidates, ``distill_targets``), and the rule that picks a candidate on the dev pseudo-questions.

Nothing here reads a data file; sentence-transformers (torch) is imported inside ``load_model`` only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from encoders.data import CorpusDoc, RetrievalDataset, TrainPair

RRF_K = 60  # reciprocal rank fusion constant (Cormack et al. 2009), as the store's hybrid search


@dataclass(frozen=True)
class TeacherConfig:
    """How hybrid candidates become labelled hard negatives."""

    negatives: int = 1  # hard negatives per pseudo-question
    window: int = 30  # candidates: the fused top ``window`` of BM25's and the towers' top ``window`` each
    duplicate_similarity: float = 0.9  # drop a candidate this close (passage cosine) to the positive
    agreement: bool = True  # drop a candidate BM25 and the towers both rank above the source
    distill: bool = False  # soft targets: hybrid search's scores over each probe's candidates (distill_targets)
    bm25_weight: float = 0.5  # distill: w in t = cos0 + w * sd(cos0) * z(bm25)
    randoms: int = 10  # distill: random corpus documents added to each probe's candidates

    def describe(self) -> dict[str, Any]:
        if self.distill:
            return {"name": "hybrid-distillation",
                    "candidates": f"the top {self.window} of BM25 (bm25s) and of the current towers each, the probe's "
                                  f"source left out, plus {self.randoms} random documents",
                    "score": f"t = cos0 + {self.bm25_weight:g} * sd(cos0) * z(bm25) over the candidates (cos0: the "
                             "current towers' cosine; z: BM25 standardised over the candidates)",
                    "window": self.window, "bm25_weight": self.bm25_weight, "randoms": self.randoms}
        return {"name": "hybrid-agreement", "candidates": f"RRF(k={RRF_K}) of BM25 (bm25s) and the current towers, "
                f"top {self.window}", **{k: v for k, v in asdict(self).items()
                                         if k not in ("distill", "bm25_weight", "randoms")}}


@dataclass
class TeacherStats:
    pairs: int = 0
    with_negatives: int = 0
    negatives: int = 0
    dropped_duplicate: int = 0
    dropped_agreement: int = 0
    source_top1_hybrid: int = 0  # the fused ranking already puts the source first
    source_in_window: int = 0
    source_rank_sum: float = 0.0  # over the pairs whose source is in the window (1-based)
    by_mode: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        found = max(1, self.source_in_window)
        return {"pairs": self.pairs, "pairs_with_negatives": self.with_negatives, "negatives": self.negatives,
                "dropped_duplicate": self.dropped_duplicate, "dropped_agreement": self.dropped_agreement,
                "source_top1_hybrid": round(self.source_top1_hybrid / max(1, self.pairs), 4),
                "source_in_window": round(self.source_in_window / max(1, self.pairs), 4),
                "mean_source_rank_in_window": round(self.source_rank_sum / found, 2), "pairs_by_mode": self.by_mode}


# --- pseudo-questions -----------------------------------------------------------------------------------------


def _source_key(dataset: RetrievalDataset, qid: str) -> str:
    return min(dataset.qrels.get(qid) or {qid: 1})


def dev_split(dataset: RetrievalDataset, share: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, dev) query ids of one pseudo-question set: a seeded hash of each question's source document decides,
    so a document's questions all fall on one side (a held-out question's source is never a training positive of
    the same kind)."""
    if not 0 < share < 1:
        raise ValueError(f"the dev share must lie in (0, 1), got {share}")
    train: list[str] = []
    dev: list[str] = []
    for qid in sorted(dataset.queries):
        digest = hashlib.sha256(f"{seed}\x1f{_source_key(dataset, qid)}".encode()).hexdigest()
        (dev if int(digest[:8], 16) / 0xFFFFFFFF < share else train).append(qid)
    return train, dev


# --- hybrid candidates and the teacher ------------------------------------------------------------------------


def rrf(rankings: Sequence[Sequence[str]], k: int = RRF_K) -> list[str]:
    """Reciprocal rank fusion of id rankings (best first); ties keep the first ranking's order."""
    score: dict[str, float] = {}
    for ranking in rankings:
        for rank, doc_id in enumerate(ranking):
            score[doc_id] = score.get(doc_id, 0.0) + 1.0 / (k + rank + 1)
    return sorted(score, key=lambda d: -score[d])


def dense_rankings(question_vectors: np.ndarray, doc_vectors: np.ndarray, doc_ids: Sequence[str],
                   k: int) -> list[list[str]]:
    """Exact inner-product top ``k`` ids per question (vectors L2-normalised: cosine)."""
    if len(question_vectors) == 0:
        return []
    k = min(k, len(doc_ids))
    scores = question_vectors @ doc_vectors.T
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    out = []
    for row, idx in zip(scores, top, strict=True):
        out.append([doc_ids[int(i)] for i in idx[np.argsort(-row[idx], kind="stable")]])
    return out


def label_with_teacher(pairs: Sequence[TrainPair], corpus: Mapping[str, CorpusDoc],
                       bm25: Sequence[Sequence[str]], dense: Sequence[Sequence[str]],
                       doc_vectors: np.ndarray, doc_row: Mapping[str, int], config: TeacherConfig,
                       stats: TeacherStats) -> list[TrainPair]:
    """``pairs`` with up to ``config.negatives`` hard negatives each from the fused ranking of ``bm25`` and
    ``dense`` (the id rankings of each pair's question, in the pairs' order), false negatives filtered (module
    docstring). ``doc_vectors[doc_row[id]]``: the passage vector of a corpus id (for the duplicate rule)."""
    out: list[TrainPair] = []
    for pair, by_bm25, by_dense in zip(pairs, bm25, dense, strict=True):
        stats.pairs += 1
        fused = rrf([by_bm25, by_dense])[: config.window]
        source = pair.positive_id
        if source in fused:
            stats.source_in_window += 1
            stats.source_rank_sum += fused.index(source) + 1
            stats.source_top1_hybrid += int(fused[0] == source)
        bm25_rank = {d: i for i, d in enumerate(by_bm25)}
        dense_rank = {d: i for i, d in enumerate(by_dense)}
        absent = config.window + 1
        source_bm25, source_dense = bm25_rank.get(source or "", absent), dense_rank.get(source or "", absent)
        positive_vector = doc_vectors[doc_row[source]] if source is not None and source in doc_row else None
        negatives: list[str] = []
        for doc_id in fused:
            if len(negatives) >= config.negatives:
                break
            if doc_id == source or doc_id in pair.relevant_ids:
                continue
            text = corpus[doc_id].passage
            if text == pair.positive or text in negatives:
                continue
            if positive_vector is not None and float(doc_vectors[doc_row[doc_id]] @ positive_vector) \
                    >= config.duplicate_similarity:
                stats.dropped_duplicate += 1
                continue
            if config.agreement and bm25_rank.get(doc_id, absent) < source_bm25 \
                    and dense_rank.get(doc_id, absent) < source_dense:
                stats.dropped_agreement += 1
                continue
            negatives.append(text)
        stats.with_negatives += int(bool(negatives))
        stats.negatives += len(negatives)
        out.append(TrainPair(pair.question, pair.positive, pair.positive_id, tuple(negatives), pair.answers,
                             pair.relevant_ids))
    return out


def bm25_matrix(index: Any, questions: Sequence[str], doc_ids: Sequence[str]) -> np.ndarray:
    """(questions, documents) BM25 scores of ``index`` (a ``BM25Index`` over ``doc_ids``; 0 where a word misses)."""
    row = {d: i for i, d in enumerate(doc_ids)}
    out = np.zeros((len(questions), len(doc_ids)), dtype=np.float32)
    for r, hits in enumerate(index.search(list(questions), k=len(doc_ids))):
        for doc_id, score in hits:
            out[r, row[doc_id]] = score
    return out


def distill_width(config: TeacherConfig, n_docs: int) -> int:
    """Candidates per probe: the top ``window`` of each ranking and ``randoms`` more, at most every document but
    the source."""
    return min(2 * config.window + config.randoms, n_docs - 1)


def distill_targets(cos0: np.ndarray, bm25: np.ndarray, sources: Sequence[int | None], config: TeacherConfig,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per probe (a row of ``cos0`` and ``bm25``, the current towers' cosine and BM25 over the corpus's documents):
    the column indices of its candidates and the teacher's scores of them, both (probes, ``distill_width``).

    Candidates: the top ``window`` documents of each ranking, never the probe's ``sources`` column, then random
    documents up to the width. Teacher score ``t = cos0 + w * sd(cos0) * z(bm25)`` over the candidates: at
    ``w = 0`` the teacher is the current towers."""
    if cos0.shape != bm25.shape or len(sources) != len(cos0):
        raise ValueError("cos0, bm25 and sources must describe the same probes over the same documents")
    n_docs = cos0.shape[1]
    width = distill_width(config, n_docs)
    if width < 2:
        raise ValueError("too few documents to distil a ranking (need at least 3)")
    top = min(config.window, n_docs)
    rows: list[list[int]] = []
    for r, source in enumerate(sources):
        ranked = [np.argsort(-m[r], kind="stable")[: top + 1].tolist() for m in (cos0, bm25)]
        order = ranked[0][:top] + ranked[1][:top] + ranked[0][top:] + ranked[1][top:]
        chosen = [c for c in dict.fromkeys(order) if c != source][: min(2 * top, width)]
        taken = {*chosen, *(() if source is None else (source,))}
        need = width - len(chosen)
        draw = rng.choice(n_docs, size=min(n_docs, need + len(taken)), replace=False)
        rows.append(chosen + [int(i) for i in draw if int(i) not in taken][:need])
    cand = np.array(rows, dtype=np.int64)
    return cand, hybrid_scores(np.take_along_axis(cos0, cand, axis=1), np.take_along_axis(bm25, cand, axis=1),
                               config.bm25_weight).astype(np.float32)


def standardise(x: np.ndarray) -> np.ndarray:
    """Each row of ``x`` as z-scores (mean 0, standard deviation 1)."""
    return (x - x.mean(1, keepdims=True)) / (x.std(1, keepdims=True) + 1e-6)


def hybrid_scores(cos: np.ndarray, bm25: np.ndarray, bm25_weight: float) -> np.ndarray:
    """The distillation teacher, row by row over the same columns: ``cos + w * sd(cos) * z(bm25)`` (BM25 brought to
    the cosine's spread, so ``w`` means the same on every collection)."""
    return cos + bm25_weight * cos.std(1, keepdims=True) * standardise(bm25)


def load_model(path: Any) -> Any:
    """The towers at ``path`` as a sentence-transformers model on this process's device (the CPU unless
    ``services.lab.shared.training_run.configure_device`` said otherwise), offline."""
    from encoders.towers import offline
    from services.lab.shared.training_run import learn_device

    offline()
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device=learn_device(), local_files_only=True)


# --- choosing on dev ------------------------------------------------------------------------------------------


def mean_score(scores: Mapping[str, float]) -> float:
    return sum(scores.values()) / len(scores) if scores else 0.0


def pick_candidate(base: Mapping[str, float], candidates: Mapping[str, Mapping[str, float]],
                   min_gain: float) -> tuple[str | None, float]:
    """The candidate with the best mean dev nDCG@10 (the first listed among equals) and its gain over the base;
    None when no candidate beats the base by more than ``min_gain``."""
    if not candidates:
        return None, 0.0
    best = max(candidates, key=lambda key: mean_score(candidates[key]))  # max keeps the first of equals
    gain = mean_score(candidates[best]) - mean_score(base)
    return (best if gain > min_gain else None), gain


# --- JSON records of the stages -------------------------------------------------------------------------------


def pair_to_json(pair: TrainPair) -> dict[str, Any]:
    return {"question": pair.question, "positive": pair.positive, "positive_id": pair.positive_id,
            "negatives": list(pair.negatives), "relevant_ids": sorted(pair.relevant_ids)}


def pair_from_json(row: Mapping[str, Any]) -> TrainPair:
    return TrainPair(row["question"], row["positive"], row.get("positive_id"), tuple(row.get("negatives") or ()),
                     relevant_ids=frozenset(row.get("relevant_ids") or ()))


def dataset_to_json(dataset: RetrievalDataset) -> dict[str, Any]:
    return {"name": dataset.name, "queries": dataset.queries, "qrels": dataset.qrels,
            "corpus": [[d.doc_id, d.title, d.text] for d in dataset.corpus.values()]}


def dataset_from_json(row: Mapping[str, Any]) -> RetrievalDataset:
    corpus = {d[0]: CorpusDoc(d[0], d[1], d[2]) for d in row["corpus"]}
    return RetrievalDataset(row["name"], corpus, dict(row["queries"]),
                            {q: dict(r) for q, r in row["qrels"].items()})
