"""Hybrid tuning: pick the fusion (RRF or DPR's linear combination) and its parameters on a DEV split, through the
real store, and record the choice in the collection's settings (``services.query.resolve_request`` reads it).
docs/hybrid.md, "Tuning", gives the split, the grid and the metric.

The dev split is never test (``services.readers.load_dev_split``: the questions ``dpr train`` holds out). The dev
corpus is ingested ONCE with dense + BM25 sparse vectors (or the user's collection is reused when it already holds
it, embedded by the same model, with sparse vectors); every grid point asks the dev questions with
``search_many``. Ties keep the earlier grid point (RRF first, then linear by increasing dense weight).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from encoders.data import RetrievalDataset
from encoders.towers import DualEncoder
from services.core.errors import CollectionNotFound, ConfigError
from services.core.settings import Settings
from services.ingest.language import resolve_language
from services.lab.evaluation.retrieval import score_retrieval
from services.lab.evaluation.store_retriever import StoreCorpus, dataset_documents
from services.query import QueryOptions
from services.store.common import require_sparse
from services.store.points import Fusion
from services.store.protocol import VectorStore
from services.store.sparse import spec_language

log = logging.getLogger(__name__)

RRF_KS = (10, 30, 60, 100)
LINEAR_WEIGHTS = tuple(round(i / 10, 1) for i in range(11))  # weight of the DENSE score
CANDIDATES = (100,)
TUNE_DEPTH = 100  # documents per ranking, as `dpr eval` (k=100) asks: the fused lists are the same


@dataclass(frozen=True)
class FusionChoice:
    fusion: Fusion
    rrf_k: int = 60
    linear_weight: float = 0.5
    candidates: int = 100

    def options(self) -> QueryOptions:
        return QueryOptions(
            mode="hybrid",
            fusion=self.fusion,
            rrf_k=self.rrf_k,
            linear_weight=self.linear_weight,
            candidates=self.candidates,
        )

    def label(self) -> str:
        head = f"rrf k={self.rrf_k}" if self.fusion == "rrf" else f"linear w={self.linear_weight:g}"
        return f"{head} c={self.candidates}"

    def to_json(self) -> dict[str, Any]:
        return {
            "fusion": self.fusion,
            "rrf_k": self.rrf_k,
            "linear_weight": self.linear_weight,
            "candidates": self.candidates,
        }

    @classmethod
    def from_settings(cls, hybrid: dict[str, Any]) -> FusionChoice:
        return cls(
            fusion=hybrid.get("fusion", "rrf"),
            rrf_k=int(hybrid.get("rrf_k", 60)),
            linear_weight=float(hybrid.get("linear_weight", 0.5)),
            candidates=int(hybrid.get("candidates", 100)),
        )


def fusion_grid(
    rrf_ks: Sequence[int] = RRF_KS,
    weights: Sequence[float] = LINEAR_WEIGHTS,
    candidates: Sequence[int] = CANDIDATES,
) -> list[FusionChoice]:
    """RRF for each ``rrf_k``, then linear for each dense weight, for each candidate depth (in that order)."""
    grid = []
    for c in candidates:
        grid += [FusionChoice("rrf", rrf_k=k, candidates=c) for k in rrf_ks]
        grid += [FusionChoice("linear", linear_weight=float(w), candidates=c) for w in weights]
    if not grid:
        raise ConfigError("the fusion grid is empty; give at least one rrf_k or linear weight and one candidate depth")
    return grid


def tuning_metrics(dataset: RetrievalDataset) -> tuple[str, str]:
    """(metric to maximise, tie-breaker): answer@20 then nDCG@10 with answers (SQuAD), else nDCG@10 then recall@100."""
    return ("answer@20", "ndcg@10") if dataset.answers else ("ndcg@10", "recall@100")


def select_best(
    scored: Sequence[tuple[FusionChoice, dict[str, float]]], metric: str, tie: str
) -> tuple[FusionChoice, dict[str, float]]:
    """The grid point with the best ``metric`` (then ``tie``); equal scores keep the earlier grid point."""
    if not scored:
        raise ConfigError("nothing to select from: the fusion grid produced no scores")

    def key(item: tuple[int, tuple[FusionChoice, dict[str, float]]]) -> tuple[float, float, int]:
        i, (_, m) = item
        return (round(m[metric], 9), round(m.get(tie, 0.0), 9), -i)

    _, best = max(enumerate(scored), key=key)
    return best


# --- tuning --------------------------------------------------------------------------------------------------------


@dataclass
class TuneResult:
    choice: FusionChoice
    metric: str
    dev_score: float
    dense_score: float
    sparse_score: float
    tuned_on: dict[str, Any]
    grid: list[tuple[FusionChoice, dict[str, float]]] = field(default_factory=list)
    dense_metrics: dict[str, float] = field(default_factory=dict)
    sparse_metrics: dict[str, float] = field(default_factory=dict)
    reused_collection: bool = False

    def settings(self) -> dict[str, Any]:
        """What goes into the collection spec's ``settings`` (``dpr status`` shows it; queries use it)."""
        return {
            "mode": "hybrid",
            "hybrid": {
                **self.choice.to_json(),
                "metric": self.metric,
                "dev_score": round(self.dev_score, 4),
                "dense_score": round(self.dense_score, 4),
                "sparse_score": round(self.sparse_score, 4),
                "tuned_on": self.tuned_on,
            },
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **self.settings(),
            "reused_collection": self.reused_collection,
            "grid": [{**c.to_json(), **{k: round(v, 4) for k, v in m.items()}} for c, m in self.grid],
        }


