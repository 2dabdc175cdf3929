"""The store's BM25 bookkeeping (``services.store.bm25`` has the arithmetic): each point's length in its payload,
the generation's stats record kept current on upsert and delete, and the re-weighting of drifted points.

``Store`` (``services.store.frontend``, its write paths by document in ``documents.py``) calls these on writes only
(upsert, delete, optimize): a search never loads this module or ``bm25``, so `dpr query` on a dense collection does
not import them. Each works on one
generation of an engine (``name``, the caller resolved it), inside the caller's engine sessions; one that rewrites
the spec calls ``changed()`` after (the store's cached active generation is stale).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import services.store.bm25 as bm25
from services.store.common import Where, stale_filter
from services.store.points import SPARSE, CollectionSpec, PassagePoint, SparseVector, point_id
from services.store.protocol import Engine, pages

log = logging.getLogger(__name__)

SCAN_BATCH = 1024
Finish = Callable[[dict[str, tuple[str, int]]], None]
Changed = Callable[[], None]


def payload(point: PassagePoint) -> dict[str, Any]:
    """The point's payload, with its BM25 length when its sparse vector carries counts."""
    out = point.passage.to_payload()
    n = bm25.length(point.sparse)
    if n is not None and point.sparse is not None:
        out[bm25.LENGTH_FIELD] = n
        out[bm25.AVG_FIELD] = point.sparse.avg_len
    return out


def prepare_upsert(engine: Engine, name: str, spec: CollectionSpec, points: Sequence[PassagePoint], replace: bool,
                   changed: Changed) -> tuple[Sequence[PassagePoint], Finish]:
    """Re-weight the points' sparse vectors with the generation's average length including them, and the
    step that records the new stats once they are written (``finish(versions)``: subtracts the stale points
    ``upsert`` is about to delete for those document versions). Points without counts (no sparse vector, a test
    double's) pass as they are. Inside the caller's engine session."""
    lengths = [bm25.length(p.sparse) for p in points]
    if not spec.sparse or all(n is None for n in lengths):
        return points, lambda versions: None
    fresh = engine.read_spec(name)
    current = bm25.read_stats(fresh, name)
    if not bm25.has_stats(fresh, name) and engine.count(name) > 0:  # points from before the record
        current = dataclasses.replace(current, complete=False)
    old = engine.payloads(name, [p.passage.id for p in points])  # overwritten points leave the stats
    current = current.add([float(v[bm25.LENGTH_FIELD]) for v in old.values() if bm25.LENGTH_FIELD in v], sign=-1)
    current = current.add([n for n in lengths if n is not None])
    avg = current.avg_len or 1.0
    current = current.weighted_with(avg)
    k, b = bm25.params(spec)
    weighted = [
        p if p.sparse is None or n is None
        else dataclasses.replace(p, sparse=bm25.renormalized(p.sparse, avg, k, b))
        for p, n in zip(points, lengths, strict=True)
    ]

    def finish(versions: dict[str, tuple[str, int]]) -> None:
        # only documents that were stored before can have stale points (every stored version has its chunk 0,
        # which this write overwrote): a new document costs no scan
        stale = [stale_filter(d, h, n) for d, (h, n) in versions.items() if point_id(d, 0) in old]
        gone = lengths_of(engine, name, Where(should=tuple(stale))) if stale and replace else []
        write(engine, name, current.add(gone, sign=-1), changed)

    return weighted, finish


