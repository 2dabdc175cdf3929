"""The store's write paths by document (``Store.upsert``, ``doc_states``, ``delete_stale``, ``delete_documents``):
points written in batches of the engine's size, a changed document's stale chunks deleted after, each document's
state read from its points' payloads, and the BM25 bookkeeping of each (``bm25_upkeep.py``) kept alongside.

``Store`` (``services.store.frontend``) resolves the generation (``name``, ``spec``) in one engine session and calls
these inside it; a search never loads this module. One that rewrites the spec calls ``changed()`` after (the store's
cached active generation is stale).
"""

from __future__ import annotations

from collections.abc import Sequence

import services.store.bm25_upkeep as upkeep
from services.store.common import (
    DocStateGroups,
    add_doc_state,
    check_dense_dim,
    doc_states_from,
    document_versions,
    documents_filter,
    stale_filter,
)
from services.store.points import CollectionSpec, DocState, PassagePoint, point_vectors
from services.store.protocol import Engine, pages

STATE_FIELDS = ["doc_id", "doc_hash", "model", "ingested_at", "job", "file_sig"]


def upsert(engine: Engine, alias: str, name: str, spec: CollectionSpec, points: Sequence[PassagePoint], replace: bool,
           changed: upkeep.Changed) -> None:
    """Write ``points`` (``replace``: then delete their documents' chunks of an older version or beyond their count)."""
    versions = document_versions(points) if replace else {}
    for p in points:
        check_dense_dim(alias, name, spec, p.dense, f"passage {p.passage.doc_id}#{p.passage.chunk_index}")
    points, finish = upkeep.prepare_upsert(engine, name, spec, points, replace, changed)
    size = engine.upsert_batch
    for start in range(0, len(points), size):
        batch = points[start : start + size]
        engine.upsert(name, [(p.passage.id, point_vectors(p, spec.sparse), upkeep.payload(p)) for p in batch])
    finish(versions)
    for doc_id, (doc_hash, chunks) in versions.items():
        engine.delete(name, stale_filter(doc_id, doc_hash, chunks))


def doc_states(engine: Engine, name: str, doc_ids: list[str]) -> dict[str, DocState]:
    """The state of each of ``doc_ids`` (sorted, none twice) that has points, from their payloads."""
    groups: DocStateGroups = {}
    for records in pages(engine, name, upkeep.SCAN_BATCH, documents_filter(doc_ids), STATE_FIELDS):
        for _, payload in records:
            add_doc_state(groups, payload)
    return doc_states_from(groups)


def delete_stale(engine: Engine, name: str, spec: CollectionSpec, doc_id: str, keep_doc_hash: str, keep_chunks: int,
                 changed: upkeep.Changed) -> None:
    stale = stale_filter(doc_id, keep_doc_hash, keep_chunks)
    upkeep.forget(engine, name, spec, stale, changed)
    engine.delete(name, stale)


def delete_documents(engine: Engine, name: str, spec: CollectionSpec, doc_ids: list[str],
                     changed: upkeep.Changed) -> int:
    """Delete every point of ``doc_ids`` (sorted, none twice); returns how many there were."""
    where = documents_filter(doc_ids)
    removed = engine.count(name, where)
    if removed:
        upkeep.forget(engine, name, spec, where, changed)
        engine.delete(name, where)
    return removed
