"""Systems -> metric tables -> Markdown report with PNG plots (fake retrievers, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from encoders.data import CorpusDoc, RetrievalDataset
from services.lab.evaluation.retrieval import Retrieval, bm25_retriever, evaluate_systems, write_report

pytestmark = pytest.mark.unit


def _dataset() -> RetrievalDataset:
    corpus = {
        "p1": CorpusDoc("p1", "Paris", "Paris is the capital of France."),
        "p2": CorpusDoc("p2", "Berlin", "Berlin is the capital of Germany."),
        "p3": CorpusDoc("p3", "Rome", "Rome is the capital of Italy."),
    }
    return RetrievalDataset(
        name="toy",
        corpus=corpus,
        queries={"q1": "capital of France", "q2": "capital of Germany"},
        qrels={"q1": {"p1": 1}, "q2": {"p2": 1}},
        answers={"q1": ["Paris"], "q2": ["Berlin"]},
    )


def _perfect(dataset: RetrievalDataset, k: int) -> Retrieval:
    run = {q: {next(iter(dataset.qrels[q])): 1.0} for q in dataset.queries}
    texts = {q: [dataset.corpus[d].passage for d in run[q]] for q in run}
    return Retrieval(run=run, texts=texts)


def _wrong(dataset: RetrievalDataset, k: int) -> Retrieval:
    return Retrieval(run={q: {"p3": 1.0} for q in dataset.queries}, texts={q: ["Rome"] for q in dataset.queries})


def test_report_tables_and_plots(tmp_path: Path) -> None:
    ds = _dataset()
    report = evaluate_systems(ds, {"perfect": _perfect, "wrong": _wrong, "bm25": bm25_retriever()}, k=3)
    by_name = {r.system: r for r in report.results}
    assert by_name["perfect"].metrics["ndcg@10"] == pytest.approx(1.0)
    assert by_name["perfect"].metrics["answer@1"] == pytest.approx(1.0)
    assert by_name["wrong"].metrics["recall@100"] == pytest.approx(0.0)
    assert by_name["wrong"].metrics["answer@20"] == pytest.approx(0.0)
    assert by_name["bm25"].metrics["mrr@10"] == pytest.approx(1.0)
    md = write_report(report, tmp_path / "r")
    text = md.read_text()
    assert "| perfect | 1.000" in text and "![recall@k](recall_at_k.png)" in text
    assert (tmp_path / "r" / "recall_at_k.png").stat().st_size > 1000
    assert (tmp_path / "r" / "answer_at_k.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "r" / "results.json").read_text())
    assert saved["systems"]["perfect"]["curves"]["answer"]["1"] == 1.0
