"""The HTTP API's request and response bodies: the one definition the server (``entrypoints.api.schemas``, the
OpenAPI schema) and the client (``dpr_client``) both import.

A leaf: pydantic only, nothing of services, encoders or workers, so the client imports without the model or the
store. Structure lives here (types, sizes, ranges); the server adds what only it can judge (the store's rule for
filter keys, the reader's limit on document ids) in ``entrypoints.api.schemas``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, field_validator
from pydantic.json_schema import SkipJsonSchema


def _encodable(value: str) -> str:
    """JSON may carry lone surrogates (``"\\ud800"``); no tokenizer or store can take them."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"is not valid Unicode text (character {e.start}); send UTF-8 text") from e
    return value


Text = Annotated[str, AfterValidator(_encodable)]
# A pattern: at least one character that is not white space, white space spelled out as Python's str.isspace() (and
# the server's strip()) knows it, so that every regex engine reads the pattern alike: ECMA's and Rust's \s leave out
# U+001C-U+001F, which Python's strip() removes.
NOT_BLANK = r"[^\t\n\u000b\f\r\u001c-\u001f\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"


def _json_integer(value: Any) -> Any:
    """JSON Schema's ``integer`` counts 1.0 as one: an integral float is taken as the int it is (requests are strict
    otherwise, so a boolean or a numeric string is still refused)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


INTEGRAL = BeforeValidator(_json_integer)  # after the bounds in an Annotated, or the schema loses them
# Integers in a request are within +-(2**53 - 1), the range every JSON reader keeps exact (I-JSON, RFC 7493): past
# it a reader that takes numbers as doubles (JavaScript, most schema validators) would read another number than
# the one sent and stored. A larger id or value goes as a string.
SAFE_INT_MIN, SAFE_INT_MAX = -(2**53 - 1), 2**53 - 1
Int64 = Annotated[int, Field(ge=SAFE_INT_MIN, le=SAFE_INT_MAX), INTEGRAL]
DocIdInt = Annotated[int, Field(ge=0, le=SAFE_INT_MAX), INTEGRAL]
FilterString = Annotated[Text, StringConstraints(max_length=1024)]
FilterScalar = FilterString | Int64 | bool
# A list matches any of its values: strings or integers, all of one type (the store's rule: request_filter).
FilterValue = (FilterScalar | Annotated[list[FilterString], Field(min_length=1, max_length=100)]
               | Annotated[list[Int64], Field(min_length=1, max_length=100)])
MetadataValue = Annotated[Text, StringConstraints(max_length=10_000)] | Int64 | float | bool
Mode = Literal["dense", "sparse", "hybrid"]
Language = Literal["auto", "en", "ko"]


class Wire(BaseModel):
    """A body: its validator is built on first use, not at import (the client imports in a fraction of the time)."""

    model_config = ConfigDict(defer_build=True)


class Request(Wire):
    """A request body: exactly what its schema says. Strict types (no boolean taken for a number, no number for a
    string, no numeric string for a number) and no field the schema does not name, so a request the schema calls
    invalid is refused (422) and one it calls valid is read as sent."""

    model_config = ConfigDict(defer_build=True, strict=True, extra="forbid")


def _no_null_default(schema: dict[str, Any]) -> None:
    """An optional field that may be left out but not sent as null: its schema names no default (null is not one
    of its values)."""
    schema.pop("default", None)


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("may be left out but not null; send a value or leave the field out")
    return value


class ErrorBody(Wire):
    type: str = Field(description="Machine-readable kind: validation, not_found, model_mismatch, unavailable, ...")
    message: str = Field(description="What went wrong and what to do.")
    details: list[dict[str, Any]] | None = None


class ErrorResponse(Wire):
    error: ErrorBody


class DocumentIn(Request):
    """One document: an id, its text, a title and scalar metadata (filterable payload)."""

    id: Annotated[Text, StringConstraints(min_length=1)] | DocIdInt
    text: Text = Field(description="The document text; it is split into passages by the passage tower's tokenizer.")
    title: Annotated[Text, StringConstraints(max_length=2000)] = ""
    metadata: dict[str, MetadataValue] = Field(
        default_factory=dict, max_length=64, description="Scalar payload fields, filterable in search."
    )


class DocumentsIn(Request):
    documents: list[DocumentIn] = Field(min_length=1, description="The batch (at most DPR_API__MAX_DOCUMENTS).")
    language: Language = Field(
        "auto", description="BM25 tokenisation: a new collection keeps it (auto: detected on the first documents); "
        "an existing collection keeps its own, and a different explicit value is refused (409 conflict).",
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


class SearchIn(Request):
    question: Annotated[str, StringConstraints(min_length=1, max_length=4000, pattern=NOT_BLANK),
                        AfterValidator(_encodable)] = Field(description="The question: some text that is not only "
                                                            "white space.")
    k: Annotated[int, Field(ge=1, le=1000), INTEGRAL] = 10
    mode: Mode | None = Field(default=None, description="Default: the collection's tuned mode, else dense.")
    filters: dict[str, FilterValue] = Field(
        default_factory=dict, max_length=16, description="Payload key -> value, or a list (any of)."
    )
    fusion: Literal["rrf", "linear"] | None = None
    rrf_k: Annotated[int, Field(ge=1, le=10_000), INTEGRAL] | None = None
    linear_weight: float | None = Field(default=None, ge=0.0, le=1.0)
    candidates: Annotated[int, Field(ge=1, le=10_000), INTEGRAL] | None = None
    rerank: Annotated[int, Field(ge=0, le=1000), INTEGRAL] | None = Field(
        default=None,
        description="Rerank the first stage's top N with the reranker (below k, the rest of the k hits follow in the "
        "first stage's order); 0: off; default: the collection's.",
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


# --- feedback ---------------------------------------------------------------------------------------------------

MAX_FEEDBACK_QUESTION_CHARS = 2000  # services.feedback.MAX_QUESTION_CHARS (test_api_contract_rules checks)
MAX_ID_CHARS = 512  # a document id (services.readers.MAX_ID_CHARS; test_api_contract_rules checks)
UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"  # a hit's id


def _feedback_schema(schema: dict[str, Any]) -> None:
    """What the server enforces beyond the fields: a point id or a document id, exactly one; a chunk only with a
    document id."""
    schema["oneOf"] = [{"required": ["point_id"]}, {"required": ["doc_id"]}]
    schema["dependentRequired"] = {"chunk": ["doc_id"]}


class FeedbackIn(Request):
    """One judgement of a search hit: the hit named by ``point_id``, or by ``doc_id`` (+ ``chunk``), exactly one."""

    model_config = ConfigDict(json_schema_extra=_feedback_schema)

    question: Annotated[str, StringConstraints(min_length=1, max_length=MAX_FEEDBACK_QUESTION_CHARS,
                                               pattern=NOT_BLANK), AfterValidator(_encodable)] = Field(
        description="The question the hit answered, as asked.")
    point_id: Annotated[str, StringConstraints(pattern=UUID_PATTERN)] | SkipJsonSchema[None] = Field(
        default=None, json_schema_extra=_no_null_default, description="The hit's point id (a UUID); or doc_id.")
    doc_id: Annotated[Text, StringConstraints(min_length=1, max_length=MAX_ID_CHARS)] | SkipJsonSchema[
        None] = Field(default=None, json_schema_extra=_no_null_default,
                      description="The hit's doc_id; with chunk (its chunk_index) it names one passage.")
    chunk: Annotated[int, Field(ge=0, le=2**31 - 1), INTEGRAL] | SkipJsonSchema[None] = Field(
        default=None, json_schema_extra=_no_null_default,
        description="The hit's chunk_index (with doc_id); absent: the whole document.")
    relevant: bool = Field(description="true: the passage answers the question; false: it does not.")

    _present = field_validator("point_id", "doc_id", "chunk", mode="before")(_not_null)

    def model_post_init(self, context: Any, /) -> None:
        if (self.point_id is None) == (self.doc_id is None):
            raise ValueError("send point_id or doc_id, exactly one (a search hit's id, or its doc_id and "
                             "chunk_index)")
        if self.chunk is not None and self.doc_id is None:
            raise ValueError("chunk goes with doc_id (a point id already names one chunk); send doc_id and chunk")


class FeedbackOut(Wire):
    collection: str
    question: str
    doc_id: str
    chunk: int | None
    relevant: bool
    judged_at: str = Field(description="When it was judged (UTC, ISO 8601); a repeat keeps the first time.")
    judged_by: str = Field(description="The name of the API key that judged it (empty without keys).")
    outcome: Literal["new", "replaced", "unchanged"] = Field(
        description="new, replaced (the same pair was judged the other way) or unchanged (a repeat)")
    judgements: int = Field(description="Judgements of this collection now.")


class FeedbackCounts(Wire):
    judgements: int
    relevant: int
    not_relevant: int
    questions: int


class Judgement(Wire):
    collection: str
    question: str
    doc_id: str
    chunk: int | None
    relevant: bool
    judged_at: str
    judged_by: str


class FeedbackExport(Wire):
    collection: str
    counts: FeedbackCounts
    judgements: list[Judgement]


# --- keys -------------------------------------------------------------------------------------------------------

COLLECTION_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"  # services.access.keys._COLLECTION
MIN_KEY_RATE, MAX_KEY_RATE = 0.1, 100_000.0  # requests per second


class KeyIn(Request):
    role: Literal["read", "write", "admin"]
    name: Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=NOT_BLANK),
                    AfterValidator(_encodable)] = Field(
        description="Who or what holds the key (shown in `dpr keys list` and the audit log).")
    collections: list[Annotated[str, StringConstraints(pattern=COLLECTION_PATTERN)]] | None = Field(
        default=None, min_length=1, max_length=100,
        description="Limit the key to these collections; null or absent: every collection.")
    rate: Annotated[float, Field(ge=MIN_KEY_RATE, le=MAX_KEY_RATE)] | SkipJsonSchema[None] = Field(
        default=None, json_schema_extra=_no_null_default,
        description=f"Requests per second ({MIN_KEY_RATE:g}-{MAX_KEY_RATE:,.0f}); absent: DPR_API__RATE_LIMIT.")

    _present = field_validator("rate", mode="before")(_not_null)


class KeyOut(Wire):
    id: str = Field(description="The key's id ('env': DPR_API__API_KEY; 'anonymous': no keys configured).")
    name: str
    role: Literal["read", "write", "admin"] = Field(description="read < write < admin")
    collections: list[str] | None = Field(description="The collections it may use; null: every collection.")


class KeyInfo(KeyOut):
    rate: float | None
    created: str
    revoked: str | None


class KeyCreated(KeyInfo):
    token: str = Field(description="The token, shown this once (only its SHA-256 is stored).")


class KeyList(Wire):
    keys: list[KeyInfo]


class WhoAmI(Wire):
    key: KeyOut
    locked: bool = Field(description="Whether this server asks for keys at all.")
    collection: str = Field(description="The collection this server answers for.")
    may: dict[str, bool] = Field(description="Per role: whether this key may call that role's routes here.")


# --- status, snapshots, reports ---------------------------------------------------------------------------------

class Status(Wire):
    """``GET /v1/status``: what `dpr status --json` prints (the fields below, and more: docs/api.md)."""

    model_config = ConfigDict(extra="allow")

    collection: str
    backend: str
    exists: bool
    generation: str | None
    points: int | None
    model: str | None = Field(description="The fingerprint of the active generation's passage tower.")
    model_name: str | None = None
    model_matches: bool
    default_mode: str | None = None
    configured_model: dict[str, Any]
    towers: dict[str, Any] | None = Field(default=None, description="Per tower (passages, questions): the backend "
                                          "that runs it, why, and what its export measured against fp32.")
    generations: list[dict[str, Any]]


class Snapshot(Wire):
    """A snapshot taken (``POST /v1/snapshots``), as `dpr snapshot create --json`."""

    model_config = ConfigDict(extra="allow")

    snapshot: str = Field(description="The archive's path on the server.")
    collection: str
    points: int
    bytes: int
    sha256: str


class SnapshotEntry(Wire):
    model_config = ConfigDict(extra="allow")

    snapshot: str
    bytes: int
    ok: bool = Field(description="Whether its manifest reads; false: error says why.")


class SnapshotList(Wire):
    snapshots: list[SnapshotEntry]


class EvalReport(Wire):
    """The latest `dpr eval --report` of the server's data dir: its metrics per system, and its plots."""

    model_config = ConfigDict(extra="allow")

    written_at: str | None
    source: str | None
    plots: list[dict[str, str]]


# --- query parameters -------------------------------------------------------------------------------------------

def _sync_schema(schema: dict[str, Any]) -> None:
    schema["dependentRequired"] = {"prune": ["sync_prefix"]}


class SyncQuery(Request):
    """``POST /v1/documents``'s query: the id prefix the request stands for in full, and whether to prune."""

    model_config = ConfigDict(json_schema_extra=_sync_schema)

    sync_prefix: Annotated[str, StringConstraints(min_length=1, max_length=MAX_ID_CHARS, pattern=NOT_BLANK),
                           AfterValidator(_encodable)] | SkipJsonSchema[None] = Field(
        default=None, json_schema_extra=_no_null_default,
        description="The id prefix this request stands for in full (e.g. 'docs/' for a mirrored folder): documents "
        "stored under it that the request does not hold are listed as stale.")
    prune: bool | SkipJsonSchema[None] = Field(default=None, json_schema_extra=_no_null_default,
                                               description="With sync_prefix: remove the stale documents.")

    def model_post_init(self, context: Any, /) -> None:
        if self.prune is not None and self.sync_prefix is None:
            raise ValueError("prune needs sync_prefix: the id prefix this request replaces in full, e.g. "
                             "?sync_prefix=docs/&prune=true")
