"""The one training recipe, used by `dpr train` and the quality benchmark: read the data (``services.readers``),
build (question, passage) pairs (labelled from BEIR / SQuAD / JSONL, or self-supervised ICT / title from a corpus
or an ingested collection), hold dev queries out, mine BM25 hard negatives, train (``services.lab.towers.trainer``).

torch and sentence-transformers are imported only when training starts.
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from encoders.data import Corpus, CorpusDoc, RetrievalDataset, TrainPair, labelled_pairs
from services.core.errors import ConfigError
from services.core.settings import Settings
from services.ingest.language import corpus_language
from services.lab.shared.mining import MiningConfig
from services.lab.shared.self_supervised import PairConfig, SelfSupervisedMode, self_supervised_pairs
from services.readers import dataset_format, load_corpus, load_dataset, load_pairs_jsonl, load_squad

if TYPE_CHECKING:
    from services.lab.shared.training_run import ProgressFn, TrainResult
    from services.lab.towers.trainer import TrainConfig

log = logging.getLogger(__name__)


@dataclass
class TrainingData:
    """What to train on; the hyper-parameters are ``services.lab.towers.trainer.TrainConfig``.

    - ``data``: a BEIR folder, SQuAD JSON or labelled-pairs JSONL; with ``self_supervised``, a corpus (BEIR folder
      or corpus JSONL). ``corpus``: looks up JSONL pairs' ``positive_id``.
    - ``from_collection``: self-supervised pairs (``both`` unless ``self_supervised`` says otherwise) from an
      ingested collection.
    - ``max_pairs``: a cap on pairs (a seeded sample of labelled pairs; self-supervised pairs are shuffled, then cut).
    - ``seed``: shuffles and samples the pairs (the trainer's seed is ``TrainConfig.seed``).
    - ``pretrain``: two stages in one run (Chang et al. 2020): first self-supervised pairs of the target corpus
      (``corpus`` if given, else DATA's, else ``from_collection``'s) for ``pretrain_epochs`` (at most
      ``pretrain_max_pairs`` pairs), then the labelled pairs from the stage-1 model; both stages go into the card.
    - ``pair_config``: how ICT and title pairs are cut (``services.lab.shared.self_supervised.PairConfig``: ICT
      questions per document, the chance the sentence stays in its passage, ...).
    - ``language``: the BM25 tokenisation for hard-negative mining (``en`` | ``ko``; None or ``auto``: detected on
      the corpus by ``services.ingest.language``); recorded in the model card's ``training_data``.
    """

    data: Path | None = None
    fmt: str = "auto"
    split: str = "train"
    corpus: Path | None = None
    self_supervised: SelfSupervisedMode | None = None
    from_collection: str | None = None
    max_pairs: int | None = None
    dev_queries: int = 100
    seed: int = 42
    mining: MiningConfig = field(default_factory=MiningConfig)
    pretrain: SelfSupervisedMode | None = None  # stage 1 on ict | title | both pairs of the target corpus
    pretrain_epochs: float = 1.0
    pretrain_max_pairs: int | None = None
    pair_config: PairConfig = field(default_factory=PairConfig)
    language: str | None = None
    feedback: bool = False  # also the judgements stored with the collection (``services.feedback``)


@dataclass
class TrainingSet:
    """Pairs ready to train on, the corpus they come from (negatives, mining), dev queries and the card's data info."""

    pairs: list[TrainPair]
    corpus: Corpus
    dev: RetrievalDataset | None = None
    info: dict[str, Any] = field(default_factory=dict)


def train_model(
    settings: Settings,
    data: TrainingData,
    config: TrainConfig,
    *,
    base: str = "base",
    progress: ProgressFn | None = None,
) -> TrainResult:
    """Build the training set, mine hard negatives and train a versioned model directory under ``models_dir``.

    ``config.question_only``: ``base`` (``active`` for `dpr train --question-only`) is the partner whose passage
    tower the new model keeps; every corpus passage is a negative there, so no hard negatives are mined, and
    nothing that would move the passage tower (``--pretrain``, ``--shared``, ``--blend``) is accepted.
    """
    from encoders.towers import resolve_model_path

    base_path, partner = resolve_model_path(base, settings.models_dir)
    if config.question_only:
        return _train_question_only(settings, data, config, base_path, partner, progress)
    result = train_stage(settings, data, config, base_path, settings.models_dir, progress)
    export_for_backends(settings, result.model_dir)
    return result


def train_stage(settings: Settings, data: TrainingData, config: TrainConfig, base_path: Path, models_dir: Path,
                progress: ProgressFn | None = None) -> TrainResult:
    """One training stage (``--pretrain``'s stage 1 first when asked) from ``base_path``, saved under
    ``models_dir`` without ONNX towers: ``train_model``'s, and each stage of `dpr train`'s recipe
    (``services.lab.towers.rounds``). Dense mining and denoising use ``base_path``'s towers unless
    ``data.mining.model`` names others."""
    from services.lab.towers.trainer import train

    if data.mining.model is None and (data.mining.source == "dense" or data.mining.denoise is not None):
        data = replace(data, mining=replace(data.mining, model=str(base_path)))  # the towers training starts from
    stage1 = pretrain_stage(settings, data, config, base_path, progress, models_dir) if data.pretrain else None
    if stage1 is not None:
        base_path = stage1.model_dir
    training = build_training_set(settings, replace(data, from_collection=None) if stage1 else data)
    result = train(training.pairs, models_dir, config, base=base_path, corpus=training.corpus or None,
                   dev=training.dev, data_info=training.info, progress=progress)
    if stage1 is not None:
        record_stages(result, stage1)
    return result


def _train_question_only(settings: Settings, data: TrainingData, config: TrainConfig, partner_path: Path,
                         partner: str, progress: ProgressFn | None) -> TrainResult:
    """`dpr train --question-only`: the labelled (or self-supervised) pairs, no mining, the partner's passage tower
    frozen (``services.lab.towers.question_only``)."""
    from services.lab.towers.question_only import check_config, train_question_only

    if data.pretrain is not None:
        raise ConfigError("--question-only keeps the passage tower, which the recipe's pretrain would train: drop one "
                          "of them")
    try:
        check_config(config)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    no_mining = replace(data, mining=replace(data.mining, num_negatives=0))  # the whole table is the negatives
    training = build_training_set(settings, no_mining)
    result = train_question_only(training.pairs, settings.models_dir, config, base=partner_path,
                                 partner_name=partner, corpus=training.corpus or None, dev=training.dev,
                                 data_info=training.info, progress=progress)
    export_for_backends(settings, result.model_dir)
    return result


def export_for_backends(settings: Settings, model_dir: Path) -> None:
    """The ONNX towers of a new model, made once now, unless every configured backend is torch."""
    from encoders.registry import export_model

    encoder = settings.encoder
    if {encoder.passages, encoder.questions} != {"torch"}:  # what the backends will read
        export_model(model_dir, settings.models_dir, settings.onnx_cache_dir)


def pretrain_stage(settings: Settings, data: TrainingData, config: TrainConfig, base: Path,
                   progress: ProgressFn | None, models_dir: Path | None = None) -> TrainResult:
    """Stage 1 of ``--pretrain``: self-supervised pairs of the target corpus (BM25 negatives as configured), saved
    as ``<name>-pretrain-<time>`` (a model of its own: the benchmark evaluates it too)."""
    from services.lab.towers.trainer import train

    source = data.corpus or data.data
    stage = replace(data, data=source if data.from_collection is None else None, self_supervised=data.pretrain,
                    max_pairs=data.pretrain_max_pairs, fmt="auto" if data.corpus else data.fmt)
    training = build_training_set(settings, stage)
    stage_config = replace(config, name=f"{config.name}-pretrain", epochs=data.pretrain_epochs)
    log.info("pretraining stage", extra={"pairs": len(training.pairs), "mode": data.pretrain})
    return train(training.pairs, models_dir or settings.models_dir, stage_config, base=base,
                 corpus=training.corpus or None, data_info=training.info, progress=progress)


def record_stages(result: TrainResult, stage1: TrainResult) -> None:
    """Both stages (data, steps, wall time, peak memory) in the fine-tuned model's card (not part of its
    fingerprint)."""
    from services.lab.shared.training_run import write_card

    def summary(stage: str, r: TrainResult) -> dict[str, Any]:
        c = r.card
        return {"stage": stage, "model": r.name, "data": c.get("training_data"), "steps": c.get("steps"),
                "epochs": c["hyperparameters"]["epochs"], "train_seconds": c.get("train_seconds"),
                "peak_rss_mib": c.get("peak_rss_mib"), "final_loss": c.get("final_loss")}

    result.card["stages"] = [summary("pretrain", stage1), summary("finetune", result)]
    write_card(result.model_dir, result.card)


def build_training_set(settings: Settings, data: TrainingData) -> TrainingSet:
    """Pairs (labelled or self-supervised) with hard negatives from their corpus: ranked by BM25 or by dense towers
    (``MiningConfig.source``), optionally denoised by the towers (``MiningConfig.denoise``)."""
    if data.self_supervised is not None or data.from_collection is not None:
        training = _self_supervised_set(settings, data)
    elif data.data is None and data.feedback:
        training = feedback_set(settings)
    elif data.data is None:
        raise ConfigError("give DATA: a BEIR folder, SQuAD JSON or labelled pairs JSONL")
    elif dataset_format(data.data, data.fmt) == "jsonl":
        training = _pairs_file_set(data.data, data)
    else:
        training = _labelled_set(data.data, data)
    if data.feedback and "feedback" not in training.info:  # beside DATA's pairs
        judged = feedback_set(settings)
        training.pairs = [*training.pairs, *judged.pairs]
        training.info["feedback"] = judged.info["feedback"]
    mining = data.mining
    info: dict[str, Any] = {**({"bm25": "bm25s"} if mining.source == "bm25" else {}), **{
        k: v for k, v in mining.__dict__.items() if v is not None and not (k == "source" and v == "bm25")}}
    if training.corpus:
        training.info["language"] = info["language"] = corpus_language(data.language, training.corpus)
    if mining.num_negatives and training.corpus:
        from services.lab.shared.mining import BM25Config, BM25Index, DenseIndex, Ranker, mine_hard_negatives

        if mining.source not in ("bm25", "dense"):
            raise ConfigError(f"hard negatives from {mining.source!r}: use bm25 or dense")
        docs = list(training.corpus.values())
        dense = None
        if mining.source == "dense" or mining.denoise is not None:
            dense = DenseIndex(docs, _mining_towers(settings, mining.model or "base"),
                               batch_size=settings.encoder.batch_size)
            info["model_fingerprint"] = dense.towers.fingerprint
        index: Ranker = dense if mining.source == "dense" and dense is not None else BM25Index(
            docs, BM25Config.for_language(info["language"]))
        training.pairs = mine_hard_negatives(training.pairs, index, training.corpus, mining, scorer=dense)
    training.info["mining"] = info
    return training


def _mining_towers(settings: Settings, spec: str) -> Any:
    """The towers that rank or denoise hard-negative candidates, on the configured passage backend."""
    from encoders.registry import load_towers

    return load_towers(spec, settings.models_dir, backend=settings.encoder.passages,
                       threads=settings.encoder.threads, cache_dir=settings.onnx_cache_dir)


def _self_supervised_set(settings: Settings, data: TrainingData) -> TrainingSet:
    if data.from_collection is not None:
        corpus = collection_corpus(settings, data.from_collection)
        dataset = f"collection:{data.from_collection}"
    elif data.data is not None:
        corpus = unlabelled_corpus(data.data, data.fmt)
        dataset = str(data.data)
    else:
        raise ConfigError("self-supervised training needs DATA (a corpus) or --from-collection")
    mode = data.self_supervised or "both"
    pairs = self_supervised_pairs(list(corpus.values()), mode, data.pair_config, seed=data.seed,
                                  max_pairs=data.max_pairs)
    info = {"dataset": dataset, "self_supervised": mode, "documents": len(corpus),
            **({"pair_config": asdict(data.pair_config)} if data.pair_config != PairConfig() else {})}
    return TrainingSet(pairs, corpus, info=info)


def feedback_set(settings: Settings) -> TrainingSet:
    """`dpr train --feedback`: the judgements stored with ``settings.collection`` as labelled pairs (a passage
    judged relevant is a positive, the passages judged not relevant to the same question its negatives:
    ``services.feedback.pairs_of``), over the collection's passages."""
    from services.feedback import collection_judged, no_pairs_error, pairs_of

    collection = settings.collection
    judgements, entries = collection_judged(settings)
    pairs = pairs_of(entries)
    if not pairs:
        raise no_pairs_error(collection, len(judgements))
    info = {"dataset": f"feedback:{collection}", "feedback": {
        "collection": collection, "judgements": len(judgements), "pairs": len(pairs),
        "questions": len({p.question for p in pairs}), "judged_negatives": sum(len(p.negatives) for p in pairs)}}
    return TrainingSet(pairs, collection_corpus(settings, collection), info=info)


def unlabelled_corpus(path: Path, fmt: str) -> Corpus:
    """The documents self-supervised pairs are built from: a BEIR folder's or a corpus JSONL's, or every paragraph
    of a SQuAD file (all articles: no question is read, as a BEIR corpus serves every split)."""
    if dataset_format(path, fmt) == "squad":
        return load_squad(path, "all").corpus
    return load_corpus(path)


def _pairs_file_set(path: Path, data: TrainingData) -> TrainingSet:
    corpus = load_corpus(data.corpus) if data.corpus else {}
    pairs = _capped(load_pairs_jsonl(path, corpus or None), data)
    return TrainingSet(pairs, corpus, info={"format": "jsonl", "dataset": str(path)})


def _labelled_set(path: Path, data: TrainingData) -> TrainingSet:
    """A BEIR or SQuAD split: ``dev_queries`` held out for dev metrics, one pair per judged (query, document)."""
    full = load_dataset(path, data.split, data.fmt)
    train_ds, dev = full.held_out(data.dev_queries)
    info = {
        "format": dataset_format(path, data.fmt),
        "dataset": full.name,
        "split": data.split,
        "train_queries": len(train_ds.queries),
        "dev_queries": len(dev.queries),
        "data_fingerprint": train_ds.fingerprint(),
    }
    return TrainingSet(_capped(labelled_pairs(train_ds), data), full.corpus, dev if dev.queries else None, info)


def _capped(pairs: list[TrainPair], data: TrainingData) -> list[TrainPair]:
    """At most ``max_pairs`` labelled pairs: a sample seeded with ``data.seed``, in the sample's order."""
    if data.max_pairs is None or len(pairs) <= data.max_pairs:
        return pairs
    return random.Random(data.seed).sample(pairs, data.max_pairs)


def collection_corpus(settings: Settings, collection: str) -> Corpus:
    """Passages of an ingested collection as a corpus (one entry per stored chunk)."""
    from services.store import open_store

    store = open_store(settings.for_collection(collection))
    corpus: Corpus = {}
    try:
        for batch in store.scroll():
            for p in batch:
                key = f"{p.doc_id}#{p.chunk_index}"
                corpus[key] = CorpusDoc(key, p.title, p.text)
    finally:
        store.close()
    if not corpus:
        raise ConfigError(f"collection {collection!r} holds no passages; ingest documents first (`dpr ingest PATH`)")
    return corpus
