"""The embedded shard's config for a collection spec: the one place both the serving process (``edge.py``) and the
index build's child process (``edge_index.py``) read it, so neither imports the other.

``EdgeLevers`` are the memory levers a generation is created with (``settings.edge``: int8 scalar quantization,
original vectors and payloads on disk, HNSW m / ef_construct; docs/capacity.md). They are recorded beside the
generation's spec (``levers.json``) because the index build reloads the shard with a config, and a dense vector's
memory placement that the reload does not repeat falls back to RAM (measured on qdrant-edge 0.9.0: a ``Cold``
vector storage came back ``InRamMmap`` after ``optimize()``); quantization and payload placement persist.
``levers_from`` / ``search_params_from`` read them from the settings (``dense_params``: the rescoring an int8
generation needs). Below: the converters of the store's neutral records to qdrant-edge's types and back (pure
functions; in this module so `dpr query` loads one module for both).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from qdrant_edge import (
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeSparseVectorParams,
    EdgeVectorParams,
    FieldCondition,
    Filter,
    HnswIndexConfig,
    MatchAny,
    MatchValue,
    Memory,
    Modifier,
    Point,
    QuantizationSearchParams,
    Query,
    QueryRequest,
    RangeFloat,
    ScalarQuantizationConfig,
    ScalarType,
    SearchParams,
    UpdateOperation,
)
from qdrant_edge import SparseVector as EdgeSparseVector

from services.store.common import AtLeast, Match, Scored, Where, build_filter
from services.store.points import DENSE, SPARSE, CollectionSpec, SparseVector
from services.store.protocol import Branch, PointRecord, Vector

if TYPE_CHECKING:
    from services.core.settings import EdgeSettings

_DISTANCES = {"cosine": Distance.Cosine, "dot": Distance.Dot, "euclid": Distance.Euclid}
# Qdrant's defaults, used for the half of (m, ef_construct) a user leaves unset; full_scan_threshold in KB
_HNSW_M, _HNSW_EF_CONSTRUCT, _FULL_SCAN_KB = 16, 100, 10_000
LEVERS_FILE = "levers.json"  # a generation's EdgeLevers, beside spec.json (the index build repeats them)
QUANTILE = 0.99  # int8 range from the 0.99 quantile of the values (Qdrant's quantization guide)


@dataclass(frozen=True)
class EdgeLevers:
    """How a generation's vectors and payloads are stored (fixed when it is created)."""

    quantization: Literal["none", "int8"] = "none"
    vectors_on_disk: bool = False
    payload_on_disk: bool = True  # the engine's own default (payload memory Cold)
    hnsw_m: int | None = None
    hnsw_ef_construct: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> EdgeLevers:
        known = {k: v for k, v in (data or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


def edge_config(
    spec: CollectionSpec, indexing_threshold_kb: int | None = None, levers: EdgeLevers | None = None
) -> EdgeConfig:
    """The shard's config; with ``indexing_threshold_kb`` (the index build), segments above it get HNSW."""
    levers = levers or EdgeLevers()
    optimizers = None
    if indexing_threshold_kb is not None:
        optimizers = EdgeOptimizersConfig(indexing_threshold=indexing_threshold_kb)
    hnsw = None
    if levers.hnsw_m is not None or levers.hnsw_ef_construct is not None:
        hnsw = HnswIndexConfig(
            m=_HNSW_M if levers.hnsw_m is None else levers.hnsw_m,
            ef_construct=levers.hnsw_ef_construct or _HNSW_EF_CONSTRUCT,
            full_scan_threshold=_FULL_SCAN_KB,
        )
    quantization = None
    if levers.quantization == "int8":  # the int8 copy stays in RAM; the fp32 originals rescore the candidates
        quantization = ScalarQuantizationConfig(type=ScalarType.Int8, quantile=QUANTILE, memory=Memory.Pinned)
    return EdgeConfig(
        vectors={DENSE: EdgeVectorParams(
            size=spec.dim, distance=_DISTANCES[spec.distance], memory=Memory.Cold if levers.vectors_on_disk else None
        )},
        sparse_vectors={SPARSE: EdgeSparseVectorParams(modifier=Modifier.Idf)} if spec.sparse else None,
        optimizers=optimizers,
        hnsw_config=hnsw,
        quantization_config=quantization,
        payload_memory=Memory.Cold if levers.payload_on_disk else Memory.Cached,
    )


def levers_from(edge: EdgeSettings) -> EdgeLevers:
    """The memory levers new generations are created with (``DPR_EDGE__QUANTIZATION`` etc.)."""
    return EdgeLevers(
        quantization=edge.quantization, vectors_on_disk=edge.vectors_on_disk, payload_on_disk=edge.payload_on_disk,
        hnsw_m=edge.hnsw_m, hnsw_ef_construct=edge.hnsw_ef_construct,
    )


def search_params_from(edge: EdgeSettings, fused: bool = False) -> SearchParams | None:
    """Dense search params from the settings (``fused``: for the dense branch of a hybrid query, whose ef is
    ``hybrid_ef`` when set); None (the engine's defaults) when no search lever is set."""
    ef = edge.search_ef(fused)
    if ef is None and edge.oversampling is None and edge.quantization == "none":
        return None
    quantization = None
    if edge.quantization != "none" or edge.oversampling is not None:
        quantization = QuantizationSearchParams(rescore=edge.rescore, oversampling=edge.oversampling)
    return SearchParams(hnsw_ef=ef, quantization=quantization)


def dense_params(params: SearchParams | None, quantized: bool) -> SearchParams | None:
    """``params`` for a dense search of a generation, with fp32 re-scoring added when the generation is int8 and
    ``params`` name no quantization lever (none at all, or an ef alone): the engine's default would rank by the
    int8 copy."""
    if not quantized or (params is not None and params.quantization is not None):
        return params
    return SearchParams(hnsw_ef=None if params is None else params.hnsw_ef, exact=params is not None and params.exact,
                        quantization=QuantizationSearchParams(rescore=True))


def levers_of(generation_dir: Path) -> dict[str, Any]:
    """The levers a generation was created with (``{}``: one made before levers existed, engine defaults)."""
    try:
        return dict(json.loads((generation_dir / LEVERS_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


# -- converters: the store's neutral records (filters, vectors, branches) to qdrant-edge's types and back -------


def to_filter(where: Where | None) -> Filter | None:
    return None if where is None else to_where(where)


def to_where(where: Where) -> Filter:
    return build_filter(where, Filter, to_field)  # type: ignore[no-any-return]


def to_field(condition: Match | AtLeast) -> FieldCondition:
    if isinstance(condition, AtLeast):
        return FieldCondition(key=condition.key, range=RangeFloat(gte=float(condition.value)))
    match = MatchAny(condition.any_values()) if condition.any_of else MatchValue(condition.values[0])
    return FieldCondition(key=condition.key, match=match)


def to_vector(vector: Vector) -> Any:
    if isinstance(vector, SparseVector):
        return EdgeSparseVector(indices=list(vector.indices), values=list(vector.values))
    return vector


def upsert_operation(points: Sequence[PointRecord]) -> UpdateOperation:
    """The engine's write of ``points`` (the serving process's, and the index build's replay of its journal)."""
    return UpdateOperation.upsert_points(
        [Point(pid, {n: to_vector(v) for n, v in vectors.items()}, payload) for pid, vectors, payload in points]
    )


def delete_operation(where: Where) -> UpdateOperation:
    return UpdateOperation.delete_points_by_filter(to_where(where))


def nearest(branch: Branch) -> Query:
    name, vector = branch
    return Query.Nearest(to_vector(vector), using=name)


def query_request(
    branch: Branch, limit: int, where: Where | None, with_payload: bool = True, params: SearchParams | None = None
) -> QueryRequest:
    return QueryRequest(
        limit=limit, query=nearest(branch), filter=to_filter(where), with_payload=with_payload, params=params
    )





def payload_fields(fields: Sequence[str] | bool) -> Any:
    return fields if isinstance(fields, bool) else list(fields)


def scored(points: Sequence[Any]) -> list[Scored]:
    return [(str(p.id), float(p.score), dict(p.payload or {})) for p in points]
