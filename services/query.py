"""Query: question tower -> vector -> store.search (dense | sparse BM25 | hybrid fusion) -> hits.

A question is only ever compared with passages embedded by its own partner tower: the collection's model
fingerprint, dimension and distance are checked first, and a mismatch is refused with the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from encoders.towers import DualEncoder
from services.errors import CollectionNotFound, ConfigError
from services.ingest import SparseEncoder
from services.sparse import for_spec
from services.store.common import check_compatible, check_linear_weight, request_filter, require_sparse
from services.store.points import CollectionSpec, Fusion, Hit, SearchMode, SearchRequest
from services.store.protocol import VectorStore

MAX_K = 1000


@dataclass(frozen=True)
class QueryOptions:
    k: int = 10
    mode: SearchMode | None = None  # None: the collection's tuned default, else dense
    filters: dict[str, Any] = field(default_factory=dict)
    fusion: Fusion | None = None  # None: the collection's tuned fusion, else rrf
    rrf_k: int | None = None
    linear_weight: float | None = None
    candidates: int | None = None


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
    """Fill unset options from the collection's tuned settings (``dpr tune-hybrid``), then defaults."""
    if not 1 <= options.k <= MAX_K:
        raise ConfigError(f"k={options.k} is out of range; use 1..{MAX_K}")
    tuned = dict(spec.settings.get("hybrid") or {})
    mode: SearchMode = options.mode or spec.settings.get("mode") or "dense"
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
) -> list[list[Hit]]:
    """Answer several questions: one question-tower batch, then one store search each."""
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
    if base.mode != "sparse":
        if towers_for is not None and spec.model != towers.fingerprint:
            towers = towers_for(spec.model)  # the question tower follows the collection across re-embeds
        check_towers(spec, towers, store.alias)
        dense = towers.encode_queries(list(questions), batch_size=batch_size)  # (n, dim)
    if base.mode != "dense" and sparse is None:
        raise ConfigError(f"--mode {base.mode} needs the BM25 sparse encoder; none was configured")
    sparse = for_spec(spec, sparse)  # tokenise as the collection's passages were (its stored BM25 language)
    results = []
    for i, q in enumerate(questions):
        request = SearchRequest(
            k=base.k,
            mode=base.mode,
            dense=dense[i].tolist() if base.mode != "sparse" else None,
            sparse=sparse.embed_query(q) if sparse is not None and base.mode != "dense" else None,
            filters=base.filters,
            fusion=base.fusion,
            rrf_k=base.rrf_k,
            linear_weight=base.linear_weight,
            candidates=base.candidates,
        )
        results.append(store.search(request, generation=generation))  # pinned: one generation per answer
    return results


def search(
    question: str,
    *,
    store: VectorStore,
    towers: DualEncoder,
    options: QueryOptions | None = None,
    sparse: SparseEncoder | None = None,
    towers_for: Callable[[str], DualEncoder] | None = None,
) -> list[Hit]:
    return search_many([question], store=store, towers=towers, options=options, sparse=sparse, towers_for=towers_for)[0]
