"""``EdgeEngine``: the embedded default, qdrant-edge-py (Qdrant's Rust engine in-process) under the store front end.

On disk, for collection (alias) ``A`` under ``settings.store_dir``::

    A/.lock                              the directory's lock: making, dropping, restoring generations
    A/CURRENT                            name of the active generation, replaced atomically (the "alias")
    A/locks/A__g0001.lock                the generation's lock; holds "pid host since" of the last owner
    A/generations/A__g0001/spec.json     CollectionSpec.to_json()
    A/generations/A__g0001/shard/        one EdgeShard (WAL, segments, payload indexes)

Every call runs under the directory's ``ShardLease`` (``services/store/edge/lease.py``): each generation a call touches
is locked for one process at a time, its shard opened lazily and released when idle, so a process reading one
generation and another writing the next do not take turns. The pointer and the spec files are written
atomically, so ``version()`` and ``read_pointer()`` read them without the lease.

HNSW graphs are built only by ``optimize()``, on a copy in a child process, the lease held only to copy and to
swap (``index.py``, which only a build loads); writes made meanwhile are journaled and replayed onto the copy
(``journal.py``); segments below ``index_threshold`` points stay an exact scan; ``needs_index``: that many points
arrived since the last build. Beside it: ``snapshots.py``, ``config.py`` (config, levers, a generation's records),
``generations.py`` (making and dropping a generation), ``read_copy.py`` (a generation read whole from a copy).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Hashable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdrant_edge import (
    CountRequest,
    EdgeShard,
    Fusion,
    Prefetch,
    QueryBatchRequest,
    QueryRequest,
    ScrollRequest,
    SearchParams,
)

from services.core import datadir
from services.core.errors import ConfigError
from services.core.fsutil import write_atomic
from services.core.store_settings import EdgeSettings
from services.store.common import Scored, Where, missing_generation, scored
from services.store.edge.config import (  # converters
    BUDGETED,
    SHARD,
    EdgeLevers,
    delete_operation,
    indexed_points,
    levers_from,
    levers_of,
    machine_budget_mb,
    nearest,
    payload_fields,
    placement,
    query_request,
    recover_swap,
    search_params_from,
    to_filter,
    upsert_operation,
)
from services.store.edge.lease import ShardLease, lease_for
from services.store.edge.search import DenseSearch
from services.store.points import CollectionSpec, point_records
from services.store.protocol import Branch, PointRecord, Record

if TYPE_CHECKING:
    from services.core.settings import Settings

_DEFAULTS = EdgeSettings()  # an engine built by hand (tests, scripts) gets what the settings declare


class EdgeEngine:
    """``Engine`` over qdrant-edge shard directories under ``store_dir/alias``."""

    backend = "edge"
    upsert_batch = 512

    def __init__(
        self,
        store_dir: Path | str,
        alias: str,
        *,
        lock_timeout: float = _DEFAULTS.lock_timeout,
        idle_release: float = _DEFAULTS.idle_release,
        index_threshold: int = _DEFAULTS.index_threshold,
        min_free_mb: int = 0,
        data_dir: Path | None = None,
        levers: EdgeLevers | None = None,
        search_params: SearchParams | None = None,
        fused_search_params: SearchParams | None = None,
        recall_target: float = _DEFAULTS.recall_target,
        memory_budget_mb: int | None = None,
        fixed_levers: Collection[str] = (),
    ):
        """``min_free_mb``: writes stop with ``DiskFull`` below it (``services.core.diskspace``); ``data_dir``: the data
        dir whose FORMAT is stamped on the first write (``services.core.datadir``); engines built by hand skip both.
        ``levers``: how new generations store vectors and payloads; ``search_params``: every dense search's
        (``hnsw_ef``, quantization rescore / oversampling), ``fused_search_params`` the dense branch's of a hybrid
        query (``hybrid_ef``; unset: ``search_params``); all from ``settings.edge`` (``levers_from``,
        ``search_params_from``). Where they name no ef, the ef each build calibrated for ``recall_target`` serves
        (``services.store.calibrate``). ``memory_budget_mb``: the levers not in ``fixed_levers`` (those the user
        set) are the budget's choice (``budget_levers``) at creation and at each index build; None: ``levers``."""
        if lock_timeout <= 0:
            raise ConfigError(f"edge lock_timeout must be positive, got {lock_timeout}")
        if index_threshold < 1:
            raise ConfigError(f"edge index_threshold must be at least 1 point, got {index_threshold}")
        self.index_threshold = index_threshold
        self.alias = alias
        self.root = Path(store_dir) / alias
        self.lock_timeout = lock_timeout
        self.idle_release = idle_release
        self.lease = lease_for(self.root)
        self.min_free_mb = min_free_mb
        self.data_dir = data_dir
        self.levers = levers or EdgeLevers()
        self.recall_target = recall_target
        self.dense = DenseSearch(self.generations_dir, search_params, fused_search_params, recall_target)
        self.memory_budget_mb, self.fixed_levers = memory_budget_mb, list(fixed_levers)

    @classmethod
    def from_settings(cls, settings: Settings) -> EdgeEngine:
        datadir.check(settings.data_dir)  # a newer (or unmigrated) layout is refused before anything is read
        return cls(
            settings.store_dir,
            settings.collection,
            lock_timeout=settings.edge.lock_timeout,
            idle_release=settings.edge.idle_release,
            index_threshold=settings.edge.index_threshold,
            min_free_mb=settings.min_free_mb,
            data_dir=settings.data_dir,
            levers=levers_from(settings.edge),
            search_params=search_params_from(settings.edge),
            fused_search_params=search_params_from(settings.edge, fused=True),
            recall_target=settings.edge.recall_target,
            memory_budget_mb=settings.edge.memory_budget_mb or machine_budget_mb(),
            fixed_levers=[k for k in BUDGETED if k in settings.edge.model_fields_set],
        )

    def __repr__(self) -> str:
        return f"EdgeEngine({str(self.root)!r})"

    # -- paths and the lease -------------------------------------------------------------------------------
    @property
    def generations_dir(self) -> Path:
        """One folder per generation (its shard, spec and index record); the index build and snapshots work
        there too (``index.py``, ``snapshots.py``)."""
        return self.root / "generations"

    def _spec_path(self, generation: str) -> Path:
        return self.generations_dir / generation / "spec.json"

    def shard(self, generation: str, write: bool = False) -> EdgeShard:
        """The generation's open shard, under this process's lease (``self.lease``: one process per shard);
        ``write``: to write into (reads may use a shard kept open after the lease was handed on)."""
        gen_dir = self.generations_dir / generation
        return self.lease.shard(generation, gen_dir / SHARD, lambda: recover_swap(gen_dir), write)

    @contextlib.contextmanager
    def session(self, create: bool = False) -> Iterator[ShardLease | None]:
        if create:
            if self.data_dir is not None:
                datadir.ensure_writable(self.data_dir)
            self.root.mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            yield None  # no collection: nothing to lock, and nothing is created by looking
            return
        # creating may make the first generation and point at it: one process at a time (the directory's lock)
        with (self.lease.held(self.lock_timeout, self.idle_release) as lease,
              lease.structure() if create else contextlib.nullcontext()):
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
        write_atomic(self.root / "CURRENT", generation + "\n")

    def generations(self) -> list[str]:
        if not self.generations_dir.is_dir():
            return []
        return [e.name for e in self.generations_dir.iterdir() if (e / "spec.json").is_file()]

    def read_spec(self, generation: str) -> CollectionSpec:
        if self.lease.in_use_here() and (self.generations_dir / generation).is_dir():
            self.lease.claim(generation)  # in a session: read under the generation's lock (read-modify-write)
        try:
            data = json.loads(self._spec_path(generation).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise missing_generation(self.alias, generation) from None
        return CollectionSpec.from_json(data)

    def write_spec(self, generation: str, spec: CollectionSpec) -> None:
        with self.session():
            self.lease.claim(generation)
            write_atomic(self._spec_path(generation), json.dumps(spec.to_json(), indent=2, sort_keys=True))

    def create(self, generation: str, spec: CollectionSpec) -> bool:
        from services.store.edge import generations  # writers only: `dpr query` never makes one

        return generations.create(self, generation, spec)

    def drop(self, generation: str) -> bool:
        from services.store.edge import generations

        return generations.drop(self, generation)

    def optimize(self, generation: str) -> bool:
        """Build HNSW for segments above ``index_threshold`` points (and vacuum), holding the lease only to copy
        the shard and to swap the built copy in (``edge_index.optimize``, the writes made meanwhile replayed onto
        it); False if nothing changed, another process is building, or the journal could not be trusted (the copy
        is then dropped). With a memory budget, the levers the user did not set are chosen again first for the points
        there are now (``levers.json``), and the build's reload applies them to what it builds (the build's child
        counts its copy: a count here would load the shard and take it from the process answering from it)."""
        from services.store.edge import index as edge_index  # builders only: `dpr query` never loads the build

        return edge_index.optimize(self, generation)

    def memory(self, generation: str) -> dict[str, Any]:
        """Where the generation's dense vectors live and why (`dpr status`): the budget's choice at its creation or
        last build, or the levers it was created with."""
        recorded = levers_of(self.generations_dir / generation)
        return recorded.get("memory") or {"choice": placement(EdgeLevers.from_json(recorded)),
                                          "reason": "the levers it was created with (no memory budget)"}

    def needs_index(self, generation: str, points: int | None = None) -> bool:
        """``index_threshold`` points or more arrived since the last build (or ever, if never built)."""
        if points is None:
            points = self.shard(generation).info().points_count
        return points - indexed_points(self.generations_dir / generation) >= self.index_threshold

    def index_info(self, generation: str) -> dict[str, Any]:
        from services.store.edge.index import segment_kinds

        points = self.shard(generation).info().points_count  # first: the segments are read under its lock
        kinds = segment_kinds(self.generations_dir / generation / SHARD)
        return {
            "points": points,
            "segments": len(kinds),
            "hnsw_segments": kinds.count("hnsw"),
            "index_threshold": self.index_threshold,
            "indexed_points": indexed_points(self.generations_dir / generation),
            "calibration": self.dense.calibration(generation),
        }

    def search_ef(self, generation: str) -> dict[str, Any]:
        """What `dpr status` says of the generation's search ef (``DenseSearch.describe``), read without the shard."""
        return self.dense.describe(generation, self.index_threshold)

    # -- points ----------------------------------------------------------------------------------------------
    def upsert(self, generation: str, points: Sequence[PointRecord]) -> None:
        with self.writing(f"writing {len(points)} points"):
            self.shard(generation, write=True).update(upsert_operation(points))
        self.lease.mark_dirty(generation)
        self._journal(generation, "upsert", points)

    def _journal(self, generation: str, operation: str, argument: Any) -> None:
        """After the shard took a write: journal it if an index build runs (it replays the write onto its copy)."""
        from services.store.edge import journal as edge_journal  # writers only: `dpr query` never loads it

        edge_journal.record(self.generations_dir / generation, operation, argument)

    @contextlib.contextmanager
    def writing(self, what: str) -> Iterator[None]:
        """Stop below ``min_free_mb`` before a write through the maps (a full disk would SIGBUS); ENOSPC -> DiskFull."""
        from services.core import diskspace  # loaded by writers only

        with diskspace.translate(self.root, what):
            diskspace.require(self.root, self.min_free_mb, f"{what} into the embedded store {self.root}")
            yield

    def delete(self, generation: str, where: Where) -> None:
        self.shard(generation, write=True).update(delete_operation(where))
        self.lease.mark_dirty(generation)
        self._journal(generation, "delete", where)

    def count(self, generation: str, where: Where | None = None) -> int:
        return self.shard(generation).count(CountRequest(exact=True, filter=to_filter(where)))

    def count_if_free(self, generation: str) -> int | None:
        with self.session():
            if not self.lease.claim(generation, wait=False, sole=True):
                return None  # another process holds it or has it open (workers writing a re-embed's target)
            return self.count(generation)

    def scroll(self, generation: str, limit: int, offset: Any, where: Where | None = None,
               fields: Sequence[str] | bool = True) -> tuple[list[Record], Any]:
        request = ScrollRequest(
            offset=offset, limit=limit, filter=to_filter(where), with_payload=payload_fields(fields), with_vector=False
        )
        records, offset = self.shard(generation).scroll(request)
        return [(str(r.id), dict(r.payload or {})) for r in records], offset

    def copy_pages(self, generation: str, limit: int) -> Iterator[list[Record]]:
        """Every point's payload, ``limit`` a page, read from a copy of the generation's shard, so that its holder
        (``dpr serve`` answering from it) keeps it (``read_copy.py``)."""
        from services.store.edge.read_copy import copy_pages  # off the query path: a reader's copy

        return copy_pages(self, generation, limit)

    def query(self, generation: str, branch: Branch, limit: int, where: Where | None) -> list[Scored]:
        request = query_request(branch, limit, where, params=self.dense.params(generation, branch))
        return scored(self.shard(generation).query(request))

    def query_batch(
        self, generation: str, branches: Sequence[Branch], limit: int, where: Where | None, with_payload: bool = True
    ) -> list[list[Scored]]:
        requests = [query_request(b, limit, where, with_payload, self.dense.params(generation, b, fused=True))
                    for b in branches]
        return [scored(r) for r in self.shard(generation).query_batch(QueryBatchRequest(requests))]

    def payloads(self, generation: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        records = self.shard(generation).retrieve(list(ids), with_payload=True, with_vector=False)
        return {str(r.id): dict(r.payload or {}) for r in records}

    def points(self, generation: str, ids: Sequence[str]) -> list[PointRecord]:
        """Whole points (named vectors and payload) for the ``ids`` that exist (BM25 re-weighting reads them)."""
        records = self.shard(generation).retrieve(list(ids), with_payload=True, with_vector=True)
        return point_records(records)

    def query_rrf(
        self, generation: str, branches: Sequence[Branch], limit: int, depth: int, rrf_k: int, where: Where | None
    ) -> list[Scored]:
        flt = to_filter(where)
        prefetches = [
            Prefetch(limit=depth, query=nearest(b), filter=flt, params=self.dense.params(generation, b, fused=True))
            for b in branches
        ]
        rrf = Fusion.Rrf(k=rrf_k)  # type: ignore[arg-type]  # the stub omits Fusion.Rrf
        request = QueryRequest(limit=limit, prefetches=prefetches, query=rrf, with_payload=True)  # type: ignore[arg-type]
        return scored(self.shard(generation).query(request))

    def serves(self, generation: str) -> bool:
        """This process has ``generation``'s shard open (the owner answers other processes' calls only for those)."""
        return self.lease.opened(generation) is not None

    def close(self) -> None:
        """Flush, close the shards and release the lock now (other engines of this directory reopen on use)."""
        self.lease.release()
