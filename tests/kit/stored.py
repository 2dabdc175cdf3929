"""What a data dir's store holds, read through the real store: the crash and full-disk tests compare a clean run's
points with an interrupted one's."""

from __future__ import annotations

from pathlib import Path


def stored_points(data: Path) -> dict[str, tuple[str, int, str]]:
    """Every point of the data dir's default collection: id -> (document, chunk index, document hash)."""
    from services.core.settings import Settings
    from services.store import open_store

    store = open_store(Settings(data_dir=data))
    try:
        return {p.id: (p.doc_id, p.chunk_index, p.doc_hash) for batch in store.scroll() for p in batch}
    finally:
        store.close()
