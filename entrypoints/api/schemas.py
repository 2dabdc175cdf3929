"""Request and response bodies of the HTTP API (they are the OpenAPI schema).

The bodies are defined once, in ``dpr_client.wire``, which the client imports too; this module re-exports them and
adds what only the server judges: the store's one rule for filter keys (``services.store.common.filter_key_problem``)
and the readers' limit on document ids. Structure is checked there and here (types, sizes, ranges): a malformed
request is a 422 before any service runs. What a document *means* (empty text, oversized) is judged by the same
parser ``dpr ingest`` uses (``services.readers.parse_json_row``) and reported per document in the job.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, StringConstraints, TypeAdapter, WithJsonSchema

from dpr_client import wire
from dpr_client.wire import (  # noqa: F401 - re-exported: the routes read every body from here
    DeleteOut,
    DocIdInt,
    ErrorResponse,
    FilterValue,
    Health,
    JobAccepted,
    JobStatus,
    MetadataValue,
    Readiness,
    SearchOut,
    SyncQuery,
    Text,
)
from services.readers import MAX_ID_CHARS
from services.store.common import FILTER_KEY_MAX_CHARS, FILTER_KEY_PATTERN, filter_key_problem


def _filter_key(value: str) -> str:
    """The store's one rule for filter keys (``services.store.common.filter_key_problem``)."""
    problem = filter_key_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


FILTER_KEY_SCHEMA = {"type": "string", "minLength": 1, "maxLength": FILTER_KEY_MAX_CHARS, "pattern": FILTER_KEY_PATTERN}
FilterKey = Annotated[str, AfterValidator(_filter_key), WithJsonSchema(FILTER_KEY_SCHEMA)]


def _keyed(values: Any, max_keys: int, description: str) -> dict[str, Any]:
    """The schema of a ``{payload field name: value}`` object: every key must be a field name (``propertyNames``;
    pydantic's own ``patternProperties`` would let any other key through with any value)."""
    return {"type": "object", "propertyNames": FILTER_KEY_SCHEMA, "maxProperties": max_keys,
            "additionalProperties": TypeAdapter(values).json_schema(), "description": description}


METADATA_DESCRIPTION = "Scalar payload fields, filterable in search."
FILTERS_DESCRIPTION = "Payload key -> value, or a list (any of)."


class DocumentIn(wire.DocumentIn):
    __doc__ = wire.DocumentIn.__doc__

    id: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)] | DocIdInt
    metadata: Annotated[dict[FilterKey, MetadataValue], WithJsonSchema(
        _keyed(MetadataValue, 64, METADATA_DESCRIPTION))] = Field(default_factory=dict, max_length=64)


class DocumentsIn(wire.DocumentsIn):
    documents: list[DocumentIn] = Field(  # type: ignore[assignment]  # narrower: the server's checks
        min_length=1, description="The batch (at most DPR_API__MAX_DOCUMENTS).")


class SearchIn(wire.SearchIn):
    model_config = ConfigDict(defer_build=False)  # built here, not inside FastAPI's body adapter (its 'body' alias)

    filters: Annotated[dict[FilterKey, FilterValue], WithJsonSchema(
        _keyed(FilterValue, 16, FILTERS_DESCRIPTION))] = Field(default_factory=dict, max_length=16)
