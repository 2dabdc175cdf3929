"""Ingest: documents -> passages (passage tower's tokenizer) -> passage tower -> store.upsert.

Idempotent by construction: point ids are uuid5(doc id, chunk index); a document whose hash, model and chunk
count already match the store costs no encoder work (it counts as written, not unchanged, when this same job
wrote it: each passage carries its job id, so a batch redelivered after its worker died reports what its first
attempt wrote); a changed document's stale chunks are deleted after its new chunks are written, so a crash at
any point leaves either the old or the new version complete (and a retry finishes the job). One bad document
becomes a failure in the report and never stops the others.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from encoders.towers import DualEncoder
from services.core.errors import CollectionNotFound, DocumentError
from services.core.fsutil import now_iso
from services.core.locks import NoFence, WriteFence
from services.core.settings import ChunkSettings, DocumentSettings, Settings
from services.ingest.chunking import Chunk, chunk_sections
from services.ingest.encoding import passage_points
from services.ingest.files import ParsedFiles, ParseGuard, parse_files
from services.ingest.language import collection_spec, for_new_collection
from services.readers import Document, DocumentFailure, Item, Section, Skipped
from services.readers.filesig import FileRef
from services.readers.quarantine import limits_for
from services.store.points import CollectionSpec, Passage
from services.store.protocol import VectorStore
from services.store.sparse import SparseEncoder, for_spec

log = logging.getLogger(__name__)


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
    encode_seconds: float = 0.0  # the passage tower
    upsert_seconds: float = 0.0  # the store's writes
    chunk_seconds: float = 0.0  # tokenising and cutting passages
    sparse_seconds: float = 0.0  # BM25 vectors
    parsed: int = 0  # binary files parsed in this batch (a FileRef found unchanged by its signature is not)
    parse_seconds: float = 0.0
    parsed_by: str = ""  # host:pid of the process that parsed them

    @property
    def items(self) -> int:
        """Input items this report accounts for (written, unchanged, failed or skipped)."""
        return self.documents + self.unchanged + len(self.failed) + len(self.skipped)

    def add(self, other: IngestReport) -> None:
        """``other``'s counts, records and step seconds added to these (the wall ``seconds`` is the caller's)."""
        for name in (f.name for f in fields(self) if f.name not in ("job", "seconds", "parsed_by")):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.parsed_by = self.parsed_by or other.parsed_by

    def to_json(self) -> dict[str, Any]:
        out = {name: round(value, 3) if isinstance(value, float) else value for name, value in asdict(self).items()}
        if not self.parsed_by:
            del out["parsed_by"]
        return out


def new_job_id() -> str:
    return uuid.uuid4().hex[:16]


def chunk_document(doc: Document, towers: DualEncoder, chunking: ChunkSettings) -> tuple[list[Chunk], bool]:
    """A document's passages: section by section when a reader gave it sections (``chunk_sections``: each chunk
    keeps its heading path and pages), else its text as one untitled section (``chunk_text``'s windows)."""
    source = doc.source or doc.doc_id
    result = chunk_sections(
        doc.sections or [Section(doc.text)], doc.title, offsets_of=towers.passage_token_offsets,
        max_passage_tokens=towers.max_passage_tokens, max_tokens=chunking.max_tokens, overlap=chunking.overlap,
        max_title_tokens=chunking.max_title_tokens, source=source,
    )
    return result.chunks, result.title_truncated


def _spec_of(store: VectorStore, generation: str) -> CollectionSpec:
    active = store.active()
    if active is not None and active.name == generation:
        return active.spec
    spec = store.spec(generation)  # that generation alone: counting every one would wait for the others' holders
    if spec is not None:
        return spec
    raise CollectionNotFound(f"collection {store.alias!r} has no generation {generation!r}; ingest without it")


@dataclass
class IngestPipeline:
    """The one ingest pipeline: chunk (passage tower's tokenizer) -> passage tower -> BM25 sparse -> store.

    Built once per process and collection from the settings (``IngestPipeline.from_settings``, or
    ``services.runtime.Runtime.pipeline``); the CLI, the API, the Celery task and evaluation all run
    their batches through ``ingest_batch``. ``towers_for`` lets the towers follow the collection's active
    generation (a re-embed or rollback may have moved it to another model). The batch's binary files are parsed
    by ``services.ingest.files`` with this pipeline's settings."""

    store: VectorStore
    towers: DualEncoder
    chunking: ChunkSettings
    sparse: SparseEncoder | None = None
    batch_size: int = 32
    batch_documents: int = 64
    batch_bytes: int = 1_000_000
    fence: WriteFence | None = None
    towers_for: Callable[[str], DualEncoder] | None = None
    documents: DocumentSettings | None = None  # parse limits for the batch's binary files
    max_document_bytes: int = 20_000_000
    path_map: str = ""  # DPR_CELERY__PATH_MAP, for files sent by path

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        store: VectorStore,
        towers: DualEncoder,
        sparse: SparseEncoder | None,
        fence: WriteFence | None = None,
        towers_for: Callable[[str], DualEncoder] | None = None,
    ) -> IngestPipeline:
        return cls(
            store=store, towers=towers, chunking=settings.chunk, sparse=sparse,
            batch_size=settings.encoder.batch_size, batch_documents=settings.celery.batch_documents,
            batch_bytes=settings.celery.batch_bytes, fence=fence, towers_for=towers_for,
            documents=limits_for(settings), max_document_bytes=settings.max_document_bytes,
            path_map=settings.celery.path_map,
        )

    def ingest_batch(self, items: list[Item], job: str = "", generation: str | None = None,
                     parsed: ParsedFiles | None = None, guard: ParseGuard | None = None) -> IngestReport:
        """Ingest one batch of documents. Transient store errors propagate (the caller retries the whole batch,
        which is safe: writes are idempotent). Document errors are reported per document. The batch's unparsed
        binary files (``FileRef``) are parsed here (``parse_files``), unless ``parsed`` says what they became
        (parsed ahead, while the previous batch encoded)."""
        report = IngestReport(job=job)
        refs = [i for i in items if isinstance(i, FileRef)]
        if refs and parsed is None:
            parsed = parse_files(self, refs, job=job, generation=generation, guard=guard)
        if parsed is not None:
            items = [i for i in items if not isinstance(i, FileRef)] + parsed.items
            report.parsed, report.parse_seconds = parsed.parsed, parsed.seconds
            report.parsed_by = parsed.by if parsed.parsed else ""
            for _, chunks, by_this_job in parsed.unchanged:
                if by_this_job:  # a redelivered batch: what its first attempt wrote
                    report.documents += 1
                    report.chunks += chunks
                else:
                    report.unchanged += 1
        docs: dict[str, Document] = {}
        for item in items:
            if isinstance(item, Skipped):
                report.skipped.append(item.to_json())
            elif isinstance(item, DocumentFailure):
                report.failed.append(item.to_json())
            else:
                docs[item.doc_id] = item  # the readers fail a duplicate id (the first wins); here the last would
        if not docs:
            return report

        # Writers hold the write fence shared from resolving the generation to their last write, so a re-embed
        # swap (exclusive) never misses a write; the generation is pinned so one batch never straddles a swap.
        towers, sparse, store = self.towers, self.sparse, self.store
        with (self.fence or NoFence()).shared():
            if generation is None:
                active = store.active()
                if active is not None and self.towers_for is not None and active.spec.model != towers.fingerprint:
                    towers = self.towers_for(active.spec.model)  # the towers follow the collection (re-embeds move it)
                creating = sparse if active is not None else for_new_collection(sparse, docs.values())  # its language
                generation = store.ensure_collection(collection_spec(towers, creating))
            if sparse is not None:  # the collection's stored BM25 configuration wins over this process's default
                sparse = for_spec(_spec_of(store, generation), sparse)
            self._write_documents(docs, report, towers, sparse, generation)
        log.info(
            "ingested batch",
            extra={"job": job, "documents": report.documents, "chunks": report.chunks, "unchanged": report.unchanged},
        )
        return report

    def _write_documents(self, docs: dict[str, Document], report: IngestReport, towers: DualEncoder,
                         sparse: SparseEncoder | None, generation: str) -> None:
        states = self.store.doc_states(list(docs), generation=generation)
        t0 = time.perf_counter()
        planned: list[tuple[Document, list[Chunk]]] = []
        for doc in docs.values():
            try:
                chunks, title_truncated = chunk_document(doc, towers, self.chunking)
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
                # Stored whole already: no encoder work. If this job wrote it (an earlier attempt of a redelivered
                # batch whose worker died), it counts as written, with its passages, as that attempt would have.
                if report.job and report.job in state.jobs:
                    report.documents += 1
                    report.chunks += len(chunks)
                    report.title_truncated += int(title_truncated)
                else:
                    report.unchanged += 1
                continue
            report.title_truncated += int(title_truncated)
            planned.append((doc, chunks))
        report.chunk_seconds += time.perf_counter() - t0
        if planned:
            self._encode_and_store(planned, report, towers, sparse, generation)

    def _encode_and_store(self, planned: list[tuple[Document, list[Chunk]]], report: IngestReport,
                          towers: DualEncoder, sparse: SparseEncoder | None, generation: str) -> None:
        """Encode every planned chunk in one passage-tower call, upsert the points, then drop stale chunks."""
        now = now_iso()
        passages = [
            Passage(doc_id=doc.doc_id, chunk_index=c.index, text=c.text, title=c.title, doc_hash=doc.doc_hash,
                    source=doc.source, ingested_at=now, model=towers.fingerprint, metadata=dict(doc.metadata),
                    job=report.job, page=c.page, page_end=c.page_end, heading=c.heading, format=doc.format)
            for doc, chunks in planned for c in chunks
        ]
        seconds: dict[str, float] = {}
        points = passage_points(passages, [c.encoder_text for _, chunks in planned for c in chunks],
                                [c.tokens for _, chunks in planned for c in chunks], towers=towers, sparse=sparse,
                                batch_size=self.batch_size, seconds=seconds)
        report.encode_seconds, report.sparse_seconds = seconds["encode"], seconds["sparse"]
        t0 = time.perf_counter()
        self.store.upsert(points, generation=generation, replace=True)  # and each document's stale chunks, in one write
        report.upsert_seconds = time.perf_counter() - t0
        report.documents += len(planned)
        report.chunks += len(points)


def delete_documents(doc_ids: Iterable[str], *, store: VectorStore, fence: WriteFence | None = None) -> int:
    """Remove every passage of each document, under the collection's write fence."""
    with (fence or NoFence()).shared():
        return store.delete_documents(list(doc_ids))