def tune_on_corpus(
    corpus: StoreCorpus,
    dev: RetrievalDataset,
    grid: Sequence[FusionChoice] | None = None,
    *,
    k: int = TUNE_DEPTH,
    on_point: Callable[[str, dict[str, float]], None] | None = None,
) -> TuneResult:
    """Dense, BM25 and every grid point over ``dev`` through ``corpus`` (ingested on first use); the best point."""
    grid = list(grid) if grid is not None else fusion_grid()
    metric, tie = tuning_metrics(dev)

    def run(options: QueryOptions, label: str) -> dict[str, float]:
        metrics, _ = score_retrieval(dev, corpus.search(dev, k, options))
        if on_point is not None:
            on_point(label, metrics)
        log.info("tuning point", extra={"point": label, metric: metrics[metric]})
        return metrics

    dense = run(QueryOptions(mode="dense"), "dense")
    sparse = run(QueryOptions(mode="sparse"), "bm25 (sparse)")
    scored = [(choice, run(choice.options(), choice.label())) for choice in grid]
    choice, best = select_best(scored, metric, tie)
    return TuneResult(
        choice=choice,
        metric=metric,
        dev_score=best[metric],
        dense_score=dense[metric],
        sparse_score=sparse[metric],
        tuned_on={
            "dataset": dev.name,
            "queries": len(dev.queries),
            "documents": len(dev.corpus),
            "model": corpus.towers.fingerprint,
            "depth": k,
            "grid": len(grid),
        },
        grid=scored,
        dense_metrics=dense,
        sparse_metrics=sparse,
    )


def holds_corpus(store: VectorStore, dataset: RetrievalDataset, towers: DualEncoder) -> bool:
    """True when ``store``'s active generation has every document of ``dataset``'s corpus, embedded by ``towers``'
    model, with BM25 sparse vectors: tuning can then ask it directly instead of ingesting a temporary copy."""
    info = store.info()
    if info.active is None or not info.active.spec.sparse or info.active.spec.model != towers.fingerprint:
        return False
    ids = [d.doc_id for d in dataset_documents(dataset)]
    states = store.doc_states(ids)
    return len(states) == len(set(ids)) and all(s.model == towers.fingerprint for s in states.values())


def check_target(store: VectorStore) -> None:
    """The collection that receives the tuned choice must exist and carry sparse vectors."""
    info = store.info()
    if info.active is None:
        raise CollectionNotFound(
            f"collection {store.alias!r} does not exist, so there is nowhere to store the tuned fusion; ingest "
            f"your documents first (`dpr ingest PATH --collection {store.alias}`), then tune"
        )
    require_sparse(store.alias, info.active.name, info.active.spec, "hybrid")


def tune_hybrid(
    dev: RetrievalDataset,
    *,
    towers: DualEncoder,
    settings: Settings,
    target: VectorStore | None = None,
    workdir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_point: Callable[[str, dict[str, float]], None] | None = None,
    language: str | None = None,
) -> TuneResult:
    """Tune on ``dev`` and, when ``target`` is given, merge the choice into its settings (``mode: hybrid``).

    ``target`` is reused as the dev corpus when it already holds it (``holds_corpus``); otherwise the dev corpus is
    ingested into a temporary embedded collection, deleted afterwards, with the BM25 language of ``target`` (an
    explicit ``language`` that contradicts it is refused), else ``language`` / detected on the dev corpus.
    """
    reuse = False
    stored = None
    if target is not None:
        check_target(target)
        reuse = holds_corpus(target, dev, towers)
        stored = spec_language(target.active().spec)  # type: ignore[union-attr]
    lang = resolve_language(language, stored=stored, sample=(d.passage for d in dev.corpus.values()),
                            collection=target.alias if target is not None else "")
    if reuse and target is not None:
        corpus = StoreCorpus.existing(target, towers, settings)
    else:
        corpus = StoreCorpus(towers, settings=settings, collection="tune", workdir=workdir, progress=progress,
                             language=lang)
    try:
        result = tune_on_corpus(corpus, dev, on_point=on_point)
    finally:
        corpus.close()
    result.reused_collection = reuse
    result.tuned_on["language"] = lang
    result.tuned_on["corpus"] = f"collection {target.alias}" if reuse and target else "temporary collection"
    if target is not None:
        target.update_settings(result.settings())
        log.info("stored the tuned fusion", extra={"collection": target.alias, **result.choice.to_json()})
    return result
