"""Composition helpers shared by the composition roots (CLI, workers, API): settings -> towers, sparse, store.

Everything is lazy and cached per process, so a worker loads its model once and the CLI starts fast.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cached_property
from typing import Protocol

from encoders.towers import DualEncoder, SentenceTransformerTowers, configure_threads, load_towers
from services.ingest import IngestReport, ProgressFn, SparseEncoder, delete_documents, ingest_documents
from services.locks import WriteFence
from services.query import QueryOptions, search
from services.readers import Item
from services.settings import Settings
from services.store.points import Hit
from services.store.protocol import VectorStore


def open_towers(settings: Settings) -> SentenceTransformerTowers:
    configure_threads(settings.encoder.threads)
    return load_towers(settings.encoder.model, settings.models_dir, device=settings.encoder.device)


def open_sparse(settings: Settings) -> SparseEncoder:
    from services.sparse import default_embedder

    return default_embedder()


class Runtime:
    """The parts one process needs, built on first use from one Settings object."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @cached_property
    def towers(self) -> SentenceTransformerTowers:
        return open_towers(self.settings)

    @cached_property
    def sparse(self) -> SparseEncoder:
        return open_sparse(self.settings)

    @cached_property
    def store(self) -> VectorStore:
        from services.store import open_store

        return open_store(self.settings)

    def towers_for(self, fingerprint: str) -> SentenceTransformerTowers:
        """The towers whose fingerprint is ``fingerprint`` (base or under models_dir): queries and ingest follow
        the collection's active generation across re-embeds and rollbacks."""
        if self.towers.fingerprint == fingerprint:
            return self.towers
        from services.reembed import model_for_fingerprint

        path, _ = model_for_fingerprint(fingerprint, self.settings.models_dir)
        return load_towers(str(path), self.settings.models_dir, device=self.settings.encoder.device)

    @cached_property
    def fence(self) -> WriteFence:
        """The collection's write fence (shared by writers, exclusive for a re-embed swap or a rollback)."""
        from services.reembed import write_fence

        s = self.settings
        return write_fence(s.collection, s.data_dir, s.broker_url, s.reembed.fence_timeout)

    def close(self) -> None:
        if "store" in self.__dict__:
            self.store.close()


class Parts(Protocol):
    """What the shared entry points below need: a ``Runtime``, or a wrapper around one (the API's)."""

    @property
    def towers(self) -> DualEncoder: ...

    @property
    def sparse(self) -> SparseEncoder: ...

    @property
    def store(self) -> VectorStore: ...

    @property
    def fence(self) -> WriteFence: ...

    def towers_for(self, fingerprint: str) -> DualEncoder: ...


# The one wiring of ingest / query / delete that the CLI, the HTTP API and the workers share.


def run_ingest(
    parts: Parts,
    settings: Settings,
    items: Iterable[Item],
    *,
    job: str | None = None,
    progress: ProgressFn | None = None,
) -> IngestReport:
    return ingest_documents(
        items,
        store=parts.store,
        towers=parts.towers,
        chunking=settings.chunk,
        sparse=parts.sparse,
        batch_size=settings.encoder.batch_size,
        batch_documents=settings.celery.batch_documents,
        batch_bytes=settings.celery.batch_bytes,
        job=job,
        progress=progress,
        fence=parts.fence,
        towers_for=parts.towers_for,
    )


def run_search(parts: Parts, question: str, options: QueryOptions) -> list[Hit]:
    return search(
        question, store=parts.store, towers=parts.towers, options=options, sparse=parts.sparse,
        towers_for=parts.towers_for,
    )


def run_delete(parts: Parts, doc_ids: Iterable[str]) -> int:
    return delete_documents(doc_ids, store=parts.store, fence=parts.fence)
