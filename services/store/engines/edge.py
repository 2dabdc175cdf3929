"""``EdgeStore``: the embedded default, over qdrant-edge-py (Qdrant's Rust engine in-process).

On disk, for collection (alias) ``A`` under ``settings.store_dir``::

    A/.lock                              flock target; holds "pid host since" of the last owner
    A/CURRENT                            name of the active generation, replaced atomically
    A/generations/A__g0001/spec.json     CollectionSpec.to_json()
    A/generations/A__g0001/shard/        one EdgeShard (WAL, segments, payload indexes)

Ownership across processes: every call goes through the directory's ``ShardLease`` (``services/store/lease.py``):
one process at a time, shards opened lazily, released when idle.

HNSW graphs are built only by ``optimize()``; before that searches are an exact scan (fine below ~100k points).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdrant_edge import (
    CountRequest,
    Distance,
    EdgeConfig,
    EdgeShard,
    EdgeSparseVectorParams,
    EdgeVectorParams,
    FieldCondition,
    Filter,
    Fusion,
    MatchAny,
    MatchValue,
    Modifier,
    PayloadSchemaType,
    Point,
    Prefetch,
    Query,
    QueryBatchRequest,
    QueryRequest,
    RangeFloat,
    ScrollRequest,
    UpdateOperation,
)
from qdrant_edge import SparseVector as EdgeSparseVector

from services.errors import ConfigError
from services.store.common import (
    DocStateGroups,
    Scored,
    add_doc_state,
    check_compatible,
    check_dense_dim,
    doc_states_from,
    filter_clauses,
    generation_name,
    generation_number,
    linear_fusion,
    missing_collection,
    missing_generation,
    validate_request,
    validate_spec,
)
from services.store.lease import ShardLease, lease_for
from services.store.points import (
    DENSE,
    INDEXED_KEYWORDS,
    SPARSE,
    CollectionInfo,
    CollectionSpec,
    DocState,
    GenerationInfo,
    Hit,
    Passage,
    PassagePoint,
    SearchRequest,
    SparseVector,
)

if TYPE_CHECKING:
    from services.settings import Settings

log = logging.getLogger(__name__)

_DISTANCES = {"cosine": Distance.Cosine, "dot": Distance.Dot, "euclid": Distance.Euclid}
_STATE_FIELDS = ["doc_id", "doc_hash", "model", "ingested_at"]
_UPSERT_BATCH = 512
_SCAN_BATCH = 1024


# --------------------------------------------------------------------------------------------------------------
# small file helpers
# --------------------------------------------------------------------------------------------------------------


def _write_atomic(path: Path, text: str) -> None:
    """Write a temp file, fsync it, ``os.replace`` it over ``path``, fsync the directory."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _edge_config(spec: CollectionSpec) -> EdgeConfig:
    return EdgeConfig(
        vectors={DENSE: EdgeVectorParams(size=spec.dim, distance=_DISTANCES[spec.distance])},
        sparse_vectors={SPARSE: EdgeSparseVectorParams(modifier=Modifier.Idf)} if spec.sparse else None,
    )


def _edge_filter(filters: dict[str, Any]) -> Filter | None:
    if not filters:
        return None
    conditions: list[Any] = []
    for clause in filter_clauses(filters):
        match = MatchAny(clause.any_values()) if clause.any_of else MatchValue(clause.values[0])
        conditions.append(FieldCondition(key=clause.key, match=match))
    return Filter(must=conditions)


def _edge_sparse(vector: SparseVector) -> EdgeSparseVector:
    return EdgeSparseVector(indices=list(vector.indices), values=list(vector.values))


def _doc_filter(doc_ids: Sequence[str]) -> Filter:
    return Filter(must=[FieldCondition(key="doc_id", match=MatchAny(list(doc_ids)))])


# --------------------------------------------------------------------------------------------------------------
# the adapter
# --------------------------------------------------------------------------------------------------------------


