"""Converters of the embedded engine (``edge.py``): the store's neutral records (filters, vectors, branches) to
qdrant-edge's types, and its answers back. Pure functions, no shard."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from qdrant_edge import (
    FieldCondition,
    Filter,
    MatchAny,
    MatchValue,
    Query,
    QueryRequest,
    RangeFloat,
    SearchParams,
)
from qdrant_edge import SparseVector as EdgeSparseVector

from services.store.common import AtLeast, Match, Scored, Where, build_filter
from services.store.points import SparseVector
from services.store.protocol import Branch, Vector


def to_filter(where: Where | None) -> Filter | None:
    return None if where is None else to_where(where)


def to_where(where: Where) -> Filter:
    return build_filter(where, Filter, to_field)  # type: ignore[no-any-return]


def to_field(condition: Match | AtLeast) -> FieldCondition:
    if isinstance(condition, AtLeast):
        return FieldCondition(key=condition.key, range=RangeFloat(gte=float(condition.value)))
    match = MatchAny(condition.any_values()) if condition.any_of else MatchValue(condition.values[0])
    return FieldCondition(key=condition.key, match=match)


def from_engine(vector: Any) -> Vector:
    """An engine vector as the store's: ``SparseVector`` or a list of floats."""
    if hasattr(vector, "indices"):
        return SparseVector(indices=list(vector.indices), values=[float(v) for v in vector.values])
    return [float(v) for v in vector]


def to_vector(vector: Vector) -> Any:
    if isinstance(vector, SparseVector):
        return EdgeSparseVector(indices=list(vector.indices), values=list(vector.values))
    return vector


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
