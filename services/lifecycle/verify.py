"""Catch-up and verification: make the target hold exactly the source's passages (with the new model), and prove
it (same count, same ids, same text and doc hash per id, one fingerprint) before the swap.

Deletes cannot resurrect: the catch-up deletes target points whose id the source lacks.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from encoders.towers import DualEncoder
from services.lifecycle.copy import Index, copy_batch, index_of, is_done
from services.lifecycle.state import ReembedState
from services.store.points import Passage
from services.store.protocol import VectorStore
from services.store.sparse import SparseEncoder

log = logging.getLogger(__name__)


@dataclass
class Diff:
    source_count: int = 0
    target_count: int = 0
    stale: list[Passage] = field(default_factory=list)  # source passages missing or different in the target
    extra: dict[str, str] = field(default_factory=dict)  # target point id -> doc id, absent from the source
    foreign: int = 0  # target points embedded by another model
    source_docs: dict[str, tuple[str, int]] = field(default_factory=dict)  # doc id -> (doc hash, chunks)
    source: Index = field(default_factory=dict, repr=False)  # the source as read

    @property
    def clean(self) -> bool:
        return not self.stale and not self.extra and not self.foreign and self.source_count == self.target_count

    def to_json(self) -> dict[str, Any]:
        return {
            "source_count": self.source_count,
            "target_count": self.target_count,
            "missing_or_stale": len(self.stale),
            "extra": len(self.extra),
            "foreign_model": self.foreign,
            "ok": self.clean,
        }


def diff(store: VectorStore, state: ReembedState) -> Diff:
    """The source read from a copy (``VectorStore.scan``: `dpr serve` keeps it), the target as it is."""
    src, src_passages = index_of(store.scan(generation=state.source))
    tgt, tgt_passages = index_of(store.scroll(1024, generation=state.target))
    d = Diff(source_count=len(src), target_count=len(tgt), source=src)
    for p in src_passages.values():
        h, n = d.source_docs.get(p.doc_id, (p.doc_hash, 0))
        d.source_docs[p.doc_id] = (h if h == p.doc_hash else "", n + 1)
        if not is_done(tgt, state.model, p):
            d.stale.append(p)
    for pid, (model, _, _) in tgt.items():
        if pid not in src:
            d.extra[pid] = tgt_passages[pid].doc_id
        if model != state.model:
            d.foreign += 1
    return d


def catch_up(
    store: VectorStore, state: ReembedState, towers: DualEncoder, sparse: SparseEncoder | None, batch_size: int = 256
) -> Diff:
    """Make the target hold exactly the source's passages (new model): copy what changed, delete what went."""
    d = diff(store, state)
    for start in range(0, len(d.stale), batch_size):
        copy_batch(store, state, d.stale[start : start + batch_size], towers, sparse)
    gone = sorted({doc for doc in d.extra.values() if doc not in d.source_docs})
    if gone:
        store.delete_documents(gone, generation=state.target)
    shrunk = sorted({doc for doc in d.extra.values() if doc in d.source_docs})
    for doc in shrunk:
        doc_hash, chunks = d.source_docs[doc]
        if doc_hash:
            store.delete_stale(doc, doc_hash, chunks, generation=state.target)
    if d.stale or d.extra:
        log.info("caught up", extra={"target": state.target, "copied": len(d.stale), "deleted": len(d.extra)})
    return d


@dataclass(frozen=True)
class Verification:
    ok: bool
    source_count: int
    target_count: int
    missing: int
    extra: int
    stale: int
    models: list[str]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def verify(store: VectorStore, state: ReembedState, source: Index | None = None) -> Verification:
    """Same count as the source, every id present, same text and doc hash per id, one fingerprint (the new).
    ``source``: the source as read under the same write fence (not read again)."""
    src = source if source is not None else index_of(store.scan(generation=state.source))[0]
    tgt, _ = index_of(store.scroll(1024, generation=state.target))
    missing = sum(1 for pid in src if pid not in tgt)
    extra = sum(1 for pid in tgt if pid not in src)
    stale = sum(1 for pid, v in src.items() if pid in tgt and tgt[pid][1:] != v[1:])
    models = sorted({v[0] for v in tgt.values()})
    counted = store.count(generation=state.target)
    ok = (
        missing == 0
        and extra == 0
        and stale == 0
        and len(src) == len(tgt) == counted
        and models in ([state.model], [])
    )
    return Verification(ok, len(src), counted, missing, extra, stale, models)


def verified_by(d: Diff, state: ReembedState) -> Verification:
    """A clean diff taken under the fence *is* the verification (same ids, hashes, one model)."""
    return Verification(
        ok=d.clean, source_count=d.source_count, target_count=d.target_count, missing=0, extra=0, stale=0,
        models=[state.model] if d.target_count else [],
    )
