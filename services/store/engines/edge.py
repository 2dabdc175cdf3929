"""``EdgeStore``: the embedded default, over qdrant-edge-py (Qdrant's Rust engine in-process).

On disk, for collection (alias) ``A`` under ``settings.store_dir``::

    A/.lock                              flock target; holds "pid host since" of the last owner
    A/CURRENT                            name of the active generation, replaced atomically
    A/generations/A__g0001/spec.json     CollectionSpec.to_json()
    A/generations/A__g0001/shard/        one EdgeShard (WAL, segments, payload indexes)

Ownership across processes: qdrant-edge lets one process open a shard directory (a second ``load`` fails on
the WAL lock). So every call goes through a *lease*: an exclusive ``fcntl.flock`` on ``A/.lock`` (waiting up
to ``edge.lock_timeout`` seconds, then ``StoreUnavailable``), shards loaded lazily while it is held, and kept
open for ``edge.idle_release`` seconds after the last call so that a busy process does not reopen per call.
A timer thread then flushes, closes and unlocks, and the next process gets its turn. A process that keeps the
lease busy for longer than its fair share yields at the end of the current call when another process is
waiting (waiters touch ``A/.lock.wait``). In one process all ``EdgeStore`` objects of a directory share one
lease, and a re-entrant mutex serialises threads.

HNSW graphs are built only by ``optimize()``; before that searches are an exact scan (fine below ~100k points).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import shutil
import socket
import threading
import time
import weakref
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

from services.errors import ConfigError, StoreUnavailable
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
_POLL_MIN, _POLL_MAX = 0.005, 0.05  # seconds between flock attempts while waiting
_MIN_FAIR_SHARE = 0.25  # seconds a busy holder keeps the lease before yielding to a waiter
_HANDOFF_WINDOW = 2.0  # seconds a holder that yielded waits for the waiter to take the lock


# --------------------------------------------------------------------------------------------------------------
# the lease: file lock + open shards + idle release
# --------------------------------------------------------------------------------------------------------------


class _Lease:
    """This process's exclusive ownership of one collection directory. Thread-safe; one per directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock_path = root / ".lock"
        self.wait_path = root / ".lock.wait"
        self._mutex = threading.RLock()
        self._fd: int | None = None
        self._shards: dict[str, EdgeShard] = {}
        self._dirty: set[str] = set()
        self._depth = 0
        self._acquired_at = 0.0  # monotonic
        self._acquired_wall = 0.0  # wall clock, comparable with the wait file's mtime
        self._timer: threading.Timer | None = None  # one idle timer at a time, re-armed lazily
        self._last_used = 0.0
        self._idle_release = 0.0
        self._yield_until = 0.0

    # -- public -------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def held(self, lock_timeout: float, idle_release: float) -> Iterator[_Lease]:
        with self._mutex:
            if self._fd is None:
                self._acquire(lock_timeout)
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._after_use(idle_release)

    def shard(self, generation: str, path: Path) -> EdgeShard:
        """The open shard of ``generation`` (loading it if needed). Only while ``held``."""
        shard = self._shards.get(generation)
        if shard is None:
            started = time.monotonic()
            try:
                shard = EdgeShard.load(str(path))
            except Exception as e:  # the engine raises plain Exception
                raise StoreUnavailable(
                    f"cannot open the embedded shard {path}: {e}; another program may hold it outside the "
                    f"{self.lock_path} lock"
                ) from e
            log.debug("loaded shard", extra={"generation": generation, "ms": (time.monotonic() - started) * 1e3})
            self._shards[generation] = shard
        return shard

    def adopt(self, generation: str, shard: EdgeShard) -> None:
        self._shards[generation] = shard

    def mark_dirty(self, generation: str) -> None:
        self._dirty.add(generation)

    def forget(self, generation: str) -> None:
        """Flush and close one generation's shard (before deleting its directory)."""
        shard = self._shards.pop(generation, None)
        if shard is not None:
            self._close_shard(generation, shard)

    def release(self) -> None:
        """Flush, close every shard and unlock, now."""
        with self._mutex:
            self._cancel_timer()
            self._release_locked()

    def release_before_fork(self) -> None:
        """In the parent, just before ``os.fork()``: hand everything back so the child inherits nothing.

        Skipped when a call is in flight (the child then closes what it inherited, see ``reset_after_fork``).
        """
        if not self._mutex.acquire(timeout=5):
            return
        try:
            if self._depth == 0:
                self._release_locked()
        finally:
            self._mutex.release()

    def reset_after_fork(self) -> None:
        """In a forked child: the parent's lock and shards are not ours.

        The shard objects are never used or dropped here; their inherited descriptors (the WAL lock among
        them) and ours are closed, otherwise the child would keep the parent's locks alive and neither could
        reopen the shard. Closing a duplicate does not release the parent's own locks.
        """
        self._mutex = threading.RLock()
        _ORPHANED.extend(self._shards.values())
        self._fd, self._shards, self._dirty, self._depth, self._timer = None, {}, set(), 0, None
        _close_inherited_descriptors(self.root)

    # -- internals ----------------------------------------------------------------------------------------
    def _acquire(self, lock_timeout: float) -> None:
        # We just yielded to a waiter: let it take its turn first. It records its pid in the lock file when it
        # gets the lock; until then (or until the hand-off window closes, if it gave up) we stay out of its way.
        # A fixed pause was not enough on a loaded machine: the waiter was not scheduled in time and the busy
        # holder took the lock straight back, again and again.
        mine = f"pid {os.getpid()} "
        while time.monotonic() < self._yield_until and self._holder().startswith(mine):
            time.sleep(_POLL_MIN)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + lock_timeout
        delay = _POLL_MIN
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise StoreUnavailable(
                            f"the embedded store {self.root} is busy: another process ({self._holder()}) has held "
                            f"{self.lock_path} for more than {lock_timeout:g} s; retry later, raise "
                            "DPR_EDGE__LOCK_TIMEOUT, or run a Qdrant server (DPR_QDRANT_URL) for concurrent access"
                        ) from None
                    self._signal_waiting()
                    time.sleep(min(delay, remaining))
                    delay = min(delay * 2, _POLL_MAX)
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} host {socket.gethostname()} since {time.time():.3f}\n".encode(), 0)
        self._fd = fd
        self._acquired_at = time.monotonic()
        self._acquired_wall = time.time()
        log.debug("edge lock acquired", extra={"lock": str(self.lock_path)})

    def _holder(self) -> str:
        try:
            text = self.lock_path.read_text().strip()
        except OSError:
            text = ""
        return text or "holder unknown"

    def _signal_waiting(self) -> None:
        with contextlib.suppress(OSError):
            self.wait_path.touch()

    def _someone_waiting(self) -> bool:
        try:
            return self.wait_path.stat().st_mtime >= self._acquired_wall
        except OSError:
            return False

    def _after_use(self, idle_release: float) -> None:
        self._last_used = time.monotonic()
        self._idle_release = idle_release
        if idle_release <= 0:
            self._release_locked()
        elif self._last_used - self._acquired_at > max(idle_release, _MIN_FAIR_SHARE) and self._someone_waiting():
            log.debug("yielding the edge lock to a waiting process", extra={"lock": str(self.lock_path)})
            self._release_locked()
            self._yield_until = time.monotonic() + _HANDOFF_WINDOW
        elif self._timer is None:
            self._start_timer(idle_release)

    def _start_timer(self, delay: float) -> None:
        timer = threading.Timer(delay, self._idle_expired)
        timer.daemon = True
        self._timer = timer
        timer.start()

    def _idle_expired(self) -> None:
        """Release once the lease has been idle for ``idle_release``; a busy lease re-arms the timer."""
        with self._mutex:
            if self._timer is not threading.current_thread():
                return
            self._timer = None
            if self._fd is None or self._depth > 0:
                return  # released already, or in use: the end of that use re-arms the timer
            remaining = self._last_used + self._idle_release - time.monotonic()
            if remaining > 0:
                self._start_timer(remaining)
            else:
                self._release_locked()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _close_shard(self, generation: str, shard: EdgeShard) -> None:
        try:
            if generation in self._dirty:
                shard.flush()
        finally:
            self._dirty.discard(generation)
            shard.close()

    def _release_locked(self) -> None:
        self._cancel_timer()
        shards, self._shards = self._shards, {}
        try:
            for generation, shard in shards.items():
                try:
                    self._close_shard(generation, shard)
                except Exception:
                    log.exception("closing an edge shard failed", extra={"generation": generation})
        finally:
            self._dirty.clear()
            if self._fd is not None:
                fd, self._fd = self._fd, None
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                log.debug("edge lock released", extra={"lock": str(self.lock_path)})


