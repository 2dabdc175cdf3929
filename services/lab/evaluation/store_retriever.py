"""Evaluation through the real store: the product's ingest path and query path, not an in-memory matrix.

``store_retriever(towers, ...)`` returns an ``services.lab.evaluation.retrieval.Retriever`` that ingests the evaluation
corpus into a temporary embedded collection (one ``IngestJob``, its batches run in this process by the corpus's
own ``IngestPipeline`` through the one batch loop: chunking by the passage tower's tokenizer, passage tower,
``store.upsert``), asks every question with ``search_many`` (question tower, tower check, ``store.search``), and
aggregates chunk hits to documents (max score per document) for document-level metrics. The temporary store is
deleted afterwards.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from encoders.data import RetrievalDataset
from encoders.registry import Backend, SplitTowers, load_towers
from encoders.towers import DualEncoder, resolve_model_path
from services.core.settings import Settings
from services.core.threads import threads_per_process
from services.ingest.executor import LocalExecutor
from services.ingest.job import IngestJob, Tally
from services.ingest.language import corpus_language
from services.ingest.pipeline import IngestPipeline
from services.lab.evaluation.retrieval import (
    EvalReport,
    Retrieval,
    Retriever,
    bm25_retriever,
    evaluate_systems,
    towers_in_memory_retriever,
)
from services.lab.shared.mining import BM25Config
from services.query import QueryOptions, search_many
from services.readers import Document
from services.runtime import Runtime, local_jobs
from services.store import open_store
from services.store.points import Hit
from services.store.protocol import VectorStore

log = logging.getLogger(__name__)

# Chunk hits fetched per question for k documents: long documents contribute several chunks.
CHUNK_OVERFETCH = 3


def eval_settings(settings: Settings | None, data_dir: Path, collection: str) -> Settings:
    """The user's chunking and encoder options on a throw-away embedded store under ``data_dir``."""
    base = settings or Settings()
    return base.model_copy(update={"data_dir": data_dir, "collection": collection, "qdrant_url": None})


def dataset_documents(dataset: RetrievalDataset) -> list[Document]:
    return [
        Document(doc_id=d.doc_id, text=d.text, title=d.title, source=dataset.name)
        for d in dataset.corpus.values()
        if d.text.strip() or d.title.strip()
    ]


def store_retriever(
    towers: DualEncoder,
    *,
    settings: Settings | None = None,
    cache_dir: Path | None = None,
) -> Retriever:
    """A retriever that ingests the dataset's corpus with ``towers`` and queries it, both through the product.

    ``cache_dir``: reuse the retrieval of an earlier run with the same dataset, tower fingerprint, chunk settings
    and k (benchmarks that compare a new model against a base model already measured).
    """

    def run(dataset: RetrievalDataset, k: int) -> Retrieval:
        cache = None
        if cache_dir is not None:
            chunking = (settings or Settings()).chunk.model_dump_json()
            backend = getattr(towers, "backend", "torch")  # an int8 export can keep the model's fingerprint
            model = getattr(towers, "model_fingerprint", towers.fingerprint)  # question-only models share passages
            key = f"{dataset.fingerprint()}|{model}|{towers.fingerprint}|{backend}|{chunking}|{k}|{CHUNK_OVERFETCH}"
            cache = cache_dir / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
            if cache.is_file():
                saved = json.loads(cache.read_text())
                log.info("reused a cached retrieval", extra={"cache": str(cache)})
                return Retrieval(run=saved["run"], texts=saved["texts"])
        corpus = StoreCorpus(towers, settings=settings, collection="eval", sparse=False)
        try:
            retrieval = corpus.search(dataset, k, QueryOptions(mode="dense"))
        finally:
            corpus.close()
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"run": retrieval.run, "texts": retrieval.texts}))
        return retrieval

    return run


def hits_to_retrieval(qids: Sequence[str], hits: Sequence[Sequence[Hit]], k: int) -> Retrieval:
    """Chunk hits (best first) -> documents by max score, top ``k``; passage texts best first for answer@k."""
    out = Retrieval(run={}, texts={})
    for qid, q_hits in zip(qids, hits, strict=True):
        per_doc: dict[str, float] = {}
        texts: list[str] = []
        for hit in q_hits:  # best first
            doc_id = hit.passage.doc_id
            if doc_id not in per_doc:
                per_doc[doc_id] = float(hit.score)
                if len(per_doc) > k:
                    del per_doc[doc_id]
                    break
            texts.append(hit.passage.text)
        out.run[qid] = per_doc
        out.texts[qid] = texts[:k]
    return out


class _QueryCache:
    """A ``DualEncoder`` that remembers question-tower batches: one dev set asked in many modes is encoded once."""

    def __init__(self, towers: DualEncoder) -> None:
        self.towers = towers
        self._cache: dict[tuple[str, ...], Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.towers, name)

    def encode_queries(self, questions: list[str], batch_size: int = 32) -> Any:
        key = tuple(questions)
        if key not in self._cache:
            self._cache = {key: self.towers.encode_queries(questions, batch_size=batch_size)}  # (n, dim)
        return self._cache[key]


