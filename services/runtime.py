"""Composition helpers shared by the composition roots (CLI, workers, API): settings -> towers, sparse, store.

Everything is lazy and cached per process, so a worker loads its model once and the CLI starts fast.
"""

from __future__ import annotations

from functools import cached_property

from encoders.towers import SentenceTransformerTowers, configure_threads, load_towers
from services.ingest import SparseEncoder
from services.locks import WriteFence
from services.settings import Settings
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
