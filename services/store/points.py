"""Pure converters and records shared by the store front end and its engines: point ids, payloads, hits."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

# A fixed namespace so that the same (doc id, chunk index) maps to the same point id on every machine.
POINT_NAMESPACE = uuid.UUID("6f1c3f2e-7a55-5b0e-9d2a-0d5c1f6a9e41")

DENSE = "dense"  # name of the dense vector in every collection
SPARSE = "bm25"  # name of the sparse BM25 vector (IDF modifier)

Distance = Literal["cosine", "dot", "euclid"]
SearchMode = Literal["dense", "sparse", "hybrid"]
Fusion = Literal["rrf", "linear"]

# Payload keys with a payload index: keyword (``heading`` is a list: a filter matches any of its headings) and integer.
INDEXED_KEYWORDS = ("doc_id", "source", "doc_hash", "model", "format", "heading")
INDEXED_INTEGERS = ("chunk_index", "page", "page_end")


def point_id(doc_id: str, chunk_index: int) -> str:
    """uuid5 of (document id, chunk index): a retried or redelivered write overwrites, never duplicates."""
    return str(uuid.uuid5(POINT_NAMESPACE, f"{doc_id}\x1f{chunk_index}"))


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class SparseVector:
    indices: list[int]
    values: list[float]
    # BM25 document side only (services.store.sparse / services.store.bm25): the raw term counts aligned with
    # ``indices`` (their sum is the passage length) and the average length ``values`` were weighted with; the
    # store re-weights with the generation's own average. Not part of equality; engines read indices/values only.
    counts: list[float] | None = field(default=None, compare=False)
    avg_len: float | None = field(default=None, compare=False)


Vector = list[float] | SparseVector
PointRecord = tuple[str, dict[str, Vector], dict[str, Any]]  # (point id, named vectors, payload)
Record = tuple[str, dict[str, Any]]  # (point id, payload)


@dataclass(frozen=True)
class CollectionSpec:
    """What a collection generation was built for. Stored with the generation (edge: meta file; server: metadata)."""

    dim: int
    distance: Distance
    model: str  # fingerprint of the tower pair that embedded the passages
    sparse: bool = True  # whether passages also carry a BM25 sparse vector
    settings: dict[str, Any] = field(default_factory=dict)  # e.g. the tuned hybrid fusion choice

    def to_json(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "distance": self.distance,
            "model": self.model,
            "sparse": self.sparse,
            "settings": dict(self.settings),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CollectionSpec:
        return cls(
            dim=int(data["dim"]),
            distance=data["distance"],
            model=str(data["model"]),
            sparse=bool(data.get("sparse", False)),
            settings=dict(data.get("settings") or {}),
        )


@dataclass(frozen=True)
class Passage:
    """One chunk of one document, as stored in a point's payload."""

    doc_id: str
    chunk_index: int
    text: str
    title: str = ""
    doc_hash: str = ""  # hash of the whole source document; unchanged hash + same model = no work
    source: str = ""
    ingested_at: str = ""
    model: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    job: str = ""  # the ingest job that wrote it: a redelivered batch counts its own earlier writes as written
    page: int | None = None  # first page of the passage (paged formats)
    page_end: int | None = None  # last page when it runs over several; None: ``page``
    heading: tuple[str, ...] = ()  # heading path the passage tower read with it, outermost first
    format: str = ""  # what the reader read: pdf, docx, md, rst, html... ("" for records and plain text)

    @property
    def id(self) -> str:
        return point_id(self.doc_id, self.chunk_index)

    @property
    def text_hash(self) -> str:
        return text_hash(self.text)

    def to_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = dict(self.metadata)
        payload.update(
            doc_id=self.doc_id,
            chunk_index=self.chunk_index,
            title=self.title,
            text=self.text,
            text_hash=self.text_hash,
            doc_hash=self.doc_hash,
            source=self.source,
            ingested_at=self.ingested_at,
            model=self.model,
        )
        if self.job:
            payload["job"] = self.job
        return payload | self.place_fields()

    def place_fields(self) -> dict[str, Any]:
        """page, page_end, heading and format, only where there is a place (a document without structure stores
        and answers what it always did)."""
        fields: dict[str, Any] = {"page": self.page, "page_end": self.page_end}
        fields = {k: v for k, v in fields.items() if v is not None}
        if self.heading:
            fields["heading"] = list(self.heading)
        if self.format:
            fields["format"] = self.format
        return fields

    @property
    def place(self) -> str:
        """Where the passage came from, for people: ``manual.pdf p. 112``, ``guide.docx › Installing › On
        Windows``, ``manual.pdf pp. 12-13 › Setup``; "" for a passage without a page or heading."""
        return place_label(self.doc_id, self.page, self.page_end, self.heading)

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Passage:
        known = {
            "doc_id", "chunk_index", "title", "text", "text_hash", "doc_hash", "source", "ingested_at", "model", "job",
            "bm25_len", "bm25_avg",  # the store's BM25 records (services.store.bm25), not metadata
        }
        page, page_end, heading, fmt = _place_of(payload)
        known |= {k for k, v in (("page", page), ("page_end", page_end), ("heading", heading), ("format", fmt)) if v}
        return cls(
            doc_id=str(payload["doc_id"]),
            chunk_index=int(payload["chunk_index"]),
            text=str(payload.get("text", "")),
            title=str(payload.get("title", "")),
            doc_hash=str(payload.get("doc_hash", "")),
            source=str(payload.get("source", "")),
            ingested_at=str(payload.get("ingested_at", "")),
            model=str(payload.get("model", "")),
            metadata={k: v for k, v in payload.items() if k not in known},
            job=str(payload.get("job", "")),
            page=page,
            page_end=page_end,
            heading=heading,
            format=fmt,
        )


