"""Run retrieval systems over one dataset, compute metric tables, write a Markdown report with PNG plots.

A *retriever* is any callable ``(dataset, k) -> Retrieval``: BM25 (bm25s), towers in memory (an exact cosine scan,
used for the dev split while training), or the real store (``store_retriever.py`` beside this module ingests the
corpus into a temporary collection and queries it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from encoders.data import RetrievalDataset
from services.lab.shared.metrics import (
    DEFAULT_ANSWER_KS,
    DEFAULT_METRICS,
    answer_accuracy,
    ir_metrics,
    paired_randomization,
    per_query,
)

log = logging.getLogger(__name__)

CURVE_KS = (1, 2, 3, 5, 10, 20, 50, 100)


@dataclass
class Retrieval:
    """Document-level results: ``run`` query id -> {doc id: score} (top k), ``texts`` query id -> passage texts best
    first (for answer accuracy; chunk texts when the retriever works on chunks)."""

    run: dict[str, dict[str, float]]
    texts: dict[str, list[str]] = field(default_factory=dict)


Retriever = Callable[[RetrievalDataset, int], Retrieval]


@dataclass
class SystemResult:
    system: str
    metrics: dict[str, float]
    curves: dict[str, dict[int, float]]  # "recall" / "answer" -> {k: value}
    seconds: float
    run: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)  # for significance tests


@dataclass
class EvalReport:
    dataset: str
    queries: int
    documents: int
    results: list[SystemResult]
    notes: list[str] = field(default_factory=list)
    # system -> reference (bm25, base) -> {"delta", "p", "significant"}: ``add_significance``
    significance: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "queries": self.queries,
            "documents": self.documents,
            "systems": {
                r.system: {"metrics": r.metrics, "curves": r.curves, "seconds": round(r.seconds, 1)}
                for r in self.results
            },
            "notes": self.notes,
            **({"significance": self.significance} if self.significance else {}),
        }

    def metric_names(self) -> list[str]:
        names: list[str] = []
        for r in self.results:
            for m in r.metrics:
                if m not in names:
                    names.append(m)
        return names

    def to_markdown_table(self) -> str:
        names = self.metric_names()
        refs = self.significance_references()
        lines = ["| system | " + " | ".join([*names, *(f"vs {r}" for r in refs)]) + " |",
                 "|---|" + "---|" * (len(names) + len(refs))]
        for r in self.results:
            cells = [f"{r.metrics.get(m, float('nan')):.3f}" for m in names]
            cells += [self.significance_cell(r.system, ref) for ref in refs]
            lines.append(f"| {r.system} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def significance_references(self) -> list[str]:
        """The references tested against, in the systems' order (bm25 before base as they run)."""
        refs = {ref for per in self.significance.values() for ref in per}
        return [r.system for r in self.results if r.system in refs]

    def significance_cell(self, system: str, reference: str) -> str:
        """``+0.048 (p 0.003)*`` (``*``: significant), ``-`` for the reference itself or no test."""
        test = self.significance.get(system, {}).get(reference)
        if test is None:
            return "-"
        return f"{test['delta']:+.3f} (p {test['p']:.3f})" + ("*" if test["significant"] else "")

    def add_significance(self, qrels: Mapping[str, Mapping[str, int]], references: Sequence[str] = ("bm25", "base"),
                         metric: str = "ndcg@10", max_p: float = 0.05) -> None:
        """Each system against each reference present: the difference in ``metric`` and the p-value of a paired
        randomization test (``services.lab.shared.metrics.paired_randomization``) over the same queries."""
        runs = {r.system: r.run for r in self.results if r.run}
        refs = [ref for ref in references if ref in runs]
        if not refs or len(runs) < 2:
            return
        scores = {name: per_query(qrels, run, metric) for name, run in runs.items()}  # same judged queries each
        for system in runs:
            for ref in refs:
                if system == ref:
                    continue
                a, b = list(scores[system].values()), list(scores[ref].values())
                p = paired_randomization(a, b)
                self.significance.setdefault(system, {})[ref] = {
                    "metric": metric, "delta": round(sum(a) / len(a) - sum(b) / len(b), 4), "p": round(p, 4),
                    "significant": p < max_p}
        self.notes.append(f"vs bm25 / vs base: difference in {metric} and the p-value of a paired randomization "
                          f"test (10,000 sign flips of the per-query differences, per-query scores); "
                          f"* = p < {max_p}")


