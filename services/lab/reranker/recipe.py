"""The reranker recipe: `dpr train-reranker` trains a cross-encoder on the towers' training set (labelled pairs,
BM25 hard negatives, dev queries held out: ``services.lab.towers.recipe.build_training_set``), measures the first
stage's dev nDCG@10 before and after reranking its top N, exports it to ONNX, and records in the collection's settings
(like `dpr tune-hybrid`'s fusion) whether queries rerank by default: only where the dev split gained.

torch and sentence-transformers are imported only when training starts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.core.errors import CollectionNotFound, ConfigError
from services.core.settings import Settings
from services.lab.towers.recipe import TrainingData, build_training_set
from services.query import RERANK_KEY

if TYPE_CHECKING:
    from services.lab.evaluation.retrieval import Retriever
    from services.lab.reranker.trainer import RerankConfig
    from services.lab.shared.training_run import ProgressFn, TrainResult

log = logging.getLogger(__name__)


@dataclass
class RerankerTraining:
    result: TrainResult
    setting: dict[str, Any]  # what goes into a collection's settings under ``rerank``
    stored_in: str | None  # the collection that received it (None: no such collection yet)


def first_stage_retriever(settings: Settings, spec: str) -> Retriever:
    """The dev split's first stage: ``bm25``, or a towers model (``base``, a name, a path) searched in memory."""
    from encoders.towers import resolve_model_path
    from services.lab.evaluation.retrieval import bm25_retriever, towers_in_memory_retriever

    if spec == "bm25":
        return bm25_retriever()
    try:
        path, _ = resolve_model_path(spec, settings.models_dir)
    except FileNotFoundError as e:
        raise ConfigError(f"the recipe's dev.first_stage {spec!r}: {e}") from e
    return towers_in_memory_retriever(path)


def train_reranker_model(
    settings: Settings,
    data: TrainingData,
    config: RerankConfig,
    *,
    base: str = "base",
    first_stage: str = "bm25",
    progress: ProgressFn | None = None,
) -> RerankerTraining:
    """Train, measure on the dev split, export to ONNX, record the default in the collection when it exists."""
    from encoders.registry import export_model
    from encoders.rerank import export_reranker
    from encoders.towers import resolve_model_path
    from services.lab.reranker.trainer import encoder_to_start_from, train_reranker

    if data.self_supervised is not None or data.from_collection is not None:
        raise ConfigError("a reranker learns from labelled pairs; give a BEIR folder, SQuAD JSON or pairs JSONL")
    try:
        base_path = encoder_to_start_from(resolve_model_path(base, settings.models_dir)[0])
    except FileNotFoundError as e:
        raise ConfigError(f"--base {base!r}: {e}") from e
    training = build_training_set(settings, data)
    result = train_reranker(
        training.pairs, settings.models_dir, config, base=base_path, corpus=training.corpus or None,
        dev=training.dev, first_stage=first_stage_retriever(settings, first_stage), first_stage_name=first_stage,
        data_info=training.info, progress=progress,
    )
    export_model(result.model_dir, settings.models_dir, settings.onnx_cache_dir, exporter=export_reranker)
    setting = rerank_setting(result.card, result.name)
    return RerankerTraining(result, setting, store_default(settings, setting))


def rerank_setting(card: dict[str, Any], name: str) -> dict[str, Any]:
    """The collection setting a reranker's card implies: on by default only with a dev gain."""
    dev = card.get("dev_metrics") or {}
    return {"model": name, "candidates": int(dev.get("candidates") or card["hyperparameters"]["candidates"]),
            "enabled": bool(card.get("default_on")), "weight": float(dev.get("weight", 1.0)),
            "dev_gain_ndcg@10": dev.get("gain"), "first_stage": dev.get("first_stage")}


def store_default(settings: Settings, setting: dict[str, Any]) -> str | None:
    """Merge ``setting`` into the collection's settings (``dpr query`` reads it); None when there is no collection."""
    from services.store import open_store

    store = open_store(settings)
    try:
        if store.active() is None:
            log.info("no collection to record the reranker in", extra={"collection": settings.collection})
            return None
        store.update_settings({RERANK_KEY: setting})
    except CollectionNotFound:
        return None
    finally:
        store.close()
    log.info("stored the reranker default", extra={"collection": settings.collection, **setting})
    return settings.collection
