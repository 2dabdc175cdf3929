"""``Store``: the one ``VectorStore``, every store decision made once, over an ``Engine`` (edge or server).

What lives here and nowhere else: generation names and the race-safe choice of the next one, resolving the
collection to its active generation (cached: ``active()``), validation of specs and requests (the rules are in
``common.py``), and the search modes (dense / sparse / hybrid with RRF inside the engine or DPR's linear fusion
here). The write paths by document (upsert batches, per-document state, stale-chunk deletion) are ``documents.py``
and their BM25 bookkeeping (lengths, the stats record, re-weighting) ``bm25_upkeep.py``, both loaded on the first
write: a search needs neither. Every call runs inside one engine ``session()`` so that, on the edge, resolving the
generation and using it happen under one lease.

The ``active()`` cache: one ``ActiveGeneration`` per store, kept with the engine's ``version()`` token (edge:
the CURRENT pointer's content plus the active spec file's stat, no lock needed; server: the alias's target, one
small request) and dropped when this store creates, activates, drops or updates settings. It is re-read when
the token moves (another process swapped the alias) and at least every ``ACTIVE_MAX_AGE`` seconds, the bound on
how long settings another process merged into a server collection stay unseen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from services.core.errors import CollectionNotFound, ConfigError, DprError, StoreUnavailable
from services.store.common import (
    Scored,
    check_at_least_one,
    check_compatible,
    generation_name,
    generation_number,
    linear_fusion,
    missing_collection,
    missing_generation,
    request_filter,
    validate_request,
    validate_spec,
)
from services.store.points import (
    DENSE,
    SPARSE,
    ActiveGeneration,
    CollectionInfo,
    CollectionSpec,
    DocState,
    GenerationInfo,
    Hit,
    Passage,
    PassagePoint,
    SearchRequest,
)
from services.store.protocol import Branch, Engine, pages

if TYPE_CHECKING:
    from services.store.bm25 import Bm25Stats

log = logging.getLogger(__name__)

ACTIVE_MAX_AGE = 5.0  # seconds an unchanged version token keeps the cached active generation
_CREATE_ATTEMPTS = 5
# Store methods that take the engine only for short spans and run long outside it (the edge index build): a wrapper
# that serialises a process's store calls (``services.runtime``) must let them through, or every search would wait.
SELF_LOCKING = frozenset({"optimize", "maybe_optimize"})


@dataclasses.dataclass(frozen=True)
class _Cached:
    token: Hashable
    active: ActiveGeneration | None
    read_at: float  # monotonic


class Store:
    """``VectorStore`` over one ``Engine``; ``open_store(settings)`` builds it, tests hand an engine in."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.backend = engine.backend
        self.alias = engine.alias
        self._cached: _Cached | None = None

    def __repr__(self) -> str:
        return f"Store({self.engine!r})"

    # -- resolution -----------------------------------------------------------------------------------------
    def active(self) -> ActiveGeneration | None:
        token = self.engine.version()
        cached = self._cached
        if cached is not None and cached.token == token and time.monotonic() - cached.read_at < ACTIVE_MAX_AGE:
            return cached.active
        name = self.engine.read_pointer()
        active = None if name is None else ActiveGeneration(name, self.engine.read_spec(name))
        self._cached = _Cached(token, active, time.monotonic())
        return active

    def _forget_active(self) -> None:
        self._cached = None

    def _resolve(self, generation: str | None) -> tuple[str, CollectionSpec]:
        """Name and spec of ``generation`` (the active one by default); inside a session, the spec is read under the
        generation's lock (on the edge), outside as last written."""
        if generation is None:
            active = self.active()
            if active is None:
                raise missing_collection(self.alias, self.backend)
            return active.name, active.spec
        if generation_number(self.alias, generation) is None:  # only this alias's generations (and safe paths)
            raise missing_generation(self.alias, generation)
        cached = self._cached
        if cached is not None and cached.active is not None and cached.active.name == generation:
            return generation, cached.active.spec  # dim, distance, model and sparse never change
        return generation, self.engine.read_spec(generation)

    def _counted_elsewhere(self, generation: str | None) -> int | None:
        """The generation's points as counted by the process serving it (``ServedStore``); None: here."""
        return None

    @contextlib.contextmanager
    def _use(self, generation: str | None) -> Iterator[tuple[str, CollectionSpec]]:
        with self.engine.session():
            yield self._resolve(generation)

    # -- collection and generations -------------------------------------------------------------------------
    def info(self, wait: bool = True, counts: bool = True) -> CollectionInfo:
        active = self.engine.read_pointer()
        names = sorted(self.engine.generations(), key=lambda n: generation_number(self.alias, n) or 0)
        generations = []
        for n in names:  # one generation at a time: the embedded engine then never holds two locks for this
            with contextlib.suppress(CollectionNotFound):  # dropped meanwhile: not listed
                count: int | None
                if not counts:
                    count, spec = None, self.engine.read_spec(n)
                elif wait or n == active:
                    with self.engine.session():
                        spec, count = self.engine.read_spec(n), self.engine.count(n)
                else:  # outside a session the spec is read as last written (atomically), without its lock
                    count = self.engine.count_if_free(n)
                    spec = self.engine.read_spec(n)
                generations.append(GenerationInfo(name=n, spec=spec, count=count, active=n == active))
        active_info = next((g for g in generations if g.active), None)
        return CollectionInfo(alias=self.alias, backend=self.backend, active=active_info, generations=generations)

    def session(self) -> contextlib.AbstractContextManager[object]:
        return self.engine.session()

    def spec(self, generation: str) -> CollectionSpec | None:
        if generation_number(self.alias, generation) is None:
            return None
        with self.engine.session():
            try:
                return self.engine.read_spec(generation)
            except CollectionNotFound:
                return None

    def ensure_collection(self, spec: CollectionSpec) -> str:
        validate_spec(spec)
        with self.engine.session(create=True):
            active = self.active()
            if active is None:
                created = self._create_generation(spec)
                try:
                    self.engine.write_pointer(created, previous=None)
                except DprError:
                    # another process created the collection at the same moment: keep theirs
                    self._forget_active()
                    active = self.active()
                    if active is None or active.name == created:
                        raise
                    self.engine.drop(created)
                else:
                    self._forget_active()
                    log.info("created collection", extra={"alias": self.alias, "generation": created})
                    return created
            check_compatible(self.alias, active.name, active.spec, spec)
            return active.name

    def create_generation(self, spec: CollectionSpec) -> str:
        validate_spec(spec)
        with self.engine.session(create=True):
            name = self._create_generation(spec)
        log.info("created generation", extra={"alias": self.alias, "generation": name})
        return name

    def _create_generation(self, spec: CollectionSpec) -> str:
        number = max((generation_number(self.alias, n) or 0 for n in self.engine.generations()), default=0)
        for _ in range(_CREATE_ATTEMPTS):
            number += 1
            name = generation_name(self.alias, number)
            if self.engine.create(name, spec):  # False: lost a race for this number (or a half-made one)
                self._forget_active()
                return name
        raise StoreUnavailable(f"could not pick a free generation name for {self.alias!r}; retry")

    def activate(self, generation: str) -> None:
        with self.engine.session():
            self._resolve(generation)  # raises if it does not exist or is not ours
            previous = self.engine.read_pointer()
            if previous != generation:
                self.engine.write_pointer(generation, previous)
            self._forget_active()
        log.info("activated generation", extra={"alias": self.alias, "generation": generation, "previous": previous})

    def drop_generation(self, generation: str) -> None:
        with self.engine.session():
            if generation == self.engine.read_pointer():
                raise ConfigError(
                    f"generation {generation!r} is the active generation of {self.alias!r}; activate another "
                    "generation first"
                )
            if generation_number(self.alias, generation) is None or not self.engine.drop(generation):
                raise missing_generation(self.alias, generation)
            self._forget_active()
        log.info("dropped generation", extra={"alias": self.alias, "generation": generation})

    def update_settings(self, settings: dict[str, object], generation: str | None = None) -> None:
        with self._use(generation) as (name, _):
            spec = self.engine.read_spec(name)  # fresh: another process may have merged settings meanwhile
            self.engine.write_spec(name, dataclasses.replace(spec, settings={**spec.settings, **settings}))
            self._forget_active()

    def optimize(self, generation: str | None = None) -> bool:
        name, _ = self._resolve(generation)  # without the lease (pointer and specs are written atomically): a claim
        # here would take the generation from the process answering from it; the build takes it for its short ends
        reweighted = self.bm25_renormalize(name)  # BM25 weights of points whose average length drifted
        changed = self.engine.optimize(name) or reweighted > 0
        log.info("optimized generation", extra={"alias": self.alias, "generation": name, "changed": changed})
        return changed

    def maybe_optimize(self, generation: str | None = None) -> bool:
        points = self._counted_elsewhere(generation)  # beside `dpr serve`: counted there, not loaded here
        try:
            with self._use(generation) as (name, _):
                due = self.engine.needs_index(name, points)
        except CollectionNotFound:
            return False  # a job that stored nothing: no collection to index
        if due:  # a server's is a search-ef calibration only: no BM25 re-weighting beside its writers (below)
            return self.optimize(name) if self.backend == "edge" else self.engine.optimize(name)
        # Re-weighting reads and rewrites whole points: safe while writers wait (the edge lease); on a server a
        # concurrent write to the same point could be undone, so there only an explicit `dpr optimize` does it.
        return self.bm25_renormalize(name) > 0 if self.backend == "edge" else False

    def index_info(self, generation: str | None = None) -> dict[str, Any]:
        with self._use(generation) as (name, _):
            return {"generation": name} | self.engine.index_info(name)

    def search_ef(self, generation: str) -> dict[str, Any]:
        """The generation's search ef and why (calibrated after its build, set, or an exact scan)."""
        return self.engine.search_ef(generation)

    def memory(self, generation: str) -> dict[str, Any] | None:
        return self.engine.memory(generation)

    # -- data: the write paths by document are services.store.documents (a search never loads it) ---------------
    def upsert(self, points: Sequence[PassagePoint], generation: str | None = None, replace: bool = False) -> None:
        import services.store.documents as documents

        if not points:
            return
        with self._use(generation) as (name, spec):
            documents.upsert(self.engine, self.alias, name, spec, points, replace, self._forget_active)

    # -- BM25 length statistics: services.store.bm25_upkeep (write paths only; a search never loads it) ----------
    def bm25_stats(self, generation: str | None = None) -> Bm25Stats:
        """The generation's BM25 stats record: total tokens and passages of the points that carry a length."""
        from services.store.bm25 import read_stats

        with self._use(generation) as (name, _):
            return read_stats(self.engine.read_spec(name), name)

    def bm25_renormalize(self, generation: str | None = None, tolerance: float | None = None) -> int:
        """Re-weight the points whose BM25 weights use an average length more than ``tolerance`` (default
        ``bm25.DRIFT``) off the generation's own; returns how many were rewritten (``bm25_upkeep.renormalize``)."""
        import services.store.bm25_upkeep as upkeep

        name, spec = self._resolve(generation)
        return upkeep.renormalize(self.engine, name, spec, self._forget_active, tolerance)

    def doc_states(self, doc_ids: Iterable[str], generation: str | None = None) -> dict[str, DocState]:
        import services.store.documents as documents

        wanted = sorted(set(doc_ids))
        if not wanted:
            return {}
        with self._use(generation) as (name, _):
            return documents.doc_states(self.engine, name, wanted)

    def delete_stale(self, doc_id: str, keep_doc_hash: str, keep_chunks: int, generation: str | None = None) -> None:
        if keep_chunks < 0:
            raise ConfigError(f"keep_chunks must be >= 0, got {keep_chunks}")
        import services.store.documents as documents

        with self._use(generation) as (name, spec):
            documents.delete_stale(self.engine, name, spec, doc_id, keep_doc_hash, keep_chunks, self._forget_active)

    def delete_documents(self, doc_ids: Iterable[str], generation: str | None = None) -> int:
        wanted = sorted(set(doc_ids))
        if not wanted:
            return 0
        import services.store.documents as documents

        with self._use(generation) as (name, spec):
            return documents.delete_documents(self.engine, name, spec, wanted, self._forget_active)

    def count(self, generation: str | None = None) -> int:
        with self._use(generation) as (name, _):
            return self.engine.count(name)

    def scroll(self, batch_size: int = 256, generation: str | None = None) -> Iterator[list[Passage]]:
        """Batches in point-id order; on the edge the lease is held per batch, never while the caller works."""
        check_at_least_one("batch_size", batch_size)
        with self._use(generation) as (name, _):
            pass  # pin the generation now: a concurrent activate must not switch it mid-scan
        for records in pages(self.engine, name, batch_size):
            yield [Passage.from_payload(payload) for _, payload in records]

    def scan(self, batch_size: int = 1024, generation: str | None = None) -> Iterator[list[Passage]]:
        """Every passage of a generation as it is now, for a reader of one another process may be using: on the edge
        read from a copy of its shard (``EdgeEngine.copy_pages``), so that `dpr serve` keeps the generation it answers
        from instead of loading it again after every page; elsewhere ``scroll``."""
        copy_pages = getattr(self.engine, "copy_pages", None)
        if copy_pages is None:
            yield from self.scroll(batch_size, generation)
            return
        check_at_least_one("batch_size", batch_size)
        name = generation or getattr(self.active(), "name", None)
        if name is None:
            raise missing_collection(self.alias, self.backend)
        if generation_number(self.alias, name) is None or name not in self.engine.generations():
            raise missing_generation(self.alias, name)
        for records in copy_pages(name, batch_size):
            yield [Passage.from_payload(payload) for _, payload in records]

    def documents(self, generation: str | None = None) -> dict[str, str]:
        with self._use(generation) as (name, _):
            pass
        found: dict[str, str] = {}
        for records in pages(self.engine, name, 1024, fields=("doc_id", "source")):
            for _, payload in records:
                found.setdefault(str(payload.get("doc_id", "")), str(payload.get("source", "")))
        return found

    def passages(self, ids: Sequence[str], generation: str | None = None) -> dict[str, Passage]:
        """Point id -> its passage, for the ids that exist (payloads only; e.g. what a judgement names)."""
        if not ids:
            return {}
        with self._use(generation) as (name, _):
            return {pid: Passage.from_payload(p) for pid, p in self.engine.payloads(name, list(ids)).items()}

    def search(self, request: SearchRequest, generation: str | None = None) -> list[Hit]:
        with self._use(generation) as (name, spec):
            validate_request(self.alias, name, spec, request)
            scored = self._search(name, spec, request)
        return [Hit(passage=Passage.from_payload(payload), score=score, id=pid) for pid, score, payload in scored]

    def _search(self, name: str, spec: CollectionSpec, request: SearchRequest) -> list[Scored]:
        where = request_filter(request.filters)
        branches: list[Branch] = []
        if request.mode != "sparse" and request.dense is not None:
            branches.append((DENSE, [float(x) for x in request.dense]))
        if request.mode != "dense" and request.sparse is not None and request.sparse.indices:
            branches.append((SPARSE, request.sparse))
        if not branches:  # a sparse query made only of stopwords: nothing can match
            return []
        if request.mode != "hybrid":
            return self.engine.query(name, branches[0], request.k, where)
        depth = max(request.candidates, request.k)
        if request.fusion == "rrf":
            return self.engine.query_rrf(name, branches, request.k, depth, request.rrf_k, where)
        # scores only for the candidates of both branches; payloads only for the k that survive the fusion
        results = self.engine.query_batch(name, branches, depth, where, with_payload=False)
        dense_hits, sparse_hits = results[0], (results[1] if len(results) > 1 else [])
        higher = spec.distance != "euclid"
        fused = linear_fusion(dense_hits, sparse_hits, request.linear_weight, request.k, dense_higher_is_better=higher)
        payloads = self.engine.payloads(name, [pid for pid, _, _ in fused]) if fused else {}
        return [(pid, score, payloads[pid]) for pid, score, _ in fused if pid in payloads]

    def close(self) -> None:
        """Release the engine now (edge: flush, close the shards, unlock; server: close a client it owns)."""
        self.engine.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