class EdgeStore:
    """``VectorStore`` over qdrant-edge shard directories under ``store_dir/alias``."""

    backend = "edge"

    def __init__(self, store_dir: Path | str, alias: str, *, lock_timeout: float = 120.0, idle_release: float = 0.5):
        if lock_timeout <= 0:
            raise ConfigError(f"edge lock_timeout must be positive, got {lock_timeout}")
        self.alias = alias
        self.root = Path(store_dir) / alias
        self.lock_timeout = lock_timeout
        self.idle_release = idle_release
        self._lease = lease_for(self.root)

    @classmethod
    def from_settings(cls, settings: Settings) -> EdgeStore:
        return cls(
            settings.store_dir,
            settings.collection,
            lock_timeout=settings.edge.lock_timeout,
            idle_release=settings.edge.idle_release,
        )

    def __repr__(self) -> str:
        return f"EdgeStore({str(self.root)!r})"

    # -- paths and on-disk state --------------------------------------------------------------------------
    @property
    def _generations_dir(self) -> Path:
        return self.root / "generations"

    def _spec_path(self, generation: str) -> Path:
        return self._generations_dir / generation / "spec.json"

    def _shard_path(self, generation: str) -> Path:
        return self._generations_dir / generation / "shard"

    def _read_current(self) -> str | None:
        try:
            return (self.root / "CURRENT").read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None

    def _read_spec(self, generation: str) -> CollectionSpec:
        if generation_number(self.alias, generation) is None:  # also keeps paths inside the store
            raise missing_generation(self.alias, generation)
        try:
            data = json.loads(self._spec_path(generation).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise missing_generation(self.alias, generation) from None
        return CollectionSpec.from_json(data)

    def _generations(self) -> list[str]:
        """Complete generations (spec written), oldest first."""
        if not self._generations_dir.is_dir():
            return []
        numbered = []
        for entry in self._generations_dir.iterdir():
            number = generation_number(self.alias, entry.name)
            if number is not None and (entry / "spec.json").is_file():
                numbered.append((number, entry.name))
        return [name for _, name in sorted(numbered)]

    def _next_generation(self) -> str:
        numbers = [0]
        if self._generations_dir.is_dir():
            numbers += [generation_number(self.alias, e.name) or 0 for e in self._generations_dir.iterdir()]
        return generation_name(self.alias, max(numbers) + 1)

    @contextlib.contextmanager
    def _held(self) -> Iterator[ShardLease]:
        with self._lease.held(self.lock_timeout, self.idle_release) as lease:
            yield lease

    @contextlib.contextmanager
    def _open(self, generation: str | None) -> Iterator[tuple[str, CollectionSpec, EdgeShard]]:
        """Lease held, generation resolved (the active one by default), its spec and open shard."""
        if not (self.root / "CURRENT").is_file() and generation is None:
            raise missing_collection(self.alias, self.backend)
        if not self.root.is_dir():
            raise missing_collection(self.alias, self.backend)
        with self._held() as lease:
            name = generation or self._read_current()
            if name is None:
                raise missing_collection(self.alias, self.backend)
            spec = self._read_spec(name)
            yield name, spec, lease.shard(name, self._shard_path(name))

    # -- collection and generations -----------------------------------------------------------------------
    def info(self) -> CollectionInfo:
        if not self.root.is_dir():
            return CollectionInfo(alias=self.alias, backend=self.backend, active=None, generations=[])
        with self._held() as lease:
            active = self._read_current()
            generations = []
            for name in self._generations():
                count = lease.shard(name, self._shard_path(name)).count(CountRequest(exact=True))
                generations.append(
                    GenerationInfo(name=name, spec=self._read_spec(name), count=count, active=name == active)
                )
        active_info = next((g for g in generations if g.active), None)
        return CollectionInfo(alias=self.alias, backend=self.backend, active=active_info, generations=generations)

    def ensure_collection(self, spec: CollectionSpec) -> str:
        validate_spec(spec)
        self.root.mkdir(parents=True, exist_ok=True)
        with self._held():
            active = self._read_current()
            if active is None:
                active = self._create_generation_locked(spec)
                self._write_current(active)
                log.info("created collection", extra={"alias": self.alias, "generation": active})
                return active
            check_compatible(self.alias, active, self._read_spec(active), spec)
            return active

    def create_generation(self, spec: CollectionSpec) -> str:
        validate_spec(spec)
        self.root.mkdir(parents=True, exist_ok=True)
        with self._held():
            name = self._create_generation_locked(spec)
        log.info("created generation", extra={"alias": self.alias, "generation": name})
        return name

    def _create_generation_locked(self, spec: CollectionSpec) -> str:
        name = self._next_generation()
        gen_dir = self._generations_dir / name
        gen_dir.mkdir(parents=True)
        shard = EdgeShard.create(str(self._shard_path(name)), _edge_config(spec))
        self._lease.adopt(name, shard)
        for key in INDEXED_KEYWORDS:
            shard.update(UpdateOperation.create_field_index(key, PayloadSchemaType.Keyword))
        shard.update(UpdateOperation.create_field_index("chunk_index", PayloadSchemaType.Integer))
        shard.flush()
        _write_atomic(self._spec_path(name), json.dumps(spec.to_json(), indent=2, sort_keys=True))
        return name

    def _write_current(self, generation: str) -> None:
        _write_atomic(self.root / "CURRENT", generation + "\n")

    def activate(self, generation: str) -> None:
        if not self.root.is_dir():
            raise missing_collection(self.alias, self.backend)
        with self._held():
            self._read_spec(generation)  # raises if it does not exist
            previous = self._read_current()
            self._write_current(generation)
        log.info("activated generation", extra={"alias": self.alias, "generation": generation, "previous": previous})

    def drop_generation(self, generation: str) -> None:
        if not self.root.is_dir():
            raise missing_collection(self.alias, self.backend)
        with self._held() as lease:
            if generation == self._read_current():
                raise ConfigError(
                    f"generation {generation!r} is the active generation of {self.alias!r}; activate another "
                    "generation first"
                )
            if generation_number(self.alias, generation) is None or not (self._generations_dir / generation).is_dir():
                raise missing_generation(self.alias, generation)
            lease.forget(generation)
            # rename first so that a crash mid-delete never leaves a half generation that looks complete
            trash = self._generations_dir / f".{generation}.dropping.{os.getpid()}"
            os.replace(self._generations_dir / generation, trash)
            _rmtree(trash)
        log.info("dropped generation", extra={"alias": self.alias, "generation": generation})

    def update_settings(self, settings: dict[str, object], generation: str | None = None) -> None:
        with self._open(generation) as (name, spec, _):
            merged = CollectionSpec.from_json({**spec.to_json(), "settings": {**spec.settings, **settings}})
            _write_atomic(self._spec_path(name), json.dumps(merged.to_json(), indent=2, sort_keys=True))

    def optimize(self, generation: str | None = None) -> bool:
        """Build HNSW graphs and merge segments (blocking; minutes at 100k points). True if anything changed."""
        with self._open(generation) as (name, _, shard):
            changed = shard.optimize()
            shard.flush()
        log.info("optimized generation", extra={"alias": self.alias, "generation": name, "changed": changed})
        return bool(changed)

    # -- data -----------------------------------------------------------------------------------------------
    def upsert(self, points: Sequence[PassagePoint], generation: str | None = None) -> None:
        if not points:
            return
        with self._open(generation) as (name, spec, shard):
            batch: list[Point] = []
            for p in points:
                check_dense_dim(self.alias, name, spec, p.dense, f"passage {p.passage.doc_id}#{p.passage.chunk_index}")
                vector: dict[str, Any] = {DENSE: [float(x) for x in p.dense]}
                if spec.sparse and p.sparse is not None and p.sparse.indices:
                    vector[SPARSE] = _edge_sparse(p.sparse)
                batch.append(Point(p.passage.id, vector, p.passage.to_payload()))
                if len(batch) >= _UPSERT_BATCH:
                    shard.update(UpdateOperation.upsert_points(batch))
                    batch = []
            if batch:
                shard.update(UpdateOperation.upsert_points(batch))
            self._lease.mark_dirty(name)

    def doc_states(self, doc_ids: Iterable[str], generation: str | None = None) -> dict[str, DocState]:
        wanted = sorted(set(doc_ids))
        if not wanted:
            return {}
        groups: DocStateGroups = {}
        with self._open(generation) as (_, _, shard):
            offset = None
            while True:
                records, offset = shard.scroll(
                    ScrollRequest(
                        offset=offset, limit=_SCAN_BATCH, filter=_doc_filter(wanted), with_payload=_STATE_FIELDS
                    )
                )
                for r in records:
                    add_doc_state(groups, r.payload or {})
                if offset is None:
                    break
        return doc_states_from(groups)

    def delete_stale(self, doc_id: str, keep_doc_hash: str, keep_chunks: int, generation: str | None = None) -> None:
        if keep_chunks < 0:
            raise ConfigError(f"keep_chunks must be >= 0, got {keep_chunks}")
        stale = Filter(
            must=[FieldCondition(key="doc_id", match=MatchValue(doc_id))],
            should=[
                Filter(must_not=[FieldCondition(key="doc_hash", match=MatchValue(keep_doc_hash))]),
                FieldCondition(key="chunk_index", range=RangeFloat(gte=float(keep_chunks))),
            ],
        )
        with self._open(generation) as (name, _, shard):
            shard.update(UpdateOperation.delete_points_by_filter(stale))
            self._lease.mark_dirty(name)

    def delete_documents(self, doc_ids: Iterable[str], generation: str | None = None) -> int:
        wanted = sorted(set(doc_ids))
        if not wanted:
            return 0
        with self._open(generation) as (name, _, shard):
            flt = _doc_filter(wanted)
            removed = shard.count(CountRequest(exact=True, filter=flt))
            if removed:
                shard.update(UpdateOperation.delete_points_by_filter(flt))
                self._lease.mark_dirty(name)
        return removed

    def count(self, generation: str | None = None) -> int:
        with self._open(generation) as (_, _, shard):
            return shard.count(CountRequest(exact=True))

    def ids(self, generation: str | None = None) -> set[str]:
        found: set[str] = set()
        for records in self._scan(_SCAN_BATCH, generation, with_payload=False):
            found.update(str(r.id) for r in records)
        return found

    def scroll(self, batch_size: int = 256, generation: str | None = None) -> Iterator[list[Passage]]:
        """Batches in point-id order; the lease is held per batch, never while the caller works."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        for records in self._scan(batch_size, generation, with_payload=True):
            yield [Passage.from_payload(r.payload or {}) for r in records]

    def _scan(self, batch_size: int, generation: str | None, with_payload: bool) -> Iterator[list[Any]]:
        with self._open(generation) as (name, _, _):
            pass  # pin the generation now: a concurrent activate must not switch it mid-scan
        offset = None
        while True:
            with self._open(name) as (_, _, shard):
                records, offset = shard.scroll(
                    ScrollRequest(offset=offset, limit=batch_size, with_payload=with_payload, with_vector=False)
                )
            if records:
                yield records
            if offset is None:
                return

    def search(self, request: SearchRequest, generation: str | None = None) -> list[Hit]:
        with self._open(generation) as (name, spec, shard):
            validate_request(self.alias, name, spec, request)
            scored = self._search(shard, spec, request)
        return [Hit(passage=Passage.from_payload(payload), score=score, id=pid) for pid, score, payload in scored]

    def _search(self, shard: EdgeShard, spec: CollectionSpec, request: SearchRequest) -> list[Scored]:
        flt = _edge_filter(request.filters)
        dense = Query.Nearest([float(x) for x in request.dense], using=DENSE) if request.dense is not None else None
        sparse = None
        if request.sparse is not None and request.sparse.indices and request.mode != "dense":
            sparse = Query.Nearest(_edge_sparse(request.sparse), using=SPARSE)

        if request.mode == "dense":
            return _scored(shard.query(QueryRequest(limit=request.k, query=dense, filter=flt, with_payload=True)))
        if request.mode == "sparse":
            if sparse is None:  # only stopwords: nothing can match
                return []
            return _scored(shard.query(QueryRequest(limit=request.k, query=sparse, filter=flt, with_payload=True)))

        depth = max(request.candidates, request.k)
        branches = [q for q in (dense, sparse) if q is not None]
        if request.fusion == "rrf":
            prefetches = [Prefetch(limit=depth, query=q, filter=flt) for q in branches]
            return _scored(
                shard.query(
                    QueryRequest(
                        limit=request.k,
                        prefetches=prefetches,
                        query=Fusion.Rrf(k=request.rrf_k),  # type: ignore[arg-type]  # the stub omits Fusion.Rrf
                        with_payload=True,
                    )
                )
            )
        results = shard.query_batch(
            QueryBatchRequest([QueryRequest(limit=depth, query=q, filter=flt, with_payload=True) for q in branches])
        )
        dense_hits = _scored(results[0])
        sparse_hits = _scored(results[1]) if len(results) > 1 else []
        return linear_fusion(
            dense_hits, sparse_hits, request.linear_weight, request.k, dense_higher_is_better=spec.distance != "euclid"
        )

    def close(self) -> None:
        """Flush, close the shards and release the lock now (other stores of this directory reopen on use)."""
        self._lease.release()

    def __enter__(self) -> EdgeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _scored(points: Iterable[Any]) -> list[Scored]:
    return [(str(p.id), float(p.score), dict(p.payload or {})) for p in points]


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