class StoreCorpus:
    """A dataset's corpus ingested ONCE through the product (dense + BM25 sparse vectors), queried in many modes.

    ``search(dataset, k, options)`` asks the dataset's questions with ``search_many`` (any mode, any fusion) and
    returns document-level results. By default the collection is temporary (deleted by ``close()``); ``existing``
    wraps a collection that already holds the corpus (nothing is ingested, nothing deleted).
    """

    def __init__(
        self,
        towers: DualEncoder,
        *,
        settings: Settings | None = None,
        collection: str = "eval",
        workdir: Path | None = None,
        sparse: bool = True,
        progress: Callable[[int, int], None] | None = None,
        store: VectorStore | None = None,
        language: str | None = None,
    ) -> None:
        """``language``: the BM25 tokenisation of a new temporary collection (``en`` | ``ko``; None or ``auto``:
        detected on the corpus, ``services.ingest.language``); an existing collection keeps its own."""
        self.towers = _QueryCache(towers)
        self.language = language
        self.settings = settings or Settings()
        self.collection = collection
        self.workdir = workdir
        self.sparse = sparse
        self.progress = progress
        self.ingest_report: Tally | None = None  # documents done, passages, failed
        self._store = store
        self._owned = store is None
        self._tmp: Path | None = None
        self._corpus_key: tuple[int, int] | None = None

    @classmethod
    def existing(cls, store: VectorStore, towers: DualEncoder, settings: Settings | None = None) -> StoreCorpus:
        return cls(towers, settings=settings, store=store, sparse=store.info().active.spec.sparse)  # type: ignore[union-attr]

    @property
    def store(self) -> VectorStore:
        if self._store is None:
            raise RuntimeError("StoreCorpus.store is used before prepare(dataset) ingested a corpus")
        return self._store

    def prepare(self, dataset: RetrievalDataset) -> VectorStore:
        """Ingest ``dataset``'s corpus unless this corpus is already in (``subset`` keeps the same corpus)."""
        key = (id(dataset.corpus), len(dataset.corpus))
        if not self._owned or key == self._corpus_key:
            return self.store
        self.close()
        self._tmp = Path(tempfile.mkdtemp(prefix="dpr-eval-", dir=self.workdir))
        cfg = eval_settings(self.settings, self._tmp, self.collection)
        self._store = open_store(cfg)
        docs = dataset_documents(dataset)
        from services.store.sparse import embedder_for

        self.language = corpus_language(self.language, dataset.corpus)
        pipeline = IngestPipeline.from_settings(
            cfg, store=self._store, towers=self.towers, sparse=embedder_for(self.language) if self.sparse else None
        )
        progress = self.progress
        # one ingest job over the throw-away collection, its batches run here by this corpus's own pipeline
        job = IngestJob(Runtime(cfg, towers=self.towers, store=self._store), lambda: iter(docs),
                        on_progress=None if progress is None else lambda tally: progress(tally.done, len(docs)))
        job.run(LocalExecutor(local_jobs(self._tmp), lambda _: pipeline, on_batch=job.on_batch, scratch=True))
        self.ingest_report = job.tally
        if job.tally.failed:
            log.warning("documents failed to ingest", extra={"failed": job.tally.failed})
        self._corpus_key = key
        return self._store

    def search(self, dataset: RetrievalDataset, k: int, options: QueryOptions) -> Retrieval:
        """Every question of ``dataset`` through ``search_many`` with ``options`` (its ``k`` is set here)."""
        from dataclasses import replace

        from services.store.sparse import default_embedder

        store = self.prepare(dataset)
        qids = sorted(dataset.queries)
        hits = search_many(
            [dataset.queries[q] for q in qids],
            store=store,
            towers=self.towers,
            options=replace(options, k=min(k * CHUNK_OVERFETCH, 1000)),
            sparse=default_embedder() if options.mode != "dense" else None,  # the collection's language wins
            batch_size=self.settings.encoder.batch_size,
        )
        return hits_to_retrieval(qids, hits, k)

    def retriever(self, options: QueryOptions) -> Retriever:
        return lambda dataset, k: self.search(dataset, k, options)

    def close(self) -> None:
        if self._owned and self._store is not None:
            self._store.close()
            self._store = None
            self._corpus_key = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


STORE_NOTE = (
    "dense systems: ingested into a temporary embedded collection (chunked by the passage tower) and queried "
    "through the product's query path; chunk hits -> documents by max score"
)
MEMORY_NOTE = "dense systems: exact in-memory scan of whole documents (truncated to the passage tower's length)"


def _served_towers(settings: Settings, spec: str) -> DualEncoder:
    """The model ``spec`` names as the product would serve it, measured: passages on ``DPR_ENCODER__BACKEND``,
    questions on ``DPR_ENCODER__QUESTION_BACKEND`` (``SplitTowers`` when the two differ)."""
    encoder = settings.encoder

    def load(backend: Backend) -> DualEncoder:
        return load_towers(spec, settings.models_dir, device=encoder.device, backend=backend,
                           threads=threads_per_process(encoder.threads), cache_dir=settings.onnx_cache_dir)

    passages = load(encoder.passages)
    question = encoder.questions
    return passages if question == encoder.passages else SplitTowers(passages, load(question))


