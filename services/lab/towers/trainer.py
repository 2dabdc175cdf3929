"""Train DPR towers with sentence-transformers, in its order: model, data, loss, evaluator, arguments, trainer,
evaluate, save.

- Model: two towers (question, passage), both initialised from the base model, behind a ``Router`` so that one saved
  model serves ``encode_query`` and ``encode_document``; ``shared=True`` keeps one tower for both.
- Data: (question, positive, negative_1..n) rows; negatives are BM25 hard negatives (``services.lab.shared.mining``).
- Loss: MultipleNegativesRankingLoss (in-batch negatives plus the hard negatives), or its GradCache variant
  (CachedMultipleNegativesRankingLoss) when ``mini_batch_size`` is below ``batch_size``: large effective batches in
  the memory of a mini-batch. Batches come from the no-duplicates sampler (a passage twice in a batch would be its
  own false negative).
- Output: ``models_dir/<name>-YYYYmmdd-HHMMSS`` with the model, ``model_card.json`` and ``metrics.json``; written to a
  temporary directory and renamed into place, so a half-written model is never listed.

torch, datasets and sentence_transformers are imported inside functions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from encoders.data import CorpusDoc, RetrievalDataset, TrainPair
from encoders.towers import base_model_path, offline
from services.lab.shared.rows import fit_answers, pairs_to_columns
from services.lab.shared.training_run import (
    ProgressFn,
    TrainResult,
    base_record,
    card_fields,
    data_record,
    fit_towers,
    learn_device,
    precision_of,
    save_model,
    start_run,
    versioned_name,
)
from services.lab.towers.wise_ft import blend_with_pretrained, pretrained_root

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """Hyper-parameters. Defaults: the SciFact benchmark recipe (benchmarks/results/quality.md), fixed up front
    from measured SciFact runs and the CPU budget (one run < ~20 min on 2 idle cores), and checked on a dev split of
    100 held-out train queries; the test split only reports."""

    name: str = "dpr"
    shared: bool = False  # one tower for questions and passages instead of two
    epochs: float = 4.0
    batch_size: int = 32  # in-batch negatives per question = batch_size - 1 (+ the hard negatives)
    mini_batch_size: int = 0  # 0 < m < batch_size: GradCache (cached MNRL) in mini-batches of m; else plain MNRL
    learning_rate: float = 3e-5
    warmup_ratio: float = 0.1
    scheduler: str = "linear"
    weight_decay: float = 0.01
    scale: float = 20.0  # MNRL temperature: logits = scale * cosine
    max_query_tokens: int = 64
    max_passage_tokens: int | None = None  # what the saved passage tower reads (inference); None: the base's own
    train_passage_tokens: int | None = 128  # passages are cut to this while training (cost ~ length); None: max
    # a positive whose answer (SQuAD-style pairs) lies past the training length is cut to a window around the answer
    # instead of to its start, the title kept: a positive cut before its answer teaches the towers the wrong thing
    answer_windows: bool = True
    seed: int = 42
    max_steps: int = -1  # > 0 overrides epochs (tests)
    threads: int | None = None
    precision: str = "auto"  # auto: from the CPU (encoders.runtimes.training_precision); fp32 | bf16
    # word embeddings left as they are: None (auto) freezes them for a large vocabulary (multilingual's 250k pieces
    # are 96M of its 118M parameters: their gradients and AdamW state dominate a CPU step, and a few thousand
    # pairs cannot move most rows anyway)
    freeze_embeddings: bool | None = None
    dev_baseline: bool = False  # also measure the dev split before training (the card gets both)
    # WiSE-FT (Wortsman et al. 2022): save blend x trained + (1 - blend) x the weights of the pretrained model the
    # lineage started from (the first model without a dpr training card); keeps more of its out-of-domain quality
    blend: float | None = None
    # only the question tower learns; the passage tower stays the base's (``services.lab.towers.question_only``): the
    # model serves the points the base's passage tower embedded, with no re-embed
    question_only: bool = False

    @property
    def cached(self) -> bool:
        return 0 < self.mini_batch_size < self.batch_size

    def validate(self) -> None:
        if self.batch_size < 2:
            raise ValueError("batch_size must be at least 2: in-batch negatives need other questions in the batch")
        if self.epochs <= 0 and self.max_steps <= 0:
            raise ValueError("set epochs > 0 or max_steps > 0")
        if self.learning_rate <= 0:
            raise ValueError("learning_rate must be positive")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError("warmup_ratio must lie in [0, 1)")
        if self.blend is not None and not 0 < self.blend <= 1:
            raise ValueError(f"blend must lie in (0, 1] (the trained weights' share), got {self.blend}")


# --- model ----------------------------------------------------------------------------------------------------


def build_model(base: Path, shared: bool, max_query_tokens: int, max_passage_tokens: int | None) -> Any:
    """The towers to train, both initialised from ``base``.

    Separate towers: ``Router(query=[Transformer, Pooling], document=[Transformer, Pooling]) -> Normalize``; a
    ``base`` that already has them (``--base`` an earlier model, the second stage of ``--pretrain``) goes on as is.
    Shared: the base model as is (its ``encode_query`` and ``encode_document`` are the same tower).
    ``max_passage_tokens`` None keeps the base's own passage length (multilingual-e5: 512; MiniLM: 256).
    """
    offline()
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Router

    device = learn_device()

    if shared:
        model = SentenceTransformer(str(base), device=device, local_files_only=True)
        if any(isinstance(m, Router) for m in model):
            raise ValueError(f"{base} has separate towers; it cannot be trained as one shared tower (drop --shared)")
        if max_passage_tokens:
            model.max_seq_length = max_passage_tokens
        return model
    trained = SentenceTransformer(str(base), device=device, local_files_only=True)
    router: Any = next((m for m in trained if isinstance(m, Router)), None)
    if router is not None:  # an earlier `dpr train` model: continue from its two towers as they are
        router.sub_modules["query"][0].max_seq_length = max_query_tokens
        if max_passage_tokens:
            router.sub_modules["document"][0].max_seq_length = max_passage_tokens
        return trained
    query = trained
    document = SentenceTransformer(str(base), device=device, local_files_only=True)
    query_modules: list[Any] = [m for m in query if not isinstance(m, Normalize)]  # [Transformer, Pooling]
    document_modules: list[Any] = [m for m in document if not isinstance(m, Normalize)]
    query_modules[0].max_seq_length = max_query_tokens
    if max_passage_tokens:
        document_modules[0].max_seq_length = max_passage_tokens
    router = Router.for_query_document(query_modules=query_modules, document_modules=document_modules)
    prompts = {k: v or "" for k, v in trained.prompts.items()}
    model = SentenceTransformer(modules=[router, Normalize()], device=device, similarity_fn_name="cosine",
                                prompts=prompts, default_prompt_name=trained.default_prompt_name)
    return model  # the base's prompts kept (multilingual-e5: "query: " / "passage: "), in training and after


LARGE_VOCABULARY = 100_000  # freeze_embeddings=None freezes word embeddings at or above this many rows


def freeze_word_embeddings(model: Any, freeze: bool | None) -> int:
    """Stop training the towers' word embeddings (``freeze``; None: only for a vocabulary of ``LARGE_VOCABULARY``
    rows or more). Returns the parameters frozen."""
    frozen = 0
    for module in model.modules():
        table = getattr(module, "word_embeddings", None)
        weight = getattr(table, "weight", None)
        if weight is None or not weight.requires_grad:
            continue
        if freeze or (freeze is None and weight.shape[0] >= LARGE_VOCABULARY):
            weight.requires_grad_(False)
            frozen += weight.numel()
    return frozen


def passage_transformer(model: Any, shared: bool) -> Any:
    """The passage tower's Transformer module (the shared tower's, when there is one): its ``max_seq_length`` is
    what the tower reads, its ``tokenizer`` how it splits text."""
    return model[0] if shared else model[0].sub_modules["document"][0]


def set_passage_tokens(model: Any, tokens: int, shared: bool) -> None:
    passage_transformer(model, shared).max_seq_length = tokens


def _prompt_tokens(model: Any, shared: bool) -> int:
    """Tokens the passage tower spends on its special tokens and its prompt (multilingual-e5: ``passage: ``)."""
    prompt = (model.prompts or {}).get("document") or ""
    return len(passage_transformer(model, shared).tokenizer(prompt, add_special_tokens=True)["input_ids"])


# --- training -------------------------------------------------------------------------------------------------


def train(
    pairs: Sequence[TrainPair],
    models_dir: Path,
    config: TrainConfig | None = None,
    *,
    base: Path | None = None,
    corpus: dict[str, CorpusDoc] | None = None,
    dev: RetrievalDataset | None = None,
    data_info: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
) -> TrainResult:
    """Train towers on ``pairs`` and save them under ``models_dir``; returns the new model directory.

    ``dev``: held-out queries (carved from the training data) evaluated in memory after training (and before, with
    ``config.dev_baseline``); the numbers go into the model card. ``data_info`` is recorded in the card as is.
    ``config.question_only`` is ``services.lab.towers.question_only.train_question_only``'s (which reuses
    ``build_model``).
    """
    config = config or TrainConfig()
    config.validate()
    base = base or base_model_path()
    if config.question_only:
        raise ValueError("question-only training is services.lab.towers.question_only.train_question_only: "
                         "its own recipe")
    started, t0 = start_run(config.threads, config.seed)
    from datasets import Dataset

    # 1. model
    model = build_model(base, config.shared, config.max_query_tokens, config.max_passage_tokens)
    passage_max = int(passage_transformer(model, config.shared).max_seq_length)
    config = replace(config, max_passage_tokens=passage_max)  # the card records what the saved tower reads
    train_tokens = min(config.train_passage_tokens or passage_max, passage_max)
    set_passage_tokens(model, train_tokens, config.shared)
    frozen = freeze_word_embeddings(model, config.freeze_embeddings)
    # 2. data
    windowed = 0
    if config.answer_windows:
        budget = train_tokens - _prompt_tokens(model, config.shared)
        pairs, windowed = fit_answers(pairs, passage_transformer(model, config.shared).tokenizer, budget)
    columns = pairs_to_columns(pairs, corpus, config.seed)
    config = bounded_memory(config, len(columns) - 2)
    # 3. loss
    loss = _loss(model, config)
    # 4. evaluator: the dev split, in memory (the same code path as `dpr eval`'s in-memory systems)
    dev_before = None
    if config.dev_baseline:
        set_passage_tokens(model, passage_max, config.shared)
        dev_before = _dev_metrics(model, dev, "before")
        set_passage_tokens(model, train_tokens, config.shared)
    # 5. arguments, 6. trainer
    steps, losses = fit_towers(model, config, list(columns), Dataset.from_dict(columns), loss, progress)
    train_seconds = time.perf_counter() - t0
    set_passage_tokens(model, passage_max, config.shared)
    blended = blend_with_pretrained(model, pretrained_root(base), config.blend) if config.blend is not None else None
    # 7. evaluate
    dev_after = _dev_metrics(model, dev, "after")
    # 8. save
    card: dict[str, Any] = {
        "towers": "shared" if config.shared else "separate (Router: query, document)",
        **({"blended_with": blended} if blended is not None else {}),
        **card_fields(
            base=base_record(base),
            training_data=data_record(pairs, data_info, hard_negatives_per_pair=len(columns) - 2,
                                      positives_cut_around_answer=windowed),
            hyperparameters={**asdict(config), "precision": precision_of(config),
                             "loss": type(loss).__name__, "batch_sampler": "no_duplicates",
                             "frozen_embedding_parameters": frozen},
            seed=config.seed, started=started, train_seconds=train_seconds, steps=steps, losses=losses,
            dev_metrics={"before": dev_before, "after": dev_after} if dev_after is not None else None,
        ),
    }
    return save_model(model, models_dir, versioned_name(config.name, started), card, losses)


AUTO_MINI_BATCH = 16  # what the mining rounds use with 3 negatives: peak 2.9-3.5 GB on SciFact


def bounded_memory(config: TrainConfig, negatives: int) -> TrainConfig:
    """Rows with more than one hard negative go through GradCache in mini-batches of ``AUTO_MINI_BATCH`` unless
    ``mini_batch_size`` says otherwise: the same gradients as plain MNRL, with memory bounded by the mini-batch
    instead of growing with batch x (2 + negatives) texts (feedback's up to 4 judged negatives + 1 mined took plain
    MNRL to 8.7 GB at batch 32; the fine-tune's 1 negative stays plain, at 4.8 GB)."""
    if negatives <= 1 or config.cached or config.mini_batch_size or config.batch_size <= AUTO_MINI_BATCH:
        return config
    log.info("several hard negatives per row: cached loss in mini-batches",
             extra={"negatives": negatives, "mini_batch_size": AUTO_MINI_BATCH})
    return replace(config, mini_batch_size=AUTO_MINI_BATCH)


def _loss(model: Any, config: TrainConfig) -> Any:
    """In-batch negatives (+ hard negatives); GradCache when the batch is split into mini-batches."""
    from sentence_transformers.sentence_transformer.losses import (
        CachedMultipleNegativesRankingLoss,
        MultipleNegativesRankingLoss,
    )

    if config.cached:
        return CachedMultipleNegativesRankingLoss(model, scale=config.scale, mini_batch_size=config.mini_batch_size)
    return MultipleNegativesRankingLoss(model, scale=config.scale)


def _dev_metrics(model: Any, dev: RetrievalDataset | None, when: str) -> dict[str, float] | None:
    if dev is None or not dev.queries:
        return None
    from services.lab.evaluation.retrieval import evaluate_model_in_memory

    metrics = evaluate_model_in_memory(model, dev)
    log.info("dev %s training", when, extra={"metrics": metrics})
    return metrics
