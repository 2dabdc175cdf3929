"""Metrics: nDCG, MRR and recall against hand-computed values, and SQuAD-normalised answer accuracy."""

from __future__ import annotations

import math

import pytest

from services.lab.shared.metrics import answer_accuracy, has_answer, ir_metrics, normalize_answer, per_query

pytestmark = pytest.mark.unit


def test_ir_metrics_match_a_hand_computed_case() -> None:
    # q1: relevant d1 (grade 2) and d3 (grade 1); ranking d2, d1, d3, d4.
    # q2: relevant d9 only; ranking d8, d7 (d9 never retrieved).
    qrels = {"q1": {"d1": 2, "d3": 1}, "q2": {"d9": 1}}
    run = {"q1": {"d2": 0.9, "d1": 0.8, "d3": 0.7, "d4": 0.1}, "q2": {"d8": 0.5, "d7": 0.4}}
    m = ir_metrics(qrels, run, ["ndcg@10", "mrr@10", "recall@1", "recall@2", "recall@5"])
    # nDCG (linear gains, trec_eval style): DCG = 2/log2(3) + 1/log2(4); IDCG = 2/log2(2) + 1/log2(3).
    dcg = 2 / math.log2(3) + 1 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert m["ndcg@10"] == pytest.approx((dcg / idcg + 0.0) / 2, abs=1e-6)
    assert m["mrr@10"] == pytest.approx((1 / 2 + 0.0) / 2)
    assert m["recall@1"] == pytest.approx(0.0)
    assert m["recall@2"] == pytest.approx((1 / 2 + 0) / 2)
    assert m["recall@5"] == pytest.approx((2 / 2 + 0) / 2)


def test_query_missing_from_run_scores_zero() -> None:
    m = ir_metrics({"q1": {"d1": 1}, "q2": {"d2": 1}}, {"q1": {"d1": 1.0}}, ["mrr@10", "recall@1"])
    assert m["mrr@10"] == pytest.approx(0.5)
    assert m["recall@1"] == pytest.approx(0.5)


def test_the_ranking_is_read_by_score_and_the_ideal_is_cut_at_k() -> None:
    # Three relevant documents, k = 2: the ideal DCG counts only the best two grades (3, 2); the run's dict order
    # (d1 first) is not its ranking (d3 scores highest).
    qrels = {"q": {"d1": 1, "d2": 2, "d3": 3}}
    run = {"q": {"d1": 0.1, "d9": 0.5, "d3": 0.9}}
    m = ir_metrics(qrels, run, ["ndcg@2", "mrr@2", "recall@2"])
    assert m["ndcg@2"] == pytest.approx((3 / math.log2(2)) / (3 / math.log2(2) + 2 / math.log2(3)))
    assert m["mrr@2"] == pytest.approx(1.0)
    assert m["recall@2"] == pytest.approx(1 / 3)
    assert per_query(qrels, run, "recall@3") == {"q": pytest.approx(2 / 3)}
    with pytest.raises(ValueError, match="unknown metric 'map@10'"):
        ir_metrics(qrels, run, ["map@10"])


def test_zero_relevance_is_not_relevant() -> None:
    with pytest.raises(ValueError, match="no query has a relevant document"):
        ir_metrics({"q1": {"d1": 0}}, {"q1": {"d1": 1.0}})


def test_normalize_answer_as_squad() -> None:
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert normalize_answer("an apple, a pear") == "apple pear"


def test_has_answer_needs_whole_tokens() -> None:
    assert has_answer("Super Bowl 50 was won by the Denver Broncos.", ["denver broncos"])
    assert not has_answer("The Broncos won in 2016.", ["2015"])
    assert not has_answer("catalogue", ["cat"])  # not a whole-token match


def test_answer_accuracy_at_k() -> None:
    retrieved = {"q1": ["nothing here", "the answer is Paris"], "q2": ["Berlin is big"], "q3": ["x"]}
    answers = {"q1": ["Paris"], "q2": ["Berlin"], "q3": ["Rome"], "q4": []}  # q4 has no answer: skipped
    acc = answer_accuracy(retrieved, answers, ks=(1, 2))
    assert acc == {"answer@1": pytest.approx(1 / 3), "answer@2": pytest.approx(2 / 3)}