def renormalize(engine: Engine, name: str, spec: CollectionSpec, changed: Changed,
                tolerance: float | None = None) -> int:
    """Re-weight the points whose weights use an average length more than ``tolerance`` off the generation's
    own (and count, then re-weight, points from before the stats record); returns how many were rewritten.
    Nothing is read when the stats record's range says no point drifted. Each page is read and rewritten
    under one engine session (edge: one lease hold, so no other writer lands in between). The drift is checked
    without the lease (specs are written atomically)."""
    tolerance = bm25.DRIFT if tolerance is None else tolerance
    fresh = engine.read_spec(name)
    current = bm25.read_stats(fresh, name)
    if not bm25.has_stats(fresh, name) and spec.sparse:
        with engine.session():
            if engine.count(name) > 0:
                current = dataclasses.replace(current, complete=False)  # a generation from before the record
    k, b = bm25.params(spec)
    if not spec.sparse or not current.drifted(tolerance) or k <= 0 or b <= 0:
        return 0
    prior = bm25.prior(spec)
    migrating = not current.complete
    if migrating:  # count every point from scratch (old ones from their vectors), so the average includes them
        lengths: list[float] = []
        for records in pages(engine, name, SCAN_BATCH, None, [bm25.LENGTH_FIELD]):
            lengths.extend(float(p[bm25.LENGTH_FIELD]) for _, p in records if bm25.LENGTH_FIELD in p)
            stale = [pid for pid, p in records if bm25.LENGTH_FIELD not in p]
            with engine.session():
                for _, vectors, _ in engine.points(name, stale) if stale else []:
                    sparse = vectors.get(SPARSE)  # none: a passage made only of stopwords (length 0)
                    lengths.append(sum(bm25.recover_counts(sparse.values, prior, k, b))
                                   if isinstance(sparse, SparseVector) else 0.0)
        current = dataclasses.replace(bm25.Bm25Stats(name).add(lengths), complete=True)
    avg = current.avg_len
    if avg is None:
        return 0
    rewritten, low, high = 0, avg, avg
    for records in pages(engine, name, SCAN_BATCH, None, [bm25.LENGTH_FIELD, bm25.AVG_FIELD]):
        todo = []
        for pid, fields in records:
            used = fields.get(bm25.AVG_FIELD) if bm25.LENGTH_FIELD in fields else prior
            if not isinstance(used, int | float) or used <= 0:
                continue
            if bm25.LENGTH_FIELD not in fields or bm25.off(float(used), avg, tolerance):
                todo.append(pid)
            else:
                low, high = min(low, float(used)), max(high, float(used))
        if not todo:
            continue
        with engine.session():
            batch = []
            for pid, vectors, fields in engine.points(name, todo):
                sparse = vectors.get(SPARSE)
                length = fields.get(bm25.LENGTH_FIELD)
                used = float(fields.get(bm25.AVG_FIELD) or prior) if length is not None else prior
                if isinstance(sparse, SparseVector):
                    counts = bm25.recover_counts(sparse.values, used, k, b, None if length is None else float(length))
                    vectors[SPARSE] = SparseVector(sparse.indices, bm25.weights(counts, avg, k, b))
                    length = sum(counts)
                fields[bm25.LENGTH_FIELD] = float(length or 0.0)
                fields[bm25.AVG_FIELD] = avg
                batch.append((pid, vectors, fields))
            if batch:
                engine.upsert(name, batch)
            rewritten += len(batch)
    with engine.session():
        latest = bm25.read_stats(engine.read_spec(name), name)  # writers may have moved it meanwhile
        write(engine, name, dataclasses.replace(current if migrating else latest, low=low, high=high, complete=True),
              changed)
    log.info("bm25 re-weighted", extra={"alias": engine.alias, "generation": name, "points": rewritten,
                                        "avg_len": round(avg, 2)})
    return rewritten


def lengths_of(engine: Engine, name: str, where: Where) -> list[float]:
    """The recorded lengths of the points ``where`` matches (before they are deleted)."""
    found: list[float] = []
    for records in pages(engine, name, SCAN_BATCH, where, [bm25.LENGTH_FIELD]):
        found.extend(float(p[bm25.LENGTH_FIELD]) for _, p in records if bm25.LENGTH_FIELD in p)
    return found


def forget(engine: Engine, name: str, spec: CollectionSpec, where: Where, changed: Changed) -> None:
    """Subtract the lengths of the points ``where`` matches (about to be deleted) from the stats record."""
    if spec.sparse:
        gone = lengths_of(engine, name, where)
        if gone:
            write(engine, name, bm25.read_stats(engine.read_spec(name), name).add(gone, sign=-1), changed)


def write(engine: Engine, name: str, record: bm25.Bm25Stats, changed: Changed) -> None:
    spec = engine.read_spec(name)  # fresh: another process may have merged settings meanwhile
    settings = {**spec.settings, bm25.STATS_KEY: record.to_json()}
    engine.write_spec(name, dataclasses.replace(spec, settings=settings))
    changed()
