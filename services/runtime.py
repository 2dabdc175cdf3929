"""The one per-process holder of the parts built from the settings: towers, BM25 embedder, store, write fence,
the ingest pipeline and the job store. The CLI, the HTTP API and each Celery pool process build one Runtime
(the API and workers keep it for their life) and reach other collections through ``for_collection``, which
shares the loaded models and keeps one store and fence per collection.

Everything is lazy and loads once, under a lock (the API calls in from request threads and its ingest thread),
so ``dpr status`` never loads a model (a worker's pool process loads it right after the fork: workers.tasks).
The ingest pipeline's modules (readers, chunking, language detection) are imported when a pipeline or a delete
is first asked for: `dpr query` never imports them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from encoders import registry
from encoders.onnx_towers import Backend
from encoders.registry import export_model, load_towers
from encoders.towers import DualEncoder, configure_threads, resolve_model_path
from services.core.errors import ModelMismatch
from services.core.settings import Settings
from services.core.threads import threads_per_process
from services.query import QueryOptions, search_many
from services.store.common import request_filter
from services.store.frontend import SELF_LOCKING
from services.store.points import Hit, SearchRequest
from services.store.protocol import VectorStore

if TYPE_CHECKING:  # jobs and locks load when a job or a fence is first asked for, the BM25 encoder for a sparse
    # or hybrid search: a dense `dpr query` needs none of them
    from encoders.rerank import Reranker
    from services.core.locks import WriteFence
    from services.ingest.pipeline import IngestPipeline
    from services.jobs import JobStore
    from services.serving import QuestionBatcher
    from services.store.sparse import SparseEncoder

T = TypeVar("T")


class _Models:
    """The models one process loads, shared by every collection's Runtime."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.towers: DualEncoder | None = None
        self.question_towers: DualEncoder | None = None
        self.sparse: SparseEncoder | None = None
        self.batcher: QuestionBatcher | None = None  # the serving runtime's (``use_batcher``); None: direct calls


