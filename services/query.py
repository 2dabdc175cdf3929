"""Query: question tower -> vector -> store.search (dense | sparse BM25 | hybrid fusion) -> hits [-> reranker].

With a reranker (``QueryOptions.rerank``, else the collection's ``rerank`` setting that `dpr train-reranker` stored
where its dev split gained), the store returns the top N and a cross-encoder reorders them; hits keep the first
stage's ``score`` and carry ``rerank_score``.

A question is only ever compared with passages embedded by its own partner tower: the collection's model
fingerprint, dimension and distance are checked first, and a mismatch is refused with the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from encoders.towers import DualEncoder
from services.core.errors import CollectionNotFound, ConfigError, Conflict
from services.store.common import check_compatible, check_linear_weight, request_filter, require_sparse, serving_mode
from services.store.points import CollectionSpec, Fusion, Hit, SearchMode, SearchRequest
from services.store.protocol import VectorStore

if TYPE_CHECKING:  # the BM25 side loads only for a sparse or hybrid search: a dense `dpr query` never imports it
    from encoders.rerank import Reranker
    from services.store.sparse import SparseEncoder

MAX_K = 1000
RERANK_KEY = "rerank"  # the setting `dpr train-reranker` stores: model, candidates, enabled, weight, dev gain
RerankerFor = Callable[["str | None"], "Reranker"]  # the collection's recorded reranker name (or None) -> reranker


@dataclass(frozen=True)
class QueryOptions:
    k: int = 10
    mode: SearchMode | None = None  # None: the collection's serving mode (tuned, else label-free hybrid)
    filters: dict[str, Any] = field(default_factory=dict)
    fusion: Fusion | None = None  # None: the collection's tuned fusion, else the label-free one
    rrf_k: int | None = None
    linear_weight: float | None = None
    candidates: int | None = None
    rerank: int | None = None  # None: the collection's default; 0: off; N: rerank the first stage's top N (below k:
    # the rest of the k follow them in the first stage's order)
    rerank_weight: float | None = None  # None: the collection's (chosen on its dev split), else 1: reranker alone


@dataclass(frozen=True)
class RerankPlan:
    n: int  # first-stage hits to rerank (0: none)
    model: str | None  # the collection's reranker name, or None
    weight: float = 1.0  # the reranker's share of the order (``encoders.rerank.fuse_scores``)


def rerank_plan(spec: CollectionSpec, options: QueryOptions) -> RerankPlan:
    """How many first-stage hits to rerank, with which reranker and weight: the options, else the collection's."""
    stored = dict(spec.settings.get(RERANK_KEY) or {})
    if options.rerank is None:
        n = int(stored.get("candidates") or 0) if stored.get("enabled") else 0
    else:
        n = options.rerank
    if not 0 <= n <= MAX_K:
        raise ConfigError(f"rerank={n} is out of range; use 0 (off) or 1..{MAX_K} first-stage hits")
    weight = options.rerank_weight if options.rerank_weight is not None else float(stored.get("weight", 1.0))
    if not 0.0 <= weight <= 1.0:
        raise ConfigError(f"rerank weight {weight} is out of range; use 0..1 (1: the reranker's order alone)")
    return RerankPlan(n, stored.get("model"), weight)


def rerank_hits(question: str, hits: list[Hit], reranker: Reranker, k: int, batch_size: int = 32,
                weight: float = 1.0) -> list[Hit]:
    """``hits`` ordered by the reranker's score of (question, passage text), or by its fusion with the first
    stage's at ``weight`` < 1 (``encoders.rerank.fuse_scores``), cut to ``k``; each keeps its first-stage
    ``score`` and carries ``rerank_score`` (the reranker's own)."""
    from encoders.rerank import fuse_scores

    if not hits:
        return hits
    scores = reranker.score(question, [h.passage.text for h in hits], batch_size=batch_size)  # (len(hits),)
    fused = fuse_scores([h.score for h in hits], [float(x) for x in scores], weight)
    order = sorted(range(len(hits)), key=lambda i: -fused[i])  # stable: ties keep the first stage's order
    return [replace(hits[i], rerank_score=float(scores[i])) for i in order[:k]]


def active_spec(store: VectorStore) -> CollectionSpec:
    active = store.active()
    if active is None:
        raise CollectionNotFound(
            f"collection {store.alias!r} does not exist yet; ingest something first (`dpr ingest PATH`)"
        )
    return active.spec


def check_towers(spec: CollectionSpec, towers: DualEncoder, alias: str) -> None:
    """Refuse towers that are not the partner of the passage tower that built the collection."""
    wanted = CollectionSpec(dim=towers.dim, distance=towers.similarity, model=towers.fingerprint)
    check_compatible(alias, None, spec, wanted)