def compare_systems(
    dataset: RetrievalDataset,
    *,
    settings: Settings,
    models: list[str],
    bm25: bool = True,
    in_memory: bool = False,
    k: int = 100,
    modes: Sequence[str] = ("dense",),
    hybrid: QueryOptions | None = None,
    hybrid_note: str = "",
    cache_dir: Path | None = None,
    language: str | None = None,
) -> EvalReport:
    """BM25 and each model (``base``, a name under the models dir, or a path) on one dataset, in one run.

    Dense systems go through the real store unless ``in_memory``. Labels: ``bm25``, ``base``, ``trained:<name>``.
    ``modes`` beyond ``dense`` (``sparse``, ``hybrid``): each model's corpus is ingested once with BM25 sparse
    vectors and asked in every mode: ``<label>`` (dense), ``<label>+hybrid`` (fusion from ``hybrid``, else the
    defaults: rrf k=60), and once ``bm25-store`` (the BM25 sparse vectors through Qdrant).
    ``cache_dir`` (dense mode): reuse retrievals of the same dataset, towers and chunk settings from earlier runs.
    ``language`` (``en`` | ``ko``; None or ``auto``: detected on the corpus) tokenises both BM25s, the baseline and
    the store's sparse vectors, so a Korean evaluation never compares against an English-tokenised BM25.
    """
    systems: dict[str, Retriever] = {}
    lang = corpus_language(language, dataset.corpus)
    notes = [f"language: {lang}" + (" (detected on the corpus)" if language in (None, "auto") else "")]
    corpora: list[StoreCorpus] = []
    if bm25:
        config = BM25Config.for_language(lang)
        systems["bm25"] = bm25_retriever(config)
        notes.append(f"bm25: {config.describe()}, over title + text")
    store_modes = [m for m in ("dense", "sparse", "hybrid") if m in modes]
    if store_modes != ["dense"] and in_memory:
        raise ValueError("sparse and hybrid modes run through the store; drop --in-memory")
    for spec in models:
        path, name = resolve_model_path(spec, settings.models_dir)
        label = "base" if name == "base" else f"trained:{name}"
        if in_memory:
            systems[label] = towers_in_memory_retriever(path)
        elif store_modes == ["dense"]:
            towers = _served_towers(settings, spec)
            systems[label] = store_retriever(towers, settings=settings, cache_dir=cache_dir)
        else:
            towers = _served_towers(settings, spec)
            corpus = StoreCorpus(towers, settings=settings, collection="eval", sparse=True, language=lang)
            corpora.append(corpus)
            if "dense" in store_modes:
                systems[label] = corpus.retriever(QueryOptions(mode="dense"))
            if "sparse" in store_modes and "bm25-store" not in systems:
                systems["bm25-store"] = corpus.retriever(QueryOptions(mode="sparse"))
            if "hybrid" in store_modes:
                systems[f"{label}+hybrid"] = corpus.retriever(_hybrid_options(hybrid))
    if models:
        notes.append(MEMORY_NOTE if in_memory else f"{STORE_NOTE}; towers on {settings.encoder.passages}")
    if corpora:
        notes.append(SPARSE_NOTE + (SPARSE_KO if lang == "ko" else SPARSE_EN))
        if "hybrid" in store_modes:
            notes.append("hybrid: " + (hybrid_note or describe_fusion(_hybrid_options(hybrid))))
    try:
        report = evaluate_systems(dataset, systems, k=k)
    finally:
        for corpus in corpora:
            corpus.close()
    report.notes.extend(notes)
    report.add_significance(dataset.qrels)  # each system vs bm25 and vs base: paired randomization test
    return report


SPARSE_NOTE = (
    "store modes: each model's corpus ingested once with dense + BM25 sparse vectors; bm25-store = the sparse "
    "vectors alone through Qdrant; the first store system's seconds include the ingest; sparse tokenisation: "
)
SPARSE_EN = "qdrant-edge Bm25, word tokens, lower case, English stopwords, Snowball stemming, IDF from the collection"
SPARSE_KO = "Kiwi content morphemes hashed by qdrant-edge Bm25 (whitespace tokens), IDF from the collection"


def _hybrid_options(hybrid: QueryOptions | None) -> QueryOptions:
    from dataclasses import replace

    return replace(hybrid or QueryOptions(fusion="rrf", rrf_k=60), mode="hybrid")


def describe_fusion(options: QueryOptions) -> str:
    """``rrf k=60, 100 candidates per branch`` / ``linear, dense weight 0.7, ...`` (defaults filled in)."""
    fusion = options.fusion or "rrf"
    weight = options.linear_weight if options.linear_weight is not None else 0.5
    head = f"rrf k={options.rrf_k or 60}" if fusion == "rrf" else f"linear min-max, dense weight {weight:g}"
    cand = f"{options.candidates} candidates per branch" if options.candidates else "candidates = max(100, chunk depth)"
    return f"{head}, {cand}"
