"""The two seams of the store: ``VectorStore`` (what service code talks to) and ``Engine`` (what a backend does).

A *collection* is an alias (the name users see) over *generations* (physical collections / shard
directories). Exactly one generation is active; re-embedding builds a new one and swaps the alias atomically.
Data operations act on the active generation unless ``generation=`` names another.

``VectorStore`` is met by one class, ``services.store.frontend.Store``, which holds every decision (generation
names, pointer resolution, validation, batching, per-document state, search modes and fusion) and drives an
``Engine``: ``edge/engine.py`` (qdrant-edge, embedded) or ``server/engine.py`` (qdrant-client, a Qdrant server
or its in-process engine). An engine translates engine-neutral records (``common.Where``, named vectors,
``Scored``) into its own calls, maps its own errors onto ``services.core.errors``, and decides nothing.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from services.store.common import Scored, Where
from services.store.points import (
    ActiveGeneration,
    CollectionInfo,
    CollectionSpec,
    DocState,
    Hit,
    Passage,
    PassagePoint,
    PointRecord,
    Record,
    SearchRequest,
    Vector,
)

Branch = tuple[str, Vector]  # (vector name, query vector): one search branch


@runtime_checkable
class VectorStore(Protocol):
    backend: str  # "edge" | "server"
    alias: str

    # --- collection and generations -------------------------------------------------------------------
    def info(self, wait: bool = True, counts: bool = True) -> CollectionInfo:
        """Alias, active generation (None if the collection does not exist yet), every generation kept, with
        exact point counts. For ``dpr status`` and the lifecycle; hot paths use ``active()``.

        ``wait=False`` (``dpr status``, ``/v1/status``): a generation other than the active one that another
        process holds (on the edge: workers writing a re-embed's target) is listed from its spec as last written,
        with ``count`` None, instead of waiting for it and making its writer hand it over and reload it.
        ``counts=False``: every ``count`` None, no generation locked (the lifecycle reads the records alone)."""
        ...

    def session(self) -> AbstractContextManager[object]:
        """Hold the engine for a run of calls: on the edge every generation a call inside touches stays locked by
        this process until the run ends (a scan that must not hand its generation over between pages)."""
        ...

    def spec(self, generation: str) -> CollectionSpec | None:
        """``generation``'s spec as stored now (settings and re-embed record included), None when it is gone. No
        count: on the edge it locks that generation only, not the others (a worker writing a re-embed's target
        leaves the active generation to ``dpr serve``)."""
        ...

    def active(self) -> ActiveGeneration | None:
        """The active generation's name and spec (None if the collection does not exist yet), cached.

        Cheap: no count. The cache is dropped when this store changes the collection, re-read when the engine's
        ``version()`` token moves (another process swapped or rewrote it), and re-read at least every
        ``frontend.ACTIVE_MAX_AGE`` seconds (so settings another process merged are seen on a server too).
        """
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

    def optimize(self, generation: str | None = None) -> bool:
        """Build indexes / merge and vacuum segments now (blocking the caller, not the readers). True if anything
        changed. The edge engine only indexes here; a server optimizes in the background by itself and reports
        False."""
        ...

    def maybe_optimize(self, generation: str | None = None) -> bool:
        """``optimize`` if enough points arrived since the last index build (edge: ``DPR_EDGE__INDEX_THRESHOLD``);
        called once at the end of an ingest job or a re-embed. False if nothing was done."""
        ...

    def index_info(self, generation: str | None = None) -> dict[str, Any]:
        """What the engine says about the generation's index (points, segments, graphs), for `dpr optimize`."""
        ...

    def search_ef(self, generation: str) -> dict[str, Any]:
        """The generation's search ef and why (calibrated, set, or an exact scan: ``calibrate.describe``), for
        `dpr status`; read without waiting for a writer."""
        ...

    def memory(self, generation: str) -> dict[str, Any] | None:
        """Where the generation's dense vectors live and why (``choice``, ``reason``: the embedded engine's memory
        budget, or the levers set), for `dpr status`; None on a server (its levers are its settings)."""
        ...

    # --- data ------------------------------------------------------------------------------------------
    def upsert(self, points: Sequence[PassagePoint], generation: str | None = None, replace: bool = False) -> None:
        """Idempotent: point ids are uuid5(doc id, chunk index). ``replace``: ``points`` hold every chunk of their
        documents' new versions, so each of those documents' other points (another doc hash, or a chunk index
        beyond them) is deleted in the same write (edge: one lease hold, not one per document)."""
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

    def scroll(self, batch_size: int = 256, generation: str | None = None) -> Iterator[list[Passage]]:
        """Every stored passage (payload only), in batches, in a stable order, from the generation resolved when
        the scroll started."""
        ...

    def scan(self, batch_size: int = 1024, generation: str | None = None) -> Iterator[list[Passage]]:
        """Every passage as it is now, for a reader of a generation another process may be using (a re-embed's
        source): on the edge from a copy of its files, so that the holder keeps it."""
        ...

    def documents(self, generation: str | None = None) -> dict[str, str]:
        """Every stored document id with its source (no texts, no vectors read)."""
        ...

    def search(self, request: SearchRequest, generation: str | None = None) -> list[Hit]: ...

    def close(self) -> None: ...

    def __enter__(self) -> VectorStore: ...

    def __exit__(self, *exc: object) -> None: ...


class Engine(Protocol):
    """One backend under the front end. Generation names it is given have been checked by the front end."""

    backend: str
    alias: str
    upsert_batch: int  # points per engine write

    def session(self, create: bool = False) -> AbstractContextManager[object]:
        """Hold the engine for a run of calls (edge: the directory lease; server: nothing). Re-entrant.
        ``create``: the collection may not exist yet and is about to (edge: make its directory)."""
        ...

    # --- the pointer (edge: the CURRENT file; server: the alias) and the generations ---------------------
    def version(self) -> Hashable:
        """A cheap token that changes when the pointer moves (edge: also when the active spec is rewritten)."""
        ...

    def read_pointer(self) -> str | None: ...

    def write_pointer(self, generation: str, previous: str | None) -> None:
        """Atomically point the collection at ``generation`` (``previous``: where it pointed, None if nowhere)."""
        ...

    def generations(self) -> list[str]:
        """This alias's complete generations (any order)."""
        ...

    def read_spec(self, generation: str) -> CollectionSpec:
        """Raises ``CollectionNotFound`` (``common.missing_generation``) when there is no such generation."""
        ...

    def write_spec(self, generation: str, spec: CollectionSpec) -> None: ...

    def create(self, generation: str, spec: CollectionSpec) -> bool:
        """Create an empty generation with its payload indexes; False if the name is taken (the caller moves on)."""
        ...

    def drop(self, generation: str) -> bool:
        """Delete a generation; False if it does not exist."""
        ...

    def optimize(self, generation: str) -> bool:
        """Takes its own sessions: the edge holds the lease only to copy the shard and to swap the result in."""
        ...

    def needs_index(self, generation: str, points: int | None = None) -> bool:
        """Enough points arrived since the last index build to build again (server: never, it does it itself);
        ``points``: the generation's count where the caller has it (from the process serving it)."""
        ...

    def index_info(self, generation: str) -> dict[str, Any]: ...

    def search_ef(self, generation: str) -> dict[str, Any]: ...

    def memory(self, generation: str) -> dict[str, Any] | None: ...

    # --- points -------------------------------------------------------------------------------------------
    def upsert(self, generation: str, points: Sequence[PointRecord]) -> None: ...

    def delete(self, generation: str, where: Where) -> None: ...

    def count(self, generation: str, where: Where | None = None) -> int:
        """Exact."""
        ...

    def count_if_free(self, generation: str) -> int | None:
        """Exact, or None at once when another process holds ``generation`` (edge); never waits for it."""
        ...

    def scroll(
        self, generation: str, limit: int, offset: Any, where: Where | None = None, fields: Sequence[str] | bool = True
    ) -> tuple[list[Record], Any]:
        """One page in point-id order and the offset of the next (None after the last)."""
        ...

    def query(self, generation: str, branch: Branch, limit: int, where: Where | None) -> list[Scored]: ...

    def query_batch(
        self, generation: str, branches: Sequence[Branch], limit: int, where: Where | None, with_payload: bool = True
    ) -> list[list[Scored]]:
        """One result list per branch (a hybrid query's, fused by the caller: the dense branch searches with the
        hybrid ef, ``hybrid_ef``); without payloads (``{}``) when ``with_payload`` is False."""
        ...

    def payloads(self, generation: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Point id -> payload for ``ids`` (missing ids are left out)."""
        ...

    def points(self, generation: str, ids: Sequence[str]) -> list[PointRecord]:
        """Whole points (named vectors and payload) for the ``ids`` that exist (missing ids are left out)."""
        ...

    def query_rrf(
        self, generation: str, branches: Sequence[Branch], limit: int, depth: int, rrf_k: int, where: Where | None
    ) -> list[Scored]:
        """Reciprocal rank fusion of the branches, ``depth`` candidates each, inside the engine (the dense branch
        with the hybrid ef, ``hybrid_ef``)."""
        ...

    def close(self) -> None: ...


def pages(engine: Engine, name: str, limit: int, where: Where | None = None,
          fields: Sequence[str] | bool = True) -> Iterator[list[Record]]:
    """Every page of generation ``name`` in point-id order, each read in its own engine session (on the edge the
    lease is held per page, never while the caller works)."""
    offset = None
    while True:
        with engine.session():
            records, offset = engine.scroll(name, limit, offset, where, fields)
        if records:
            yield records
        if offset is None:
            return