def _place_of(payload: dict[str, Any]) -> tuple[int | None, int | None, tuple[str, ...], str]:
    """The place fields of a payload, each only when it has the type ingest writes (a record's own metadata
    key ``page: "iv"`` stays metadata)."""

    def integer(key: str) -> int | None:
        v = payload.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    heading = payload.get("heading")
    path = tuple(heading) if isinstance(heading, list) and all(isinstance(h, str) for h in heading) else ()
    fmt = payload.get("format")
    return integer("page"), integer("page_end"), path, fmt if isinstance(fmt, str) else ""


def place_label(doc_id: str, page: int | None, page_end: int | None, heading: tuple[str, ...] | list[str]) -> str:
    """``name p. 12``, ``name pp. 12-13``, ``name › A › B`` or ``name p. 12 › A``: the document's file name (the
    last part of its id) with its page (range) and heading path; "" when there is neither."""
    if page is None and not heading:
        return ""
    out = PurePosixPath(doc_id).name or doc_id
    if page is not None:
        out += f" p. {page}" if page_end is None or page_end == page else f" pp. {page}-{page_end}"
    if heading:
        out += "".join(f" › {h}" for h in heading)
    return out


@dataclass(frozen=True)
class PassagePoint:
    """A passage with its vectors, ready to upsert."""

    passage: Passage
    dense: list[float]
    sparse: SparseVector | None = None


def point_vectors(point: PassagePoint, sparse: bool) -> dict[str, list[float] | SparseVector]:
    """The named vectors of one point; the BM25 one only when the generation has sparse vectors and it is not empty."""
    vectors: dict[str, list[float] | SparseVector] = {DENSE: [float(x) for x in point.dense]}
    if sparse and point.sparse is not None and point.sparse.indices:
        vectors[SPARSE] = point.sparse
    return vectors


@dataclass(frozen=True)
class DocState:
    """What the store holds for one document: enough to skip an unchanged document, and to tell one written
    earlier by the same ingest job (a redelivered batch) from one that was already there."""

    doc_id: str
    doc_hash: str
    model: str
    chunks: int
    jobs: frozenset[str] = frozenset()  # the ingest jobs that wrote the passages counted in ``chunks``
    file_sig: str = ""  # a binary file's bytes and chunking as read (services.readers.filesig); "" if none


@dataclass(frozen=True)
class SearchRequest:
    k: int = 10
    mode: SearchMode = "dense"
    dense: list[float] | None = None
    sparse: SparseVector | None = None
    filters: dict[str, Any] = field(default_factory=dict)  # payload key -> value or list of values (any of)
    fusion: Fusion = "rrf"
    rrf_k: int = 60
    linear_weight: float = 0.5  # weight of the dense score in linear fusion: w * dense + (1 - w) * sparse
    candidates: int = 100  # per-branch prefetch depth in hybrid mode


@dataclass(frozen=True)
class Hit:
    passage: Passage
    score: float
    id: str
    rerank_score: float | None = None  # the reranker's score when one reordered the hits (services.query)

    def to_json(self) -> dict[str, Any]:
        p = self.passage
        out = {
            "doc_id": p.doc_id,
            "chunk_index": p.chunk_index,
            "score": self.score,
            "title": p.title,
            "text": p.text,
            "model": p.model,
            "source": p.source,
        }
        if self.rerank_score is not None:
            out["rerank_score"] = self.rerank_score
        out.update(p.place_fields())
        if p.place:
            out["place"] = p.place
        return out


@dataclass(frozen=True)
class ActiveGeneration:
    """The active generation's name and spec, without counting its points (``VectorStore.active()``)."""

    name: str
    spec: CollectionSpec


@dataclass(frozen=True)
class GenerationInfo:
    name: str
    spec: CollectionSpec
    count: int | None  # None: not counted, another process holds it (``VectorStore.info(wait=False)``)
    active: bool


@dataclass(frozen=True)
class CollectionInfo:
    alias: str
    backend: str
    active: GenerationInfo | None
    generations: list[GenerationInfo]


def vector_from_engine(vector: Any) -> Vector:
    """An engine's vector (qdrant-edge's or qdrant-client's) as the store's: ``SparseVector`` or a list of floats."""
    if hasattr(vector, "indices"):
        return SparseVector(indices=list(vector.indices), values=[float(v) for v in vector.values])
    return [float(v) for v in vector]


def point_records(records: Iterable[Any]) -> list[PointRecord]:
    """Engine records retrieved with their vectors and payload (either engine) as the store's point records."""
    return [(str(r.id), {n: vector_from_engine(v) for n, v in (r.vector if isinstance(r.vector, dict) else {}).items()},
             dict(r.payload or {})) for r in records]
