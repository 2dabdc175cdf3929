"""`dpr eval`'s significance: each system against BM25 and the base model by a paired randomization test."""

from __future__ import annotations

import pytest

from encoders.data import CorpusDoc, RetrievalDataset
from services.lab.evaluation.retrieval import EvalReport, SystemResult, score_retrieval
from services.lab.evaluation.retrieval import Retrieval as R

pytestmark = pytest.mark.unit


def _dataset(n: int = 40) -> RetrievalDataset:
    corpus = {f"d{i}": CorpusDoc(f"d{i}", "", f"text {i}") for i in range(n)}
    queries = {f"q{i}": f"q {i}" for i in range(n)}
    return RetrievalDataset("toy", corpus, queries, {f"q{i}": {f"d{i}": 1} for i in range(n)})


def _system(name: str, dataset: RetrievalDataset, hit_every: int) -> SystemResult:
    """The relevant document first for every ``hit_every``-th query, else at rank 5."""
    run = {}
    for i, q in enumerate(sorted(dataset.queries)):
        others = [f"d{(int(q[1:]) + j) % 40}" for j in range(1, 5)]
        ranking = [f"d{q[1:]}", *others] if i % hit_every == 0 else [*others, f"d{q[1:]}"]
        run[q] = {d: float(10 - r) for r, d in enumerate(ranking)}
    metrics, curves = score_retrieval(dataset, R(run=run))
    return SystemResult(name, metrics, curves, 0.0, run=run)


def test_a_clear_gain_is_significant_and_a_copy_is_not() -> None:
    dataset = _dataset()
    report = EvalReport("toy", 40, 40, [_system("bm25", dataset, 3), _system("base", dataset, 3),
                                        _system("trained:x", dataset, 1)])
    report.add_significance(dataset.qrels)
    trained = report.significance["trained:x"]
    assert trained["bm25"]["significant"] and trained["bm25"]["p"] < 0.01 and trained["bm25"]["delta"] > 0.2
    assert trained["base"]["significant"]
    same = report.significance["base"]["bm25"]
    assert same["delta"] == 0.0 and not same["significant"] and same["p"] > 0.5
    assert "bm25" not in report.significance or "bm25" not in report.significance["bm25"]
    table = report.to_markdown_table()
    assert "| vs bm25 | vs base |" in table and "*" in table.splitlines()[-1]
    assert report.to_json()["significance"]["trained:x"]["base"]["significant"] is True