def resolve_request(spec: CollectionSpec, options: QueryOptions, alias: str) -> SearchRequest:
    """Fill unset options from the collection's serving mode (``services.store.common.serving_mode``)."""
    if not 1 <= options.k <= MAX_K:
        raise ConfigError(f"k={options.k} is out of range; use 1..{MAX_K}")
    serving = serving_mode(spec)  # tuned (`dpr tune-hybrid`), else the label-free default, else dense-only
    tuned = serving.fusion
    mode: SearchMode = options.mode or serving.mode
    require_sparse(alias, None, spec, mode)
    weight = options.linear_weight if options.linear_weight is not None else tuned.get("linear_weight", 0.5)
    check_linear_weight(float(weight))
    return SearchRequest(
        k=options.k,
        mode=mode,
        filters=dict(options.filters),
        fusion=options.fusion or tuned.get("fusion", "rrf"),
        rrf_k=int(options.rrf_k or tuned.get("rrf_k", 60)),
        linear_weight=float(weight),
        candidates=int(options.candidates or tuned.get("candidates", max(100, options.k))),
    )


def search_many(
    questions: Sequence[str],
    *,
    store: VectorStore,
    towers: DualEncoder,
    options: QueryOptions | None = None,
    sparse: SparseEncoder | None = None,
    batch_size: int = 32,
    towers_for: Callable[[str], DualEncoder] | None = None,
    reranker_for: RerankerFor | None = None,
    rerank_batch_size: int = 32,
    sparse_for: Callable[[], SparseEncoder] | None = None,
) -> list[list[Hit]]:
    """Answer several questions: one question-tower batch, then one store search each (then the reranker).
    ``sparse_for`` builds the BM25 encoder when ``sparse`` is None and the mode needs one (not for dense)."""
    options = options or QueryOptions()
    for q in questions:
        if not q.strip():
            raise ConfigError("the question is empty; ask something")
    request_filter(options.filters)  # a bad key or value is refused before the store or the towers are touched
    active = store.active()
    if active is None:
        active_spec(store)  # raises CollectionNotFound with the fix
    generation, spec = active.name, active.spec  # type: ignore[union-attr]
    base = resolve_request(spec, options, store.alias)
    plan = rerank_plan(spec, options)
    reranker = None
    if plan.n:
        if reranker_for is None:
            raise Conflict("reranking was asked for but no reranker is configured here; use rerank=0")
        reranker = reranker_for(plan.model)
    if base.mode != "sparse":
        if towers_for is not None and spec.model != towers.fingerprint:
            towers = towers_for(spec.model)  # the question tower follows the collection across re-embeds
        check_towers(spec, towers, store.alias)
        dense = towers.encode_queries(list(questions), batch_size=batch_size)  # (n, dim)
    if base.mode != "dense":
        if sparse is None and sparse_for is not None:
            sparse = sparse_for()
        if sparse is None:
            raise Conflict(f"--mode {base.mode} needs the BM25 sparse encoder; none was configured")
        from services.store.sparse import for_spec

        sparse = for_spec(spec, sparse)  # tokenise as the collection's passages were (its stored BM25 language)
    results = []
    for i, q in enumerate(questions):
        request = SearchRequest(
            k=max(base.k, plan.n),
            mode=base.mode,
            dense=dense[i].tolist() if base.mode != "sparse" else None,
            sparse=sparse.embed_query(q) if sparse is not None and base.mode != "dense" else None,
            filters=base.filters,
            fusion=base.fusion,
            rrf_k=base.rrf_k,
            linear_weight=base.linear_weight,
            candidates=base.candidates,
        )
        hits = store.search(request, generation=generation)  # pinned: one generation per answer
        if reranker is not None:  # the top N reordered; below k, the rest follow in the first stage's order
            top = min(base.k, plan.n)
            hits = rerank_hits(q, hits[:plan.n], reranker, top, rerank_batch_size, plan.weight) + hits[plan.n:base.k]
        results.append(hits)
    return results


def search(
    question: str,
    *,
    store: VectorStore,
    towers: DualEncoder,
    options: QueryOptions | None = None,
    sparse: SparseEncoder | None = None,
    towers_for: Callable[[str], DualEncoder] | None = None,
    reranker_for: RerankerFor | None = None,
    rerank_batch_size: int = 32,
    sparse_for: Callable[[], SparseEncoder] | None = None,
) -> list[Hit]:
    return search_many([question], store=store, towers=towers, options=options, sparse=sparse, towers_for=towers_for,
                       reranker_for=reranker_for, rerank_batch_size=rerank_batch_size, sparse_for=sparse_for)[0]
