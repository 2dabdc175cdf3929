"""Retrieval metrics: nDCG, MRR and recall through ranx (a maintained IR metrics library), plus DPR's top-k answer
accuracy (a retrieved passage contains a gold answer, both normalised as the SQuAD evaluation script does).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from encoders.korean import has_hangul

# run: query id -> {doc id: score}; qrels: query id -> {doc id: relevance}
Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]

DEFAULT_METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@5", "recall@20", "recall@100")
DEFAULT_ANSWER_KS = (1, 5, 20, 100)


def ir_metrics(qrels: Qrels, run: Run, metrics: Sequence[str] = DEFAULT_METRICS) -> dict[str, float]:
    """Mean of each metric over the queries in ``qrels`` (a query missing from ``run`` scores 0).

    Names follow ranx (and trec_eval): ``ndcg@k`` uses linear gains, ``mrr@k`` is the reciprocal rank of the first
    relevant document within the top k, ``recall@k`` the fraction of relevant documents within the top k.
    """
    from ranx import evaluate

    judged, full_run = _ranx_inputs(qrels, run)
    scores = evaluate(judged, full_run, list(metrics), make_comparable=True)
    if isinstance(scores, float):  # one metric
        return {metrics[0]: float(scores)}
    return {m: float(scores[m]) for m in metrics}


def _ranx_inputs(qrels: Qrels, run: Run, name: str | None = None) -> tuple[Any, Any]:
    """ranx Qrels of the judged queries and a Run with every one of them (a query with no result gets an empty
    ranking, scored 0)."""
    from ranx import Qrels as RanxQrels
    from ranx import Run as RanxRun

    judged = {q: {d: int(r) for d, r in rels.items() if r > 0} for q, rels in qrels.items()}
    judged = {q: rels for q, rels in judged.items() if rels}
    if not judged:
        raise ValueError("no query has a relevant document; nothing to evaluate")
    full_run: dict[str, dict[str, float]] = {}
    for q in judged:
        ranking = {str(d): float(s) for d, s in (run.get(q) or {}).items()}
        full_run[q] = ranking or {"\x00no-result": -1e9}
    return RanxQrels(judged), RanxRun(full_run, name=name)


def per_query(qrels: Qrels, run: Run, metric: str = "ndcg@10") -> dict[str, float]:
    """``metric`` of each judged query (ranx), in the judged queries' order."""
    from ranx import evaluate

    judged, full_run = _ranx_inputs(qrels, run)
    scores = evaluate(judged, full_run, metric, return_mean=False, make_comparable=True)
    return dict(zip(judged.keys(), (float(x) for x in scores), strict=True))


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
