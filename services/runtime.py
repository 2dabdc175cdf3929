"""Composition helpers shared by the composition roots (CLI, workers, API): settings -> towers, sparse, store.

Everything is lazy and cached per process, so a worker loads its model once and the CLI starts fast.
"""

from __future__ import annotations

from functools import cached_property

from encoders.towers import SentenceTransformerTowers, configure_threads, load_towers
from services.ingest import SparseEncoder
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

    def close(self) -> None:
        if "store" in self.__dict__:
            self.store.close()
