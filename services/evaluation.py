"""Evaluation through the real store: the product's ingest path and query path, not an in-memory matrix.

``store_retriever(towers, ...)`` returns an ``encoders.evaluate.Retriever`` that ingests the evaluation corpus
into a temporary embedded collection (``ingest_documents``: chunking by the passage tower's tokenizer, passage
tower, ``store.upsert``), asks every question with ``search_many`` (question tower, tower check, ``store.search``),
and aggregates chunk hits to documents (max score per document) for document-level metrics. The temporary store
is deleted afterwards.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from encoders.data import RetrievalDataset
from encoders.evaluate import (
    EvalReport,
    Retrieval,
    Retriever,
    bm25_retriever,
    evaluate_systems,
    towers_in_memory_retriever,
)
from encoders.towers import DualEncoder, SentenceTransformerTowers, resolve_model_path
from services.documents import Document
from services.ingest import IngestReport, ingest_documents
from services.query import QueryOptions, search_many
from services.settings import Settings
from services.store import open_store

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
    collection: str = "eval",
    workdir: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Retriever:
    """A retriever that ingests the dataset's corpus with ``towers`` and queries it, both through the product."""

    def run(dataset: RetrievalDataset, k: int) -> Retrieval:
        tmp = Path(tempfile.mkdtemp(prefix="dpr-eval-", dir=workdir))
        try:
            cfg = eval_settings(settings, tmp, collection)
            store = open_store(cfg)
            try:
                docs = dataset_documents(dataset)
                done = 0

                def on_batch(part: IngestReport) -> None:
                    nonlocal done
                    done += part.documents + part.unchanged + len(part.failed) + len(part.skipped)
                    if progress is not None:
                        progress(done, len(docs))

                report = ingest_documents(
                    docs,
                    store=store,
                    towers=towers,
                    chunking=cfg.chunk,
                    sparse=None,
                    batch_size=cfg.encoder.batch_size,
                    batch_documents=cfg.celery.batch_documents,
                    batch_bytes=cfg.celery.batch_bytes,
                    progress=on_batch,
                )
                if report.failed:
                    log.warning("documents failed to ingest", extra={"failed": len(report.failed)})
                qids = sorted(dataset.queries)
                options = QueryOptions(k=min(k * CHUNK_OVERFETCH, 1000), mode="dense")
                hits = search_many(
                    [dataset.queries[q] for q in qids],
                    store=store,
                    towers=towers,
                    options=options,
                    batch_size=cfg.encoder.batch_size,
                )
            finally:
                store.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
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

    return run


BM25_NOTE = "bm25: bm25s, English stopwords, Snowball stemming, k1 1.5, b 0.75, over title + text"
STORE_NOTE = (
    "dense systems: ingested into a temporary embedded collection (chunked by the passage tower) and queried "
    "through the product's query path; chunk hits -> documents by max score"
)
MEMORY_NOTE = "dense systems: exact in-memory scan of whole documents (truncated to the passage tower's length)"


def compare_systems(
    dataset: RetrievalDataset,
    *,
    settings: Settings,
    models: list[str],
    bm25: bool = True,
    in_memory: bool = False,
    k: int = 100,
) -> EvalReport:
    """BM25 and each model (``base``, a name under the models dir, or a path) on one dataset, in one run.

    Dense systems go through the real store unless ``in_memory``. Labels: ``bm25``, ``base``, ``trained:<name>``.
    """
    systems: dict[str, Retriever] = {}
    notes = []
    if bm25:
        systems["bm25"] = bm25_retriever()
        notes.append(BM25_NOTE)
    for spec in models:
        path, name = resolve_model_path(spec, settings.models_dir)
        label = "base" if name == "base" else f"trained:{name}"
        if in_memory:
            systems[label] = towers_in_memory_retriever(path)
        else:
            towers = SentenceTransformerTowers(path, device=settings.encoder.device, name=name)
            systems[label] = store_retriever(towers, settings=settings, collection="eval")
    if models:
        notes.append(MEMORY_NOTE if in_memory else STORE_NOTE)
    report = evaluate_systems(dataset, systems, k=k)
    report.notes.extend(notes)
    return report