def score_retrieval(
    dataset: RetrievalDataset, retrieval: Retrieval, metrics: Sequence[str] = DEFAULT_METRICS
) -> tuple[dict[str, float], dict[str, dict[int, float]]]:
    """Metrics (ranx) and curves for one system's retrieval."""
    scores = ir_metrics(dataset.qrels, retrieval.run, metrics)
    curves: dict[str, dict[int, float]] = {}
    recall = ir_metrics(dataset.qrels, retrieval.run, [f"recall@{k}" for k in CURVE_KS])
    curves["recall"] = {k: recall[f"recall@{k}"] for k in CURVE_KS}
    if dataset.answers and retrieval.texts:
        acc = answer_accuracy(retrieval.texts, dataset.answers, ks=CURVE_KS)
        curves["answer"] = {k: acc[f"answer@{k}"] for k in CURVE_KS}
        for k in DEFAULT_ANSWER_KS:
            scores[f"answer@{k}"] = curves["answer"][k]
    return scores, curves


def evaluate_systems(dataset: RetrievalDataset, retrievers: Mapping[str, Retriever], k: int = 100) -> EvalReport:
    results = []
    for name, retriever in retrievers.items():
        t0 = time.perf_counter()
        retrieval = retriever(dataset, k)
        seconds = time.perf_counter() - t0
        metrics, curves = score_retrieval(dataset, retrieval)
        log.info("evaluated", extra={"system": name, "metrics": metrics, "seconds": round(seconds, 1)})
        results.append(SystemResult(name, metrics, curves, seconds, run=retrieval.run))
    return EvalReport(dataset.name, len(dataset.queries), len(dataset.corpus), results)


# --- retrievers -------------------------------------------------------------------------------------------------


def bm25_retriever(config: Any = None) -> Retriever:
    """BM25 (bm25s; English stopwords, Snowball stemming, k1 1.5, b 0.75 by default; ``BM25Config.for_language
    ("ko")`` for Korean morphemes) over title + text."""

    def run(dataset: RetrievalDataset, k: int) -> Retrieval:
        from services.lab.shared.mining import BM25Index

        index = BM25Index(list(dataset.corpus.values()), config)
        qids = sorted(dataset.queries)
        ranked = index.search([dataset.queries[q] for q in qids], k=k)
        out = Retrieval(run={}, texts={})
        for qid, hits in zip(qids, ranked, strict=True):
            out.run[qid] = dict(hits)
            out.texts[qid] = [dataset.corpus[d].passage for d, _ in hits]
        return out

    return run


def encode(model: Any, texts: Sequence[str], role: str, batch_size: int = 32) -> Any:
    """L2-normalised float32 vectors of ``texts`` by the question (``role`` query) or passage (document) tower."""
    import numpy as np

    if not texts:
        return np.zeros((0, 1), dtype=np.float32)
    fn = model.encode_query if role == "query" else model.encode_document
    return np.asarray(fn(list(texts), batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                         show_progress_bar=False), dtype=np.float32)  # (n, dim)


def encode_corpus(model: Any, dataset: RetrievalDataset, batch_size: int = 32) -> Any:
    """``model``'s passage vectors of ``dataset``'s documents, in ``sorted(dataset.corpus)`` order (L2-normalised)."""
    return encode(model, [dataset.corpus[d].passage for d in sorted(dataset.corpus)], "document", batch_size)


