"""Converters of the server engine (``server.py``): the store's neutral records (filters, vectors) to qdrant-client
models (its scored answers come back through ``common.scored``). Pure functions, no client."""

from __future__ import annotations

from typing import Any

from qdrant_client import models

from services.store.common import AtLeast, Match, Where, build_filter
from services.store.points import SparseVector
from services.store.protocol import Vector


def to_filter(where: Where | None) -> models.Filter | None:
    return None if where is None else to_where(where)


def to_where(where: Where) -> models.Filter:
    return build_filter(where, models.Filter, to_field)  # type: ignore[no-any-return]


def to_field(condition: Match | AtLeast) -> models.FieldCondition:
    if isinstance(condition, AtLeast):
        return models.FieldCondition(key=condition.key, range=models.Range(gte=condition.value))
    match: Any = (
        models.MatchAny(any=condition.any_values())
        if condition.any_of
        else models.MatchValue(value=condition.values[0])
    )
    return models.FieldCondition(key=condition.key, match=match)


def to_vector(vector: Vector) -> Any:
    if isinstance(vector, SparseVector):
        return models.SparseVector(indices=list(vector.indices), values=list(vector.values))
    return vector
