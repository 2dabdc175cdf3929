"""Vector stores: one front end (``Store``, meeting the ``VectorStore`` protocol) over two engines.

``open_store(settings)`` is the one place that picks an engine and builds the store: the embedded qdrant-edge
engine (``edge/engine.py``) or a Qdrant server through qdrant-client (``server/engine.py``). Tests hand an
engine in: ``Store(EdgeEngine(tmp_path, "c"))`` or ``Store(ServerEngine(QdrantClient(":memory:"), "c"))``.
The engines are imported lazily so that importing this package (e.g. for the CLI) stays cheap.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from services.core.errors import StoreUnavailable
from services.store.frontend import Store
from services.store.points import DocState, PassagePoint
from services.store.protocol import VectorStore

if TYPE_CHECKING:
    from services.core.settings import Settings
    from services.store.edge.engine import EdgeEngine
    from services.store.edge.owner import Call, OwnerClient

log = logging.getLogger(__name__)

__all__ = ["Answers", "ServedStore", "Store", "VectorStore", "open_store"]


def open_store(settings: Settings) -> Store:
    """The embedded store under ``settings.store_dir`` unless ``settings.qdrant_url`` names a server.

    Server: ``QdrantClient(url=..., api_key=..., timeout=...)`` with ``settings.qdrant`` cluster options applied
    to new generations; ``":memory:"`` gives qdrant-client's in-process engine (tests only). The store owns the
    client: ``close()`` closes it.
    """
    if settings.qdrant_url:
        from services.store.server.engine import ServerEngine

        log.debug("opening the server store", extra={"url": settings.qdrant_url, "alias": settings.collection})
        return Store(ServerEngine.from_settings(settings))
    from services.store.edge.engine import EdgeEngine

    log.debug("opening the embedded store", extra={"dir": str(settings.store_dir), "alias": settings.collection})
    if not settings.edge.serve_writes:
        return Store(EdgeEngine.from_settings(settings))
    return ServedStore(EdgeEngine.from_settings(settings))


OWNED = frozenset({Store.upsert, Store.doc_states, Store.delete_stale, Store.delete_documents, Store.count,
                   Store.documents, Store.bm25_renormalize})  # the ``Store`` calls of an ingest job


class ServedStore(Store):
    """``Store`` over an ``EdgeEngine`` for a process beside `dpr serve`: the ``OWNED`` calls go there first."""

    def __init__(self, engine: EdgeEngine) -> None:
        super().__init__(engine)
        self._edge = engine
        self._owner: OwnerClient | None = None  # made by the first call

    def _there(self, generation: str | None, method: Callable[..., Any], *args: Any,
               **kwargs: Any) -> tuple[bool, Any]:
        """``(True, answer)`` where `dpr serve` ran ``method`` on ``generation`` (None: the active one); else
        ``(False, None)``: run it here."""
        name = generation or self._edge.read_pointer()
        if name is None or self._edge.serves(name) or self._edge.lease.holds(name):
            return False, None
        if self._owner is None:
            from services.store.edge.owner import OwnerClient  # writers only: `dpr query` never loads the socket

            self._owner = OwnerClient(self._edge.root.parent, self._edge.lock_timeout)
        call: Call = (method, args, kwargs)
        return self._owner.call(self.alias, name, call)

    def _counted_elsewhere(self, generation: str | None) -> int | None:
        there, points = self._there(generation, Store.count)
        return points if there else None

    def upsert(self, points: Sequence[PassagePoint], generation: str | None = None, replace: bool = False) -> None:
        if points and not self._there(generation, Store.upsert, points, replace=replace)[0]:
            super().upsert(points, generation, replace)

    def bm25_renormalize(self, generation: str | None = None, tolerance: float | None = None) -> int:
        there, rewritten = self._there(generation, Store.bm25_renormalize, tolerance=tolerance)
        return rewritten if there else super().bm25_renormalize(generation, tolerance)  # type: ignore[no-any-return]

    def doc_states(self, doc_ids: Iterable[str], generation: str | None = None) -> dict[str, DocState]:
        wanted = sorted(set(doc_ids))
        there, states = self._there(generation, Store.doc_states, wanted) if wanted else (False, {})
        return states if there else super().doc_states(wanted, generation)  # type: ignore[no-any-return]

    def delete_stale(self, doc_id: str, keep_doc_hash: str, keep_chunks: int, generation: str | None = None) -> None:
        if keep_chunks < 0 or not self._there(generation, Store.delete_stale, doc_id, keep_doc_hash, keep_chunks)[0]:
            super().delete_stale(doc_id, keep_doc_hash, keep_chunks, generation)

    def delete_documents(self, doc_ids: Iterable[str], generation: str | None = None) -> int:
        wanted = sorted(set(doc_ids))
        there, removed = self._there(generation, Store.delete_documents, wanted) if wanted else (False, 0)
        return removed if there else super().delete_documents(wanted, generation)  # type: ignore[no-any-return]

    def count(self, generation: str | None = None) -> int:
        counted = self._counted_elsewhere(generation)
        return counted if counted is not None else super().count(generation)

    def documents(self, generation: str | None = None) -> dict[str, str]:
        there, found = self._there(generation, Store.documents)
        return found if there else super().documents(generation)  # type: ignore[no-any-return]


class Answers:
    """`dpr serve`'s end (``Owner(store_dir, Answers(engine_for))``): an ``OWNED`` call of another process, run on
    this process's engine of the alias (``engine_for(alias)``, one per alias) where it has the generation open."""

    def __init__(self, engine_for: Callable[[str], EdgeEngine]) -> None:
        self._engine_for = engine_for
        self._stores: dict[str, tuple[EdgeEngine, Store]] = {}
        self._guard = threading.Lock()  # a thread per connection: one engine per alias

    def __call__(self, alias: str, generation: str, call: Call) -> tuple[bool, Any]:
        method, args, kwargs = call
        if method not in OWNED:
            raise StoreUnavailable(f"the serving process does not run {getattr(method, '__name__', method)!r} for "
                                   "other processes")
        with self._guard:
            if alias not in self._stores:
                engine = self._engine_for(alias)
                self._stores[alias] = (engine, Store(engine))
            engine, store = self._stores[alias]
        if not engine.serves(generation):
            return False, None  # not a generation it serves: the caller takes it as before
        return True, method(store, *args, generation=generation, **kwargs)