def dense_in_memory(model: Any, dataset: RetrievalDataset, k: int = 100, batch_size: int = 32,
                    doc_vectors: Any = None) -> Retrieval:
    """Exact cosine top-k of ``model`` (a SentenceTransformer) over whole documents (truncated by the passage tower).
    ``doc_vectors``: the passage vectors ``encode_corpus`` made of the same documents with the same passage tower
    (models that share a passage tower, such as question-only candidates, encode the corpus once)."""
    import numpy as np

    doc_ids = sorted(dataset.corpus)
    qids = sorted(dataset.queries)
    docs = encode_corpus(model, dataset, batch_size) if doc_vectors is None else doc_vectors
    if len(docs) != len(doc_ids):
        raise ValueError(f"{len(docs)} passage vectors for the {len(doc_ids)} documents of {dataset.name}")
    queries = encode(model, [dataset.queries[q] for q in qids], "query", batch_size)  # (n_queries, dim)
    scores = np.asarray(queries, dtype=np.float32) @ np.asarray(docs, dtype=np.float32).T  # (n_queries, n_docs)
    k = min(k, len(doc_ids))
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]  # (n_queries, k), unordered
    out = Retrieval(run={}, texts={})
    for row, qid in enumerate(qids):
        idx = top[row][np.argsort(-scores[row, top[row]])]
        out.run[qid] = {doc_ids[i]: float(scores[row, i]) for i in idx}
        out.texts[qid] = [dataset.corpus[doc_ids[i]].passage for i in idx]
    return out


def evaluate_model_in_memory(model: Any, dataset: RetrievalDataset, k: int = 100,
                             batch_size: int = 32, doc_vectors: Any = None) -> dict[str, float]:
    """The dev-split evaluator used during training: metrics of ``model`` in memory (``doc_vectors``: as
    ``dense_in_memory``)."""
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        metrics, _ = score_retrieval(dataset, dense_in_memory(model, dataset, k, batch_size, doc_vectors))
    finally:
        if was_training:
            model.train()
    return metrics


def towers_in_memory_retriever(model_path: Path) -> Retriever:
    def run(dataset: RetrievalDataset, k: int) -> Retrieval:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(model_path), device="cpu", local_files_only=True)
        return dense_in_memory(model, dataset, k)

    return run


# --- report -----------------------------------------------------------------------------------------------------


def write_report(report: EvalReport, out_dir: Path, title: str | None = None) -> Path:
    """``report.md``, ``results.json`` and one PNG per curve (recall@k; answer accuracy@k for SQuAD-style data)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = []
    for curve, label in (("recall", "recall@k"), ("answer", "top-k answer accuracy")):
        series = {r.system: r.curves[curve] for r in report.results if curve in r.curves}
        if series:
            path = out_dir / f"{curve}_at_k.png"
            _plot_curves(series, label, f"{report.dataset}: {label}", path)
            plots.append((label, path.name))
    lines = [
        f"# {title or 'Retrieval evaluation'}: {report.dataset}",
        "",
        f"{report.queries} queries, {report.documents} documents.",
        "",
        report.to_markdown_table(),
        "",
        "| system | seconds |",
        "|---|---|",
        *[f"| {r.system} | {r.seconds:.1f} |" for r in report.results],
        "",
    ]
    for note in report.notes:
        lines.append(f"- {note}")
    if report.notes:
        lines.append("")
    for label, name in plots:
        lines += [f"## {label}", "", f"![{label}]({name})", ""]
    md = out_dir / "report.md"
    md.write_text("\n".join(lines))
    (out_dir / "results.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return md


def _plot_curves(series: Mapping[str, Mapping[int, float]], ylabel: str, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    for system, curve in series.items():
        ks = sorted(curve)
        ax.plot(ks, [curve[k] for k in ks], marker="o", label=system)
    ax.set_xscale("log")
    ax.set_xticks(list(CURVE_KS))
    ax.set_xticklabels([str(k) for k in CURVE_KS])
    ax.set_xlabel("k")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1)
    ax.grid(True, alpha=0.3)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
