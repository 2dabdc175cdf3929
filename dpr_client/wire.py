"""The HTTP API's request and response bodies: the one definition the server (``entrypoints.api.schemas``, the
OpenAPI schema) and the client (``dpr_client``) both import.

A leaf: pydantic only, nothing of services, encoders or workers, so the client imports without the model or the
store. Structure lives here (types, sizes, ranges); the server adds what only it can judge (the store's rule for
filter keys, the reader's limit on document ids) in ``entrypoints.api.schemas``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints


def _encodable(value: str) -> str:
    """JSON may carry lone surrogates (``"\\ud800"``); no tokenizer or store can take them."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"is not valid Unicode text (character {e.start}); send UTF-8 text") from e
    return value


Text = Annotated[str, AfterValidator(_encodable)]
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
FilterScalar = Annotated[Text, StringConstraints(max_length=1024)] | Int64 | bool
FilterValue = FilterScalar | Annotated[list[FilterScalar], Field(min_length=1, max_length=100)]
MetadataValue = Annotated[Text, StringConstraints(max_length=10_000)] | Int64 | float | bool
Mode = Literal["dense", "sparse", "hybrid"]
Language = Literal["auto", "en", "ko"]


class Wire(BaseModel):
    """A body: its validator is built on first use, not at import (the client imports in a fraction of the time)."""

    model_config = ConfigDict(defer_build=True)


class ErrorBody(Wire):
    type: str = Field(description="Machine-readable kind: validation, not_found, model_mismatch, unavailable, ...")
    message: str = Field(description="What went wrong and what to do.")
    details: list[dict[str, Any]] | None = None


class ErrorResponse(Wire):
    error: ErrorBody


class DocumentIn(Wire):
    """One document. Extra scalar fields become payload metadata, as with JSONL rows for ``dpr ingest``."""

    model_config = ConfigDict(extra="forbid")

    id: Annotated[Text, StringConstraints(min_length=1)] | Annotated[int, Field(ge=0, le=INT64_MAX)]
    text: Text = Field(description="The document text; it is split into passages by the passage tower's tokenizer.")
    title: Annotated[Text, StringConstraints(max_length=2000)] = ""
    metadata: dict[str, MetadataValue] = Field(
        default_factory=dict, max_length=64, description="Scalar payload fields, filterable in search."
    )


class DocumentsIn(Wire):
    model_config = ConfigDict(extra="forbid")

    documents: list[DocumentIn] = Field(min_length=1, description="The batch (at most DPR_API__MAX_DOCUMENTS).")
    language: Language = Field(
        "auto", description="BM25 tokenisation: a new collection keeps it (auto: detected on the first documents); "
        "an existing collection keeps its own, and a different explicit value is refused (400).",
    )


class JobAccepted(Wire):
    model_config = ConfigDict(extra="allow")

    job: str
    state: str
    documents_received: int = Field(description="Documents parsed from the request (before per-document checks).")
    status_url: str


class JobStatus(Wire):
    """``IngestReport`` counters plus the job's state; ``failed`` lists each failed document with its reason."""

    model_config = ConfigDict(extra="allow")

    job: str
    state: str
    documents: int = 0
    unchanged: int = 0
    chunks: int = 0
    skipped: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


class SearchIn(Wire):
    model_config = ConfigDict(extra="forbid")

    question: Annotated[Text, StringConstraints(min_length=1, max_length=4000)]
    k: int = Field(default=10, ge=1, le=1000)
    mode: Mode | None = Field(default=None, description="Default: the collection's tuned mode, else dense.")
    filters: dict[str, FilterValue] = Field(
        default_factory=dict, max_length=16, description="Payload key -> value, or a list (any of)."
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


class HitOut(Wire):
    doc_id: str
    chunk_index: int
    score: float
    rerank_score: float | None = Field(default=None, description="The reranker's score, when it reordered the hits.")
    title: str
    text: str
    model: str = Field(description="The fingerprint of the passage tower that embedded the passage.")
    source: str
    # Where the passage came from (documents read with structure; absent for records and plain text: docs/passages.md)
    page: int | None = Field(default=None, description="First page of the passage (paged formats: pdf...).")
    page_end: int | None = Field(default=None, description="Last page, when the passage runs over several.")
    heading: list[str] | None = Field(default=None, description="Heading path, outermost first.")
    format: str | None = Field(default=None, description="What the reader read: pdf, docx, md, rst, html...")
    place: str | None = Field(
        default=None, description="The place for people: 'manual.pdf p. 112', 'guide.docx › Installing › On Windows'."
    )

    def citation(self) -> str:
        """What a person checks: the place when the reader knew one, else the document id and passage number."""
        return self.place or f"{self.doc_id} (passage {self.chunk_index})"

    def metadata(self) -> dict[str, Any]:
        """The hit less its text and score: what a framework's document carries as metadata."""
        return self.model_dump(exclude={"text", "score"}, exclude_none=True) | {"citation": self.citation()}


class SearchOut(Wire):
    hits: list[HitOut]
    took_ms: float


class DeleteOut(Wire):
    doc_id: str
    points_deleted: int


class Health(Wire):
    status: str


class Readiness(Wire):
    status: Literal["ready", "not_ready"]
    checks: dict[str, dict[str, Any]]