class Runtime:
    """The parts one process needs for one collection, built on first use from one Settings object."""

    def __init__(
        self,
        settings: Settings,
        *,
        serialize_store: bool = False,
        towers: DualEncoder | None = None,
        sparse: SparseEncoder | None = None,
        store: VectorStore | None = None,
        _models: _Models | None = None,
        jobs_from: Runtime | None = None,
    ) -> None:
        """``towers``, ``sparse`` and ``store`` replace what the settings would build (tests, benchmarks, an
        evaluation over a temporary store); they are owned by the Runtime from then on (``close`` closes the
        store). ``jobs_from``: the Runtime whose job store this one shares (``for_collection``'s children: one
        job store per process, whatever the collection)."""
        self.settings = settings
        self.serialize_store = serialize_store  # one store call at a time in this process (the API's threads)
        self._models = _models or _Models()
        if towers is not None:  # injected towers answer both sides, whatever the backends say
            self._models.towers = self._models.question_towers = towers
        if sparse is not None:
            self._models.sparse = sparse
        self._lock = threading.RLock()
        self._parts: dict[str, Any] = {}
        if store is not None:
            self._parts["store"] = _Serialized(store) if serialize_store else store
        self._collections: dict[str, Runtime] = {}
        self._jobs_owner = jobs_from

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _part(self, name: str, build: Callable[[], T]) -> T:
        with self._lock:
            if name not in self._parts:
                self._parts[name] = build()
            return self._parts[name]  # type: ignore[no-any-return]

    # --- models (shared across collections) ---------------------------------------------------------------
    @property
    def towers(self) -> DualEncoder:
        """The configured model on ``encoder.backend``: what ingest embeds passages with."""
        m = self._models
        with m.lock:
            if m.towers is None:
                m.towers = self._load(self.settings.encoder.passages)
            return m.towers

    @property
    def question_towers(self) -> DualEncoder:
        """The configured model on ``encoder.question_backend`` (default: ``backend``): what questions are encoded
        with. Loaded on its own, so a query process on an ONNX backend never imports torch."""
        backend = self.question_backend
        if backend == self.settings.encoder.passages:
            return self.towers
        m = self._models
        with m.lock:
            if m.question_towers is None:
                m.question_towers = self._load(backend)
            return m.question_towers

    @property
    def question_backend(self) -> Backend:
        return self.settings.encoder.questions

    def prepare_queries(self) -> float:
        """Make the question backend's export of the configured model now if it has none (once per model: torch
        exports it, ~20 s for MiniLM), so the first ``dpr query`` does not pay for it. For a process that has
        torch loaded anyway (an in-process ingest); a no-op on torch or with injected towers. Returns the seconds
        spent (~0 when the export was there)."""
        if self.question_backend == "torch" or self._models.question_towers is not None:
            return 0.0
        started = time.perf_counter()
        s = self.settings
        path, _ = resolve_model_path(s.encoder.model, s.models_dir)
        export_model(path, s.models_dir, s.onnx_cache_dir)
        return time.perf_counter() - started

    def towers_of(self, spec: str) -> DualEncoder:
        """The model ``spec`` names (``dpr reembed --model``) on the passage tower's backend, threads and cache:
        a re-embed encodes on the same path as ingest."""
        s = self.settings
        threads = threads_per_process(s.encoder.threads)
        configure_threads(threads)
        return load_towers(spec, s.models_dir, device=s.encoder.device, backend=s.encoder.passages,
                           threads=threads, cache_dir=s.onnx_cache_dir)

    def _load(self, backend: Backend) -> DualEncoder:
        s = self.settings
        threads = threads_per_process(s.encoder.threads)  # services.core.threads: the policy
        configure_threads(threads)
        return load_towers(s.encoder.model, s.models_dir, device=s.encoder.device, backend=backend,
                           threads=threads, cache_dir=s.onnx_cache_dir)

    @property
    def sparse(self) -> SparseEncoder:
        m = self._models
        with m.lock:
            if m.sparse is None:
                from services.store.sparse import default_embedder

                m.sparse = default_embedder()
            return m.sparse

    def towers_for(self, fingerprint: str, backend: Backend | None = None) -> DualEncoder:
        """The towers whose fingerprint is ``fingerprint`` (base or under models_dir), on ``backend`` (default
        ``encoder.backend``) when its vectors agree: queries and ingest follow the collection's active generation
        across re-embeds and rollbacks. From the registry's tower cache."""
        passages = self.settings.encoder.passages
        backend = backend or passages
        m = self._models
        loaded = m.towers if backend == passages else m.question_towers
        if loaded is not None and loaded.fingerprint == fingerprint:
            return loaded
        try:
            return registry.towers_for(fingerprint, self.settings.models_dir, device=self.settings.encoder.device,
                                       backend=backend, threads=self.settings.encoder.threads,
                                       cache_dir=self.settings.onnx_cache_dir)
        except registry.ModelNotFound as e:
            raise ModelMismatch(str(e)) from e

    def question_towers_for(self, fingerprint: str) -> DualEncoder:
        """``towers_for`` on the question backend (the query path)."""
        return self.towers_for(fingerprint, self.question_backend)

    def reranker(self, recorded: str | None = None) -> Reranker:
        """The reranker: ``rerank.model``, else the one the collection recorded (``recorded``), else the newest
        reranker; on ``rerank.backend`` (default: the passage tower's backend: a reranker reads N passages per
        question, so it takes the passages' speed). Loaded once per process (the loader's
        cache, which notices a retrained model)."""
        from encoders.rerank import RerankerError, load_reranker

        s = self.settings
        try:
            return load_reranker(s.rerank.model or recorded, s.models_dir,
                                 s.rerank.backend or s.encoder.passages,
                                 threads=threads_per_process(s.encoder.threads), cache_dir=s.onnx_cache_dir)
        except RerankerError as e:
            raise ModelMismatch(str(e)) from e

    # --- per collection -----------------------------------------------------------------------------------
    @property
    def store(self) -> VectorStore:
        def build() -> VectorStore:
            from services.store import open_store

            store = open_store(self.settings)
            return _Serialized(store) if self.serialize_store else store  # type: ignore[return-value]

        return self._part("store", build)

    @property
    def fence(self) -> WriteFence:
        """The collection's write fence (shared by writers, exclusive for a re-embed swap or a rollback)."""

        def build() -> WriteFence:
            from services.core.locks import write_fence

            s = self.settings
            return write_fence(s.collection, s.data_dir, s.broker_url, s.reembed.fence_timeout)

        return self._part("fence", build)

    @property
    def pipeline(self) -> IngestPipeline:
        """The collection's ingest pipeline (towers, BM25, store, fence), built once."""
        from services.ingest.pipeline import IngestPipeline

        return self._part("pipeline", lambda: IngestPipeline.from_settings(
            self.settings, store=self.store, towers=self.towers, sparse=self.sparse, fence=self.fence,
            towers_for=self.towers_for,
        ))

    @property
    def jobs(self) -> JobStore:
        """Where ingest jobs are recorded: Redis with a broker, else the job folder under the data dir."""
        if self._jobs_owner is not None:  # one job store per process, whatever the collection
            return self._jobs_owner.jobs

        def build() -> JobStore:
            from services.jobs import JobStore

            url = self.settings.broker_url
            return JobStore.from_url(url) if url else local_jobs(self.settings.data_dir)

        return self._part("jobs", build)

    def for_collection(self, collection: str | None) -> Runtime:
        """This process's Runtime for another collection (the same models; its own store and fence)."""
        if not collection or collection == self.settings.collection:
            return self
        with self._lock:
            if collection not in self._collections:
                settings = self.settings.for_collection(collection)
                child = Runtime(settings, serialize_store=self.serialize_store, _models=self._models, jobs_from=self)
                self._collections[collection] = child
            return self._collections[collection]

    def use_batcher(self, batcher: QuestionBatcher) -> None:
        """Encode this process's questions through ``batcher`` (``dpr serve``: one per process, every collection)."""
        self._models.batcher = batcher

    def _batched(self, towers: DualEncoder) -> DualEncoder:
        batcher = self._models.batcher
        if batcher is None:
            return towers
        from services.serving import BatchedQuestionTowers

        return BatchedQuestionTowers(towers, batcher)  # type: ignore[return-value]

    def search(self, question: str, options: QueryOptions) -> list[Hit]:
        request_filter(options.filters)  # a bad filter is refused before the towers load
        batcher = self._models.batcher
        if batcher is None:
            return self.search_many([question], options)[0]
        return batcher.ask(*self._shared(options), question)  # type: ignore[no-any-return]

    @property
    def batches(self) -> bool:
        """Searches go through a batcher with batching on (``search_async`` then needs no thread of the caller's)."""
        return self._models.batcher is not None and self._models.batcher.batching

    async def search_async(self, question: str, options: QueryOptions) -> list[Hit]:
        """``search`` from an event loop while ``batches``."""
        request_filter(options.filters)
        assert self._models.batcher is not None
        return await self._models.batcher.ask_async(*self._shared(options), question)  # type: ignore[no-any-return]

    def _shared(self, options: QueryOptions) -> tuple[tuple[int, str], Callable[[list[str]], list[list[Hit]]]]:
        """The batcher's key and work for searches with ``options``: concurrent ones share one ``search_many``."""
        return (id(self), repr(options)), lambda questions: self.search_many(questions, options)

    def search_many(self, questions: list[str], options: QueryOptions) -> list[list[Hit]]:
        """One answer per question: one question-tower call for those not cached, then the store searches (of
        several questions: in one store session, on the edge one lease turn; a reranker's scoring in it too)."""
        with contextlib.ExitStack() as turn:
            store = _OneSession(self.store, turn) if len(questions) > 1 else self.store
            return search_many(questions, store=store, towers=self._batched(self.question_towers), options=options,
                               sparse_for=lambda: self.sparse,
                               towers_for=lambda fp: self._batched(self.question_towers_for(fp)),
                               reranker_for=self.reranker, rerank_batch_size=self.settings.rerank.batch_size)

    def delete(self, doc_ids: Iterable[str]) -> int:
        """Remove documents with all their passages (no model is loaded for it)."""
        from services.ingest.pipeline import delete_documents

        return delete_documents(doc_ids, store=self.store, fence=self.fence)

    def close(self) -> None:
        with self._lock:
            children, self._collections = list(self._collections.values()), {}
            store = self._parts.pop("store", None)
            self._parts.pop("pipeline", None)
        for child in children:
            child.close()
        if self._models.batcher is not None and self._jobs_owner is None:  # the process's own, not a child's
            self._models.batcher.close()
        if store is not None:
            store.close()


def local_jobs(data_dir: Path) -> JobStore:
    from services.jobs import FileHashes, JobStore

    return JobStore(FileHashes(data_dir / "jobs"))


class _OneSession:
    """``store`` whose searches, from the first, run in one store session that ``turn`` holds until it closes."""

    def __init__(self, store: VectorStore, turn: contextlib.ExitStack) -> None:
        self._store = store
        self._turn: contextlib.ExitStack | None = turn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def search(self, request: SearchRequest, generation: str | None = None) -> list[Hit]:
        if self._turn is not None:
            self._turn.enter_context(self._store.session())
            self._turn = None
        return self._store.search(request, generation=generation)


class _Serialized:
    """A store behind one lock: its methods run one at a time in this process; a session holds the lock."""

    def __init__(self, store: VectorStore) -> None:
        self._store = store
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def session(self) -> Iterator[object]:
        with self._lock, self._store.session() as held:  # the lock first, always: a session's lease under it
            yield held

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr) or name in SELF_LOCKING:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return call
