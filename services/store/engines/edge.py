"""``EdgeEngine``: the embedded default, qdrant-edge-py (Qdrant's Rust engine in-process) under the store front end.

On disk, for collection (alias) ``A`` under ``settings.store_dir``::

    A/.lock                              flock target; holds "pid host since" of the last owner
    A/CURRENT                            name of the active generation, replaced atomically (the "alias")
    A/generations/A__g0001/spec.json     CollectionSpec.to_json()
    A/generations/A__g0001/shard/        one EdgeShard (WAL, segments, payload indexes)

Every call runs under the directory's ``ShardLease`` (``services/store/lease.py``: one process at a time, shards
opened lazily and released when idle). The pointer and the spec files are written atomically, so ``version()``
and ``read_pointer()`` read them without the lease.

HNSW graphs are built only by ``optimize()``; before that searches are an exact scan (fine below ~100k points).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Hashable, Iterator, Sequence
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
from services.store.common import AtLeast, Match, Scored, Where, build_filter, missing_generation
from services.store.lease import ShardLease, lease_for
from services.store.points import DENSE, INDEXED_KEYWORDS, SPARSE, CollectionSpec, SparseVector
from services.store.protocol import Branch, PointRecord, Record, Vector

if TYPE_CHECKING:
    from services.settings import Settings

log = logging.getLogger(__name__)

_DISTANCES = {"cosine": Distance.Cosine, "dot": Distance.Dot, "euclid": Distance.Euclid}


class EdgeEngine:
    """``Engine`` over qdrant-edge shard directories under ``store_dir/alias``."""

    backend = "edge"
    upsert_batch = 512

    def __init__(self, store_dir: Path | str, alias: str, *, lock_timeout: float = 120.0, idle_release: float = 0.5):
        if lock_timeout <= 0:
            raise ConfigError(f"edge lock_timeout must be positive, got {lock_timeout}")
        self.alias = alias
        self.root = Path(store_dir) / alias
        self.lock_timeout = lock_timeout
        self.idle_release = idle_release
        self._lease = lease_for(self.root)

    @classmethod
    def from_settings(cls, settings: Settings) -> EdgeEngine:
        return cls(
            settings.store_dir,
            settings.collection,
            lock_timeout=settings.edge.lock_timeout,
            idle_release=settings.edge.idle_release,
        )

    def __repr__(self) -> str:
        return f"EdgeEngine({str(self.root)!r})"

    # -- paths and the lease -------------------------------------------------------------------------------
    @property
    def _generations_dir(self) -> Path:
        return self.root / "generations"

    def _spec_path(self, generation: str) -> Path:
        return self._generations_dir / generation / "spec.json"

    def _shard(self, generation: str) -> EdgeShard:
        return self._lease.shard(generation, self._generations_dir / generation / "shard")

    @contextlib.contextmanager
    def session(self, create: bool = False) -> Iterator[ShardLease | None]:
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            yield None  # no collection: nothing to lock, and nothing is created by looking
            return
        with self._lease.held(self.lock_timeout, self.idle_release) as lease:
            yield lease

    # -- pointer and generations ---------------------------------------------------------------------------
    def version(self) -> Hashable:
        name = self.read_pointer()
        if name is None:
            return None
        try:
            stat = self._spec_path(name).stat()
        except OSError:
            return (name, None)
        return (name, stat.st_ino, stat.st_mtime_ns, stat.st_size)

    def read_pointer(self) -> str | None:
        try:
            return (self.root / "CURRENT").read_text(encoding="utf-8").strip() or None
        except FileNotFoundError:
            return None

    def write_pointer(self, generation: str, previous: str | None) -> None:
        _write_atomic(self.root / "CURRENT", generation + "\n")

    def generations(self) -> list[str]:
        if not self._generations_dir.is_dir():
            return []
        return [e.name for e in self._generations_dir.iterdir() if (e / "spec.json").is_file()]

    def read_spec(self, generation: str) -> CollectionSpec:
        try:
            data = json.loads(self._spec_path(generation).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise missing_generation(self.alias, generation) from None
        return CollectionSpec.from_json(data)

    def write_spec(self, generation: str, spec: CollectionSpec) -> None:
        _write_atomic(self._spec_path(generation), json.dumps(spec.to_json(), indent=2, sort_keys=True))

    def create(self, generation: str, spec: CollectionSpec) -> bool:
        try:
            (self._generations_dir / generation).mkdir(parents=True)
        except FileExistsError:
            return False  # a generation, or a half-made one a crash left behind
        shard = EdgeShard.create(str(self._generations_dir / generation / "shard"), _edge_config(spec))
        self._lease.adopt(generation, shard)
        for key in INDEXED_KEYWORDS:
            shard.update(UpdateOperation.create_field_index(key, PayloadSchemaType.Keyword))
        shard.update(UpdateOperation.create_field_index("chunk_index", PayloadSchemaType.Integer))
        shard.flush()
        self.write_spec(generation, spec)  # last: a generation without its spec is not complete
        return True

    def drop(self, generation: str) -> bool:
        if not (self._generations_dir / generation).is_dir():
            return False
        self._lease.forget(generation)
        # rename first so that a crash mid-delete never leaves a half generation that looks complete
        trash = self._generations_dir / f".{generation}.dropping.{os.getpid()}"
        os.replace(self._generations_dir / generation, trash)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def optimize(self, generation: str) -> bool:
        shard = self._shard(generation)
        changed = shard.optimize()
        shard.flush()
        return bool(changed)

    # -- points ----------------------------------------------------------------------------------------------
    def upsert(self, generation: str, points: Sequence[PointRecord]) -> None:
        batch = [Point(pid, {n: _vector(v) for n, v in vectors.items()}, payload) for pid, vectors, payload in points]
        self._shard(generation).update(UpdateOperation.upsert_points(batch))
        self._lease.mark_dirty(generation)

    def delete(self, generation: str, where: Where) -> None:
        self._shard(generation).update(UpdateOperation.delete_points_by_filter(_where(where)))
        self._lease.mark_dirty(generation)

    def count(self, generation: str, where: Where | None = None) -> int:
        return self._shard(generation).count(CountRequest(exact=True, filter=_filter(where)))

    def scroll(
        self, generation: str, limit: int, offset: Any, where: Where | None = None, fields: Sequence[str] | bool = True
    ) -> tuple[list[Record], Any]:
        request = ScrollRequest(
            offset=offset, limit=limit, filter=_filter(where), with_payload=_fields(fields), with_vector=False
        )
        records, offset = self._shard(generation).scroll(request)
        return [(str(r.id), dict(r.payload or {})) for r in records], offset

    def query(self, generation: str, branch: Branch, limit: int, where: Where | None) -> list[Scored]:
        return _scored(self._shard(generation).query(_request(branch, limit, where)))

    def query_batch(
        self, generation: str, branches: Sequence[Branch], limit: int, where: Where | None
    ) -> list[list[Scored]]:
        requests = [_request(b, limit, where) for b in branches]
        return [_scored(r) for r in self._shard(generation).query_batch(QueryBatchRequest(requests))]

    def query_rrf(
        self, generation: str, branches: Sequence[Branch], limit: int, depth: int, rrf_k: int, where: Where | None
    ) -> list[Scored]:
        flt = _filter(where)
        prefetches = [Prefetch(limit=depth, query=_nearest(b), filter=flt) for b in branches]
        rrf = Fusion.Rrf(k=rrf_k)  # type: ignore[arg-type]  # the stub omits Fusion.Rrf
        request = QueryRequest(limit=limit, prefetches=prefetches, query=rrf, with_payload=True)  # type: ignore[arg-type]
        return _scored(self._shard(generation).query(request))

    def close(self) -> None:
        """Flush, close the shards and release the lock now (other engines of this directory reopen on use)."""
        self._lease.release()


# --------------------------------------------------------------------------------------------------------------
# converters: neutral records -> qdrant-edge
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


def _filter(where: Where | None) -> Filter | None:
    return None if where is None else _where(where)


def _where(where: Where) -> Filter:
    return build_filter(where, Filter, _field)  # type: ignore[no-any-return]


def _field(condition: Match | AtLeast) -> FieldCondition:
    if isinstance(condition, AtLeast):
        return FieldCondition(key=condition.key, range=RangeFloat(gte=float(condition.value)))
    match = MatchAny(condition.any_values()) if condition.any_of else MatchValue(condition.values[0])
    return FieldCondition(key=condition.key, match=match)


def _vector(vector: Vector) -> Any:
    if isinstance(vector, SparseVector):
        return EdgeSparseVector(indices=list(vector.indices), values=list(vector.values))
    return vector


def _nearest(branch: Branch) -> Query:
    name, vector = branch
    return Query.Nearest(_vector(vector), using=name)


def _request(branch: Branch, limit: int, where: Where | None) -> QueryRequest:
    return QueryRequest(limit=limit, query=_nearest(branch), filter=_filter(where), with_payload=True)


def _fields(fields: Sequence[str] | bool) -> Any:
    return fields if isinstance(fields, bool) else list(fields)


def _scored(points: Sequence[Any]) -> list[Scored]:
    return [(str(p.id), float(p.score), dict(p.payload or {})) for p in points]
