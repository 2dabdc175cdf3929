"""Train a cross-encoder reranker, in the sentence-transformers order: model, data, loss, evaluator, arguments,
trainer, evaluate, save.

- Model: a ``CrossEncoder`` on the base model's encoder (all-MiniLM-L6-v2 from its wheel), or a trained towers
  model's passage tower (``encoder_to_start_from``), with a fresh one-logit classification head (no pretrained
  reranker installs here).
- Data: the towers' rows (``services.lab.shared.rows.pairs_to_columns``): question, positive, BM25 hard negatives.
- Loss (``RerankConfig.loss``): ``mnrl``, the cross-encoder (Cached)MultipleNegativesRankingLoss (listwise: the
  positive against the hard negatives and ``in_batch_negatives`` other passages of the batch); or ``bce``, pointwise
  binary cross-entropy on (question, positive, 1) and (question, hard negative, 0) rows, the positive weighted by the
  negatives per question (monoBERT's recipe; memory bounded by ``mini_batch_size`` rows per forward pass).
- Evaluator: the dev queries (carved from the training data): a first stage's top ``candidates`` (``first_stage``:
  a ``Retriever`` from ``services.lab.evaluation.retrieval``) reranked, nDCG@10 before and after; the gain decides
  whether the reranker is on by default (``services.lab.reranker.recipe``).
- Save: ``services.lab.shared.training_run.save_model`` (a versioned directory renamed into place), ``kind: reranker``
  in the card.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from encoders.data import CorpusDoc, RetrievalDataset, TrainPair
from encoders.rerank import DEFAULT_MAX_LENGTH, RERANKER_KIND, WEIGHTS, fuse_scores, score_with_model
from services.lab.evaluation.retrieval import Retrieval, Retriever, score_retrieval
from services.lab.shared.rows import pairs_to_columns
from services.lab.shared.training_run import (
    ProgressFn,
    TrainResult,
    base_record,
    card_fields,
    data_record,
    fit_in_scratch,
    precision_of,
    save_model,
    start_run,
    training_arguments,
    versioned_name,
)

log = logging.getLogger(__name__)

ScoreFn = Callable[[str, Sequence[str]], Any]  # (question, passages) -> (n,) scores


def encoder_to_start_from(path: Path) -> Path:
    """The encoder a reranker starts from: ``path`` as it is (a sentence-transformers or Hugging Face model
    directory), or, for towers that `dpr train` made (a ``Router``), their passage tower: the encoder that learnt
    the collection's passages. Its Transformer module's folder is a plain model a ``CrossEncoder`` loads."""
    router = path / "router_config.json"
    if not router.is_file():
        return path
    document = json.loads(router.read_text()).get("structure", {}).get("document") or []
    tower = next((path / m for m in document if (path / m / "config.json").is_file()), None)
    if tower is None:
        raise FileNotFoundError(f"{path} has towers but no passage-tower encoder (a 'document' route with a "
                                "config.json); give a model directory or 'base'")
    return tower


@dataclass
class RerankConfig:
    """Hyper-parameters of the reranker; the defaults fit one run in the CPU budget of the towers' recipe."""

    name: str = "rerank"
    epochs: float = 1.0
    batch_size: int = 16  # questions per batch
    in_batch_negatives: int = 3  # other passages of the batch each question is also scored against
    # (question, passage) pairs per forward pass (GradCache: the cached loss); 0: all of a batch's
    # batch_size x (1 + hard + in-batch negatives) pairs at once (measured: 18 GB peak RSS at 16 x 7 x 320 tokens)
    mini_batch_size: int = 16
    learning_rate: float = 2e-5
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    scale: float = 10.0
    loss: str = "mnrl"  # mnrl (listwise) | bce (pointwise)
    max_length: int = DEFAULT_MAX_LENGTH  # tokens of question + passage
    candidates: int = 50  # first-stage hits reranked on the dev split
    seed: int = 42
    max_steps: int = -1
    threads: int | None = None
    precision: str = "auto"  # auto: from the CPU (encoders.runtimes.training_precision); fp32 | bf16

    def validate(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.epochs <= 0 and self.max_steps <= 0:
            raise ValueError("set epochs > 0 or max_steps > 0")
        if self.candidates < 1:
            raise ValueError("candidates must be at least 1: the first-stage hits the reranker reorders")
        if self.loss not in LOSSES:
            raise ValueError(f"loss {self.loss!r} is not known; use {' or '.join(LOSSES)}")


LOSSES = ("mnrl", "bce")


def columns_to_rows(columns: dict[str, list[str]]) -> dict[str, list[Any]]:
    """The towers' (question, positive, negative_1..n) columns as pointwise (question, passage, label) rows: the
    positive labelled 1, each negative 0."""
    rows: dict[str, list[Any]] = {"question": [], "passage": [], "label": []}
    negatives = [k for k in columns if k.startswith("negative_")]
    for i, question in enumerate(columns["question"]):
        for key, label in [("positive", 1.0)] + [(k, 0.0) for k in negatives]:
            rows["question"].append(question)
            rows["passage"].append(columns[key][i])
            rows["label"].append(label)
    return rows


Heads = dict[str, tuple[list[str], list[str], list[float]]]  # qid -> (top N, the rest, the reranker's scores)


def _score_heads(score: ScoreFn, dataset: RetrievalDataset, first: Retrieval, candidates: int) -> Heads:
    """Each question's first-stage ranking cut at ``candidates``, the head scored once by the reranker."""
    heads: Heads = {}
    for qid, hits in first.run.items():
        ranked = sorted(hits, key=lambda d: -hits[d])
        head, tail = ranked[:candidates], ranked[candidates:]
        scores = score(dataset.queries[qid], [dataset.corpus[d].passage for d in head])  # (len(head),)
        heads[qid] = (head, tail, [float(x) for x in scores])
    return heads


def _reranked(heads: Heads, dataset: RetrievalDataset, first: Retrieval, weight: float) -> Retrieval:
    out = Retrieval(run={}, texts={})
    for qid, hits in first.run.items():
        head, tail, scores = heads[qid]
        fused = fuse_scores([hits[d] for d in head], scores, weight)
        order = [head[i] for i in sorted(range(len(head)), key=lambda i: -fused[i])] + tail
        out.run[qid] = {d: float(len(order) - r) for r, d in enumerate(order)}  # rank-based: the order is what counts
        out.texts[qid] = [dataset.corpus[d].passage for d in order]
    return out


def dev_rerank_metrics(score: ScoreFn, dev: RetrievalDataset, first_stage: Retriever,
                       candidates: int) -> dict[str, Any]:
    """nDCG@10 (and the other metrics) of the first stage and of its reranked top ``candidates`` on ``dev``, at
    the reranker weight (``encoders.rerank.WEIGHTS``) that scores best there; the dev nDCG@10 of every weight too."""
    first = first_stage(dev, max(100, candidates))
    before, _ = score_retrieval(dev, first)
    heads = _score_heads(score, dev, first, candidates)
    by_weight = {w: score_retrieval(dev, _reranked(heads, dev, first, w))[0] for w in WEIGHTS}
    weight = max(WEIGHTS, key=lambda w: (by_weight[w]["ndcg@10"], w))  # ties: the reranker's larger share
    after = by_weight[weight]
    return {"candidates": candidates, "queries": len(dev.queries), "before": before, "after": after,
            "weight": weight, "ndcg@10_by_weight": {f"{w:g}": round(m["ndcg@10"], 4) for w, m in by_weight.items()},
            "gain": round(after["ndcg@10"] - before["ndcg@10"], 4)}


def train_reranker(pairs: Sequence[TrainPair], models_dir: Path, config: RerankConfig, *, base: Path,
                   corpus: dict[str, CorpusDoc] | None, dev: RetrievalDataset | None, first_stage: Retriever,
                   first_stage_name: str, data_info: dict[str, Any], progress: ProgressFn | None) -> TrainResult:
    """Train a reranker on ``pairs`` and save it under ``models_dir`` (kind ``reranker``, with a card). ``base``: a
    plain encoder directory (a towers model's passage tower: ``encoder_to_start_from``, which
    ``services.lab.reranker.recipe`` applies before any mining)."""
    config.validate()
    started, t0 = start_run(config.threads, config.seed)
    import torch
    from datasets import Dataset
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer, CrossEncoderTrainingArguments
    from sentence_transformers.cross_encoder.losses import (
        BinaryCrossEntropyLoss,
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )
    # 1. model: the base encoder + a fresh one-logit head (the loaders' notes that the head is new and that a
    # sentence-transformers folder becomes a cross-encoder state the obvious: not for dpr's output)
    with _quiet_loaders():
        model = CrossEncoder(str(base), num_labels=1, max_length=config.max_length, device="cpu",
                             local_files_only=True)
    # 2. data, 3. loss
    columns = pairs_to_columns(pairs, corpus, config.seed)
    n_negatives = len(columns) - 2
    loss: Any
    extra: dict[str, Any] = {}
    if config.loss == "bce":  # rows, not questions: a batch is batch_size questions' rows, mini_batch_size at once
        columns = columns_to_rows(columns)
        loss = BinaryCrossEntropyLoss(model, pos_weight=torch.tensor(float(max(1, n_negatives))))
        total = config.batch_size * (1 + n_negatives)
        step_rows = min(total, config.mini_batch_size) if config.mini_batch_size > 0 else total
        extra = {"per_device_train_batch_size": step_rows,
                 "gradient_accumulation_steps": max(1, -(-total // step_rows)),
                 "batch_sampler": BatchSamplers.BATCH_SAMPLER}  # rows of one question may share a batch
    elif config.mini_batch_size > 0:  # bounded memory: pairs in mini-batches, gradients cached
        loss = CachedMultipleNegativesRankingLoss(model, num_negatives=config.in_batch_negatives, scale=config.scale,
                                                  mini_batch_size=config.mini_batch_size)
    else:
        loss = MultipleNegativesRankingLoss(model, num_negatives=config.in_batch_negatives,
                                           scale=config.scale)  # type: ignore[arg-type]  # annotated int, is float
    # 4. evaluator
    score: ScoreFn = lambda q, ps: score_with_model(model, q, ps)  # noqa: E731
    # 5. arguments, 6. trainer
    steps, losses = fit_in_scratch(model, lambda out: training_arguments(CrossEncoderTrainingArguments, config, out,
                                                                         **extra),
                                   Dataset.from_dict(columns), loss, progress, trainer_class=CrossEncoderTrainer,
                                   prefix="dpr-rerank-")
    train_seconds = time.perf_counter() - t0
    # 7. evaluate
    model.eval()
    dev_metrics = (dev_rerank_metrics(score, dev, first_stage, config.candidates)
                   if dev is not None and dev.queries else None)
    if dev_metrics is not None:
        dev_metrics["first_stage"] = first_stage_name
        log.info("reranker dev metrics", extra={"dev": dev_metrics})
    # 8. save
    card: dict[str, Any] = {
        "kind": RERANKER_KIND,
        "format": "sentence-transformers cross-encoder",
        "similarity": None,
        "max_length": config.max_length,
        **card_fields(
            base=base_record(base, head=starting_head(base)),
            training_data=data_record(pairs, data_info, hard_negatives_per_pair=n_negatives),
            hyperparameters={**asdict(config), "precision": precision_of(config),
                             "loss": f"cross_encoder.{type(loss).__name__}"},
            seed=config.seed, started=started, train_seconds=train_seconds, steps=steps, losses=losses,
            dev_metrics=dev_metrics,
        ),
        "default_on": bool(dev_metrics and dev_metrics["gain"] > 0),
    }
    return save_model(model, models_dir, versioned_name(config.name, started), card, losses)


def starting_head(base: Path) -> str:
    """What the reranker's head started from: a reranker given as ``--base`` keeps (and continues) its trained
    head; any other encoder gets a fresh one."""
    config = base / "config.json"
    architectures = json.loads(config.read_text()).get("architectures") or [] if config.is_file() else []
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "continued: the base reranker's trained head"
    return "fresh 1-logit classifier"


@contextmanager
def _quiet_loaders() -> Iterator[None]:
    """transformers' load report and sentence-transformers' notes at ERROR level only, for the block."""
    from transformers.utils import logging as hf_logging

    st = logging.getLogger("sentence_transformers")
    verbosity, level = hf_logging.get_verbosity(), st.level
    hf_logging.set_verbosity_error()
    st.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        st.setLevel(level)