_LEASES: dict[Path, _Lease] = {}
_LEASES_GUARD = threading.Lock()
_LIVE: weakref.WeakSet[_Lease] = weakref.WeakSet()
_ORPHANED: list[EdgeShard] = []


def _lease_for(root: Path) -> _Lease:
    key = root.resolve()
    with _LEASES_GUARD:
        lease = _LEASES.get(key)
        if lease is None:
            lease = _LEASES[key] = _Lease(root)
            _LIVE.add(lease)
        return lease


def _release_all() -> None:
    for lease in list(_LIVE):
        try:
            lease.release()
        except Exception:
            log.exception("releasing the edge lock at exit failed", extra={"lock": str(lease.lock_path)})


def _close_inherited_descriptors(root: Path) -> None:
    """Close every descriptor of this process that points inside ``root`` (Linux: /proc/self/fd)."""
    prefix = str(root.resolve()) + os.sep
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith(prefix):
            with contextlib.suppress(OSError):
                os.close(int(name))


def _before_fork() -> None:
    for lease in list(_LIVE):
        lease.release_before_fork()


def _after_fork_in_child() -> None:
    global _LEASES_GUARD
    _LEASES_GUARD = threading.Lock()
    for lease in list(_LIVE):
        lease.reset_after_fork()


atexit.register(_release_all)
os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


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
        self._lease = _lease_for(self.root)

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
    def _held(self) -> Iterator[_Lease]:
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
