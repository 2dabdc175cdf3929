"""Retrieval metrics: nDCG, MRR and recall (as trec_eval computes them), plus DPR's top-k answer
accuracy (a retrieved passage contains a gold answer, both normalised as the SQuAD evaluation script does).
"""

from __future__ import annotations

import math
import re
import string
import unicodedata
from collections.abc import Mapping, Sequence

from encoders.korean import has_hangul

# run: query id -> {doc id: score}; qrels: query id -> {doc id: relevance}
Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]

DEFAULT_METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@5", "recall@20", "recall@100")
DEFAULT_ANSWER_KS = (1, 5, 20, 100)


def ir_metrics(qrels: Qrels, run: Run, metrics: Sequence[str] = DEFAULT_METRICS) -> dict[str, float]:
    """Mean of each metric over the queries in ``qrels`` (a query missing from ``run`` scores 0).

    Names follow trec_eval: ``ndcg@k`` uses linear gains (Järvelin), ``mrr@k`` is the reciprocal rank of the first
    relevant document within the top k, ``recall@k`` the fraction of relevant documents within the top k.
    """
    judged = _judged(qrels)
    return {m: sum(_query_metric(m, rels, run.get(q) or {}) for q, rels in judged.items()) / len(judged)
            for m in metrics}


def per_query(qrels: Qrels, run: Run, metric: str = "ndcg@10") -> dict[str, float]:
    """``metric`` of each judged query, in the judged queries' order."""
    return {q: _query_metric(metric, rels, run.get(q) or {}) for q, rels in _judged(qrels).items()}


def _judged(qrels: Qrels) -> dict[str, dict[str, int]]:
    """The queries with at least one relevant document, each with its relevant documents only."""
    judged = {q: {str(d): int(r) for d, r in rels.items() if r > 0} for q, rels in qrels.items()}
    judged = {q: rels for q, rels in judged.items() if rels}
    if not judged:
        raise ValueError("no query has a relevant document; nothing to evaluate")
    return judged


def _query_metric(metric: str, rels: Mapping[str, int], ranking: Mapping[str, float]) -> float:
    """One query's ``ndcg@k`` / ``mrr@k`` / ``recall@k``: the ranking is ordered by score, best first (ties keep
    the ranking's order). Plain Python: a few hundred queries take milliseconds, where a JIT-compiled library
    (ranx, used before; the same figures to 1e-16 on 400 graded queries) spent about a minute compiling per
    process."""
    name, _, k_text = metric.partition("@")
    if name not in ("ndcg", "mrr", "recall") or not k_text.isdigit() or int(k_text) < 1:
        raise ValueError(f"unknown metric {metric!r}: use ndcg@K, mrr@K or recall@K")
    k = int(k_text)
    top = [str(d) for d, _ in sorted(ranking.items(), key=lambda item: -item[1])[:k]]
    if name == "recall":
        return sum(1 for d in top if d in rels) / len(rels)
    if name == "mrr":
        return next((1.0 / rank for rank, d in enumerate(top, 1) if d in rels), 0.0)
    dcg = sum(rels.get(d, 0) / math.log2(rank + 1) for rank, d in enumerate(top, 1))
    ideal = sorted(rels.values(), reverse=True)[:k]
    return dcg / sum(gain / math.log2(rank + 1) for rank, gain in enumerate(ideal, 1))


def paired_randomization(a: Sequence[float], b: Sequence[float], n_permutations: int = 10_000,
                         seed: int = 42) -> float:
    """Two-sided p-value of the paired randomization test (Fisher; Smucker et al., CIKM 2007) for the mean of
    ``a - b`` over the same queries: each query's two scores are swapped at random (the sign of its difference
    flipped), and p is the share of permutations whose mean difference is at least as large as the observed."""
    import numpy as np

    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)  # (queries,)
    if diff.size == 0 or not diff.any():
        return 1.0
    rng = np.random.default_rng(seed)
    observed = abs(diff.mean())
    count = 0
    for start in range(0, n_permutations, 1000):  # (1000, queries) sign matrices: bounded memory
        signs = rng.choice((-1.0, 1.0), size=(min(1000, n_permutations - start), diff.size))
        count += int((np.abs((signs * diff).mean(axis=1)) >= observed - 1e-12).sum())
    return count / n_permutations


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalisation: lower case, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


_PUNCT = set(string.punctuation)


def has_answer(passage: str, answers: Sequence[str]) -> bool:
    """True when a normalised gold answer occurs in the normalised passage as a whole-token sequence.

    Korean text (a passage or an answer with Hangul in it) is matched as it is written: particles and endings
    attach to the end of a word ("서울" is the answer in "서울에서", "BTV" in "BTV를"), so the answer must start a
    token (``normalize_korean``) but may end inside one. Text without Hangul keeps the SQuAD rule, unchanged."""
    korean_passage = has_hangul(passage)
    norm = korean = ""
    for answer in answers:
        if korean_passage or has_hangul(answer):
            korean = korean or f" {normalize_korean(passage)}"
            a = normalize_korean(answer)
            if a and f" {a}" in korean:
                return True
            continue
        norm = norm or f" {normalize_answer(passage)} "
        a = normalize_answer(answer)
        if a and f" {a} " in norm:
            return True
    return False


def normalize_korean(text: str) -> str:
    """For Hangul answers: NFC, lower case, every Unicode punctuation or symbol character (brackets such as
    「」《》, quotes, the middle dot, ASCII punctuation) becomes a space, whitespace collapsed. No article removal."""
    text = unicodedata.normalize("NFC", text).lower()
    text = "".join(" " if unicodedata.category(ch)[0] in "PS" else ch for ch in text)
    return " ".join(text.split())


def answer_accuracy(
    retrieved: Mapping[str, Sequence[str]],
    answers: Mapping[str, Sequence[str]],
    ks: Sequence[int] = DEFAULT_ANSWER_KS,
) -> dict[str, float]:
    """DPR top-k accuracy: the fraction of questions with a gold answer in at least one of the top-k passages.

    ``retrieved``: query id -> passage texts, best first. Questions without answers are skipped.
    """
    qids = [q for q, a in answers.items() if any(x.strip() for x in a)]
    if not qids:
        raise ValueError("no question has a gold answer; answer accuracy needs SQuAD-style data")
    never = 1 << 30
    first_hit: dict[str, int] = {}
    for q in qids:
        first_hit[q] = next(
            (rank for rank, text in enumerate(retrieved.get(q, ())) if has_answer(text, answers[q])), never
        )
    out = {}
    for k in ks:
        hits = sum(1 for q in qids if first_hit[q] < k)
        out[f"answer@{k}"] = hits / len(qids)
    return out
