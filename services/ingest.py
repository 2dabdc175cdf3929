"""Ingest: documents -> passages (passage tower's tokenizer) -> passage tower -> store.upsert.

Idempotent by construction: point ids are uuid5(doc id, chunk index); a document whose hash, model and chunk
count already match the store costs no encoder work; a changed document's stale chunks are deleted after its new
chunks are written, so a crash at any point leaves either the old or the new version complete (and a retry
finishes the job). One bad document becomes a failure in the report and never stops the others.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from encoders.towers import DualEncoder
from services.chunking import Chunk, chunk_text
from services.errors import DocumentError
from services.locks import NoFence, WriteFence
from services.readers import Document, DocumentFailure, Item, Skipped
from services.settings import ChunkSettings
from services.store.points import CollectionSpec, Passage, PassagePoint, SparseVector
from services.store.protocol import VectorStore

log = logging.getLogger(__name__)


class SparseEncoder(Protocol):
    def embed_document(self, text: str) -> SparseVector: ...

    def embed_query(self, text: str) -> SparseVector: ...


@dataclass
class IngestReport:
    job: str
    documents: int = 0  # documents written (new or changed)
    unchanged: int = 0  # documents already stored as they are: no encoder work
    chunks: int = 0  # passages encoded and written
    title_truncated: int = 0  # documents whose title was shortened to fit the passage budget
    skipped: list[dict[str, str]] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    encode_seconds: float = 0.0

    def add(self, other: IngestReport) -> None:
        self.documents += other.documents
        self.unchanged += other.unchanged
        self.chunks += other.chunks
        self.title_truncated += other.title_truncated
        self.skipped.extend(other.skipped)
        self.failed.extend(other.failed)
        self.encode_seconds += other.encode_seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "documents": self.documents,
            "unchanged": self.unchanged,
            "chunks": self.chunks,
            "title_truncated": self.title_truncated,
            "skipped": self.skipped,
            "failed": self.failed,
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IngestReport:
        return cls(
            job=str(data.get("job", "")),
            documents=int(data.get("documents", 0)),
            unchanged=int(data.get("unchanged", 0)),
            chunks=int(data.get("chunks", 0)),
            title_truncated=int(data.get("title_truncated", 0)),
            skipped=list(data.get("skipped", [])),
            failed=list(data.get("failed", [])),
            seconds=float(data.get("seconds", 0.0)),
        )


def new_job_id() -> str:
    return uuid.uuid4().hex[:16]


def collection_spec(towers: DualEncoder, sparse: bool) -> CollectionSpec:
    return CollectionSpec(dim=towers.dim, distance=towers.similarity, model=towers.fingerprint, sparse=sparse)


def chunk_document(doc: Document, towers: DualEncoder, chunking: ChunkSettings) -> tuple[list[Chunk], bool]:
    result = chunk_text(
        doc.text,
        doc.title,
        offsets_of=towers.passage_token_offsets,
        max_passage_tokens=towers.max_passage_tokens,
        max_tokens=chunking.max_tokens,
        overlap=chunking.overlap,
        max_title_tokens=chunking.max_title_tokens,
        source=doc.source or doc.doc_id,
    )
    return result.chunks, result.title_truncated


def batched_items(items: Iterable[Item], max_docs: int, max_bytes: int) -> Iterator[list[Item]]:
    """Group items into batches bounded by document count and text bytes."""
    batch: list[Item] = []
    size = 0
    for item in items:
        n = len(item.text.encode("utf-8")) if isinstance(item, Document) else 0
        if batch and (len(batch) >= max_docs or size + n > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += n
    if batch:
        yield batch


def ingest_batch(
    items: list[Item],
    *,
    store: VectorStore,
    towers: DualEncoder,
    chunking: ChunkSettings,
    sparse: SparseEncoder | None = None,
    batch_size: int = 32,
    job: str = "",
    generation: str | None = None,
    fence: WriteFence | None = None,
    towers_for: Callable[[str], DualEncoder] | None = None,
) -> IngestReport:
    """Ingest one batch of documents. Transient store errors propagate (the caller retries the whole batch,
    which is safe: writes are idempotent). Document errors are reported per document."""
    report = IngestReport(job=job)
    docs: dict[str, Document] = {}
    for item in items:
        if isinstance(item, Skipped):
            report.skipped.append(item.to_json())
        elif isinstance(item, DocumentFailure):
            report.failed.append(item.to_json())
        else:
            docs[item.doc_id] = item  # a later duplicate id in one batch wins, as it would across batches
    if not docs:
        return report

    # Writers hold the write fence shared from resolving the generation to their last write, so a re-embed swap
    # (exclusive) never misses a write; the generation is pinned so one batch never straddles a swap.
    with (fence or NoFence()).shared():
        if generation is None:
            active = store.info().active if towers_for is not None else None
            if active is not None and towers_for is not None and active.spec.model != towers.fingerprint:
                towers = towers_for(active.spec.model)  # the towers follow the collection (re-embeds move it)
            generation = store.ensure_collection(collection_spec(towers, sparse is not None))
        _write_documents(docs, report, store=store, towers=towers, chunking=chunking, sparse=sparse,
                         batch_size=batch_size, generation=generation)
    log.info(
        "ingested batch",
        extra={"job": job, "documents": report.documents, "chunks": report.chunks, "unchanged": report.unchanged},
    )
    return report


def _write_documents(
    docs: dict[str, Document],
    report: IngestReport,
    *,
    store: VectorStore,
    towers: DualEncoder,
    chunking: ChunkSettings,
    sparse: SparseEncoder | None,
    batch_size: int,
    generation: str,
) -> None:
    states = store.doc_states(list(docs), generation=generation)

    planned: list[tuple[Document, list[Chunk]]] = []
    for doc in docs.values():
        try:
            chunks, title_truncated = chunk_document(doc, towers, chunking)
        except DocumentError as e:
            report.failed.append(DocumentFailure.from_error(e).to_json())
            continue
        state = states.get(doc.doc_id)
        if (
            state is not None
            and state.doc_hash == doc.doc_hash
            and state.model == towers.fingerprint
            and state.chunks == len(chunks)
        ):
            report.unchanged += 1
            continue
        report.title_truncated += int(title_truncated)
        planned.append((doc, chunks))

    if planned:
        texts = [c.encoder_text for _, chunks in planned for c in chunks]
        t0 = time.perf_counter()
        vectors = towers.encode_documents(texts, batch_size=batch_size)  # (n_passages, dim)
        report.encode_seconds = time.perf_counter() - t0
        sparse_vectors = [sparse.embed_document(t) for t in texts] if sparse is not None else None
        now = datetime.now(UTC).isoformat(timespec="seconds")
        points: list[PassagePoint] = []
        i = 0
        for doc, chunks in planned:
            for c in chunks:
                passage = Passage(
                    doc_id=doc.doc_id,
                    chunk_index=c.index,
                    text=c.text,
                    title=c.title,
                    doc_hash=doc.doc_hash,
                    source=doc.source,
                    ingested_at=now,
                    model=towers.fingerprint,
                    metadata=dict(doc.metadata),
                )
                points.append(
                    PassagePoint(
                        passage=passage,
                        dense=vectors[i].tolist(),
                        sparse=sparse_vectors[i] if sparse_vectors is not None else None,
                    )
                )
                i += 1
        store.upsert(points, generation=generation)
        for doc, chunks in planned:
            store.delete_stale(doc.doc_id, doc.doc_hash, len(chunks), generation=generation)
        report.documents += len(planned)
        report.chunks += len(points)


ProgressFn = Callable[[IngestReport], None]


def ingest_documents(
    items: Iterable[Item],
    *,
    store: VectorStore,
    towers: DualEncoder,
    chunking: ChunkSettings,
    sparse: SparseEncoder | None = None,
    batch_size: int = 32,
    batch_documents: int = 64,
    batch_bytes: int = 1_000_000,
    job: str | None = None,
    progress: ProgressFn | None = None,
    fence: WriteFence | None = None,
    towers_for: Callable[[str], DualEncoder] | None = None,
) -> IngestReport:
    """The in-process pipeline: every batch through ``ingest_batch``; ``progress`` gets each batch's report."""
    total = IngestReport(job=job or new_job_id())
    t0 = time.perf_counter()
    for batch in batched_items(items, batch_documents, batch_bytes):
        part = ingest_batch(
            batch, store=store, towers=towers, chunking=chunking, sparse=sparse, batch_size=batch_size, job=total.job,
            fence=fence, towers_for=towers_for,
        )
        total.add(part)
        if progress is not None:
            progress(part)
    total.seconds = time.perf_counter() - t0
    return total


def delete_documents(doc_ids: Iterable[str], *, store: VectorStore, fence: WriteFence | None = None) -> int:
    with (fence or NoFence()).shared():
        return store.delete_documents(list(doc_ids))
