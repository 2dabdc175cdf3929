"""The one contract every vector store adapter meets. Service code talks to this and nothing else.

A *collection* is an alias (the name users see) over *generations* (physical collections / shard
directories). Exactly one generation is active; re-embedding builds a new one and swaps the alias atomically.
Data operations act on the active generation unless ``generation=`` names another.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from services.store.points import (
    CollectionInfo,
    CollectionSpec,
    DocState,
    Hit,
    Passage,
    PassagePoint,
    SearchRequest,
)


@runtime_checkable
class VectorStore(Protocol):
    backend: str  # "edge" | "server"
    alias: str

    # --- collection and generations -------------------------------------------------------------------
    def info(self) -> CollectionInfo:
        """Alias, active generation (None if the collection does not exist yet), every generation kept."""
        ...

    def ensure_collection(self, spec: CollectionSpec) -> str:
        """Create the first generation and point the alias at it if the collection does not exist.

        If it exists, check ``spec`` against the active generation (dimension, distance, model fingerprint)
        and raise ``ModelMismatch`` naming both and the fix. Returns the active generation's name.
        """
        ...

    def create_generation(self, spec: CollectionSpec) -> str:
        """Create a new, empty, inactive generation; returns its name."""
        ...

    def activate(self, generation: str) -> None:
        """Point the alias at ``generation`` atomically (readers see the old or the new, never neither)."""
        ...

    def drop_generation(self, generation: str) -> None:
        """Delete an inactive generation. Refuses the active one."""
        ...

    def update_settings(self, settings: dict[str, object], generation: str | None = None) -> None:
        """Merge ``settings`` into the generation spec's ``settings`` (e.g. the tuned fusion)."""
        ...

    # --- data ------------------------------------------------------------------------------------------
    def upsert(self, points: Sequence[PassagePoint], generation: str | None = None) -> None:
        """Idempotent: point ids are uuid5(doc id, chunk index)."""
        ...

    def doc_states(self, doc_ids: Iterable[str], generation: str | None = None) -> dict[str, DocState]:
        """For each stored document among ``doc_ids``: its doc hash, model fingerprint and chunk count."""
        ...

    def delete_stale(self, doc_id: str, keep_doc_hash: str, keep_chunks: int, generation: str | None = None) -> None:
        """Delete the document's points that belong to another version or lie beyond ``keep_chunks``."""
        ...

    def delete_documents(self, doc_ids: Iterable[str], generation: str | None = None) -> int:
        """Delete every point of these documents; returns how many points were removed."""
        ...

    def count(self, generation: str | None = None) -> int: ...

    def ids(self, generation: str | None = None) -> set[str]:
        """Every point id (for verification)."""
        ...

    def scroll(self, batch_size: int = 256, generation: str | None = None) -> Iterator[list[Passage]]:
        """Every stored passage (payload only), in batches, in a stable order."""
        ...

    def search(self, request: SearchRequest, generation: str | None = None) -> list[Hit]: ...

    def close(self) -> None: ...
