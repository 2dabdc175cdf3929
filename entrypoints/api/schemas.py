"""Request and response bodies of the HTTP API (they are the OpenAPI schema).

Structure is checked here (types, sizes, ranges): a malformed request is a 422 before any service runs.
What a document *means* (empty text, an id too long, oversized) is judged by the same parser ``dpr ingest`` uses
(``services.readers.parse_json_row``) and reported per document in the job, like the CLI does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, WithJsonSchema

from services.readers import MAX_ID_CHARS
from services.store.common import FILTER_KEY_MAX_CHARS, FILTER_KEY_PATTERN, filter_key_problem


def _encodable(value: str) -> str:
    """JSON may carry lone surrogates (``"\\ud800"``); no tokenizer or store can take them."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"is not valid Unicode text (character {e.start}); send UTF-8 text") from e
    return value


def _filter_key(value: str) -> str:
    """The store's one rule for filter keys (``services.store.common.filter_key_problem``)."""
    problem = filter_key_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Text = Annotated[str, AfterValidator(_encodable)]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FilterKey = Annotated[
    str,
    AfterValidator(_filter_key),
    WithJsonSchema(
        {"type": "string", "minLength": 1, "maxLength": FILTER_KEY_MAX_CHARS, "pattern": FILTER_KEY_PATTERN}
    ),
]
FilterScalar = (
    Annotated[Text, StringConstraints(max_length=1024)]
    | Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
    | bool
)
MetadataValue = Annotated[Text, StringConstraints(max_length=10_000)] | Annotated[
    int, Field(ge=INT64_MIN, le=INT64_MAX)
] | float | bool


class ErrorBody(BaseModel):
    type: str = Field(description="Machine-readable kind: validation, not_found, model_mismatch, unavailable, ...")
    message: str = Field(description="What went wrong and what to do.")
    details: list[dict[str, Any]] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class DocumentIn(BaseModel):
    """One document. Extra scalar fields become payload metadata, as with JSONL rows for ``dpr ingest``."""

    model_config = ConfigDict(extra="forbid")

    id: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)] | Annotated[
        int, Field(ge=0, le=INT64_MAX)
    ]
    text: Text = Field(description="The document text; it is split into passages by the passage tower's tokenizer.")
    title: Annotated[Text, StringConstraints(max_length=2000)] = ""
    metadata: dict[FilterKey, MetadataValue] = Field(
        default_factory=dict, max_length=64, description="Scalar payload fields, filterable in search."
    )


class DocumentsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(min_length=1, description="The batch (at most DPR_API__MAX_DOCUMENTS).")
    language: Literal["auto", "en", "ko"] = Field(
        "auto", description="BM25 tokenisation: a new collection keeps it (auto: detected on the first documents); "
        "an existing collection keeps its own, and a different explicit value is refused (400).",
    )


class JobAccepted(BaseModel):
    model_config = ConfigDict(extra="allow")

    job: str
    state: str
    documents_received: int = Field(description="Documents parsed from the request (before per-document checks).")
    status_url: str


class JobStatus(BaseModel):
    """``IngestReport`` counters plus the job's state; ``failed`` lists each failed document with its reason."""

    model_config = ConfigDict(extra="allow")

    job: str
    state: str
    documents: int = 0
    unchanged: int = 0
    chunks: int = 0
    skipped: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []


class SearchIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: Annotated[Text, StringConstraints(min_length=1, max_length=4000)]
    k: int = Field(default=10, ge=1, le=1000)
    mode: Literal["dense", "sparse", "hybrid"] | None = Field(
        default=None, description="Default: the collection's tuned mode, else dense."
    )
    filters: dict[FilterKey, FilterScalar | Annotated[list[FilterScalar], Field(min_length=1, max_length=100)]] = (
        Field(default_factory=dict, max_length=16, description="Payload key -> value, or a list (any of).")
    )
    fusion: Literal["rrf", "linear"] | None = None
    rrf_k: int | None = Field(default=None, ge=1, le=10_000)
    linear_weight: float | None = Field(default=None, ge=0.0, le=1.0)
    candidates: int | None = Field(default=None, ge=1, le=10_000)
    rerank: int | None = Field(
        default=None, ge=0, le=1000,
        description="Rerank the first stage's top N with the reranker (N >= k); 0: off; default: the collection's.",
    )
    rerank_weight: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="The reranker's share of the order, fused with the first stage's (1: the reranker alone); "
        "default: the collection's, chosen on its dev split.",
    )


class HitOut(BaseModel):
    doc_id: str
    chunk_index: int
    score: float
    rerank_score: float | None = Field(default=None, description="The reranker's score, when it reordered the hits.")
    title: str
    text: str
    model: str
    source: str
    # Where the passage came from (documents read with structure; absent for records and plain text: docs/passages.md)
    page: int | None = Field(default=None, description="First page of the passage (paged formats: pdf...).")
    page_end: int | None = Field(default=None, description="Last page, when the passage runs over several.")
    heading: list[str] | None = Field(default=None, description="Heading path, outermost first.")
    format: str | None = Field(default=None, description="What the reader read: pdf, docx, md, rst, html...")
    place: str | None = Field(
        default=None, description="The place for people: 'manual.pdf p. 112', 'guide.docx › Installing › On Windows'."
    )


class SearchOut(BaseModel):
    hits: list[HitOut]
    took_ms: float


class DeleteOut(BaseModel):
    doc_id: str
    points_deleted: int


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: Literal["ready", "not_ready"]
    checks: dict[str, dict[str, Any]]
