"""Train DPR towers with sentence-transformers, in its order: model, data, loss, evaluator, arguments, trainer,
evaluate, save.

- Model: two towers (question, passage), both initialised from the base model, behind a ``Router`` so that one saved
  model serves ``encode_query`` and ``encode_document``; ``shared=True`` keeps one tower for both.
- Data: (question, positive, negative_1..n) rows; negatives are BM25 hard negatives (``encoders.mining``).
- Loss: MultipleNegativesRankingLoss (in-batch negatives plus the hard negatives), or its GradCache variant
  (CachedMultipleNegativesRankingLoss) when ``mini_batch_size`` is below ``batch_size``: large effective batches in
  the memory of a mini-batch. Batches come from the no-duplicates sampler (a passage twice in a batch would be its
  own false negative).
- Output: ``models_dir/<name>-YYYYmmdd-HHMMSS`` with the model, ``model_card.json`` and ``metrics.json``; written to a
  temporary directory and renamed into place, so a half-written model is never listed.

torch, datasets and sentence_transformers are imported inside functions.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from encoders.blend import blend_with_pretrained, pretrained_root
from encoders.data import CorpusDoc, RetrievalDataset, TrainPair
from encoders.towers import base_model_path, model_fingerprint
from encoders.training_run import (
    ProgressFn,
    TrainResult,
    fit,
    offline,
    peak_rss_mib,
    save_model,
    start_run,
    training_arguments,
    versioned_name,
)

if TYPE_CHECKING:
    from encoders.rerank import Reranker

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
    # word embeddings left as they are: None (auto) freezes them for a large vocabulary (multilingual's 250k pieces
    # are 96M of its 118M parameters: their gradients and AdamW state dominate a CPU step, and a few thousand
    # pairs cannot move most rows anyway)
    freeze_embeddings: bool | None = None
    dev_baseline: bool = False  # also measure the dev split before training (the card gets both)
    # WiSE-FT (Wortsman et al. 2022): save blend x trained + (1 - blend) x the weights of the pretrained model the
    # lineage started from (the first model without a dpr training card); keeps more of its out-of-domain quality
    blend: float | None = None
    # with a teacher (a trained reranker, ``train(teacher=...)``): MNRL + distill_weight x KL(teacher || towers) over
    # each question's own candidates, the teacher's scores softened by distill_temperature (``encoders.distill``)
    distill_weight: float = 1.0
    distill_temperature: float = 1.0
    distill_negatives_only: bool = False  # the KL term over the hard negatives alone (the positive is the label's)

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
        if self.distill_weight <= 0 or self.distill_temperature <= 0:
            raise ValueError("distill_weight and distill_temperature must be positive")


# --- model ----------------------------------------------------------------------------------------------------


def build_model(base: Path, shared: bool, max_query_tokens: int, max_passage_tokens: int | None,
                device: str = "cpu") -> Any:
    """The towers to train, both initialised from ``base``.

    Separate towers: ``Router(query=[Transformer, Pooling], document=[Transformer, Pooling]) -> Normalize``; a
    ``base`` that already has them (``--base`` an earlier model, the second stage of ``--pretrain``) goes on as is.
    Shared: the base model as is (its ``encode_query`` and ``encode_document`` are the same tower).
    ``max_passage_tokens`` None keeps the base's own passage length (multilingual-e5: 512; MiniLM: 256).
    """
    offline()
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Router

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


# --- data -----------------------------------------------------------------------------------------------------


def fit_answers(pairs: Sequence[TrainPair], tokenizer: Any, budget: int) -> tuple[list[TrainPair], int]:
    """Positives whose first answer occurrence ends past ``budget`` tokens, cut to ``budget`` tokens around it.

    Training cuts each passage to its first ``train_passage_tokens`` tokens; a SQuAD or KorQuAD paragraph longer
    than that often has its answer past the cut (SQuAD dev on MiniLM at 128 tokens: 13% of pairs; KorQuAD on
    multilingual-e5: 39%), and the question is then taught to match a passage that does not answer it. Such a
    positive becomes its title line (the text before the first newline, as chunks carry it) and a window of the
    body with the answer in its middle, which is what a chunk of the ingested paragraph holding the answer looks
    like. Pairs without answers, or whose answer already fits, stay as they are. Returns the pairs and how many
    were cut.
    """
    out: list[TrainPair] = []
    cut = 0
    for pair in pairs:
        window = _answer_window(pair, tokenizer, budget) if pair.answers else None
        if window is None:
            out.append(pair)
        else:
            out.append(replace(pair, positive=window))
            cut += 1
    if cut:
        log.info("positives cut around their answers", extra={"pairs": cut, "budget_tokens": budget})
    return out, cut


def _answer_window(pair: TrainPair, tokenizer: Any, budget: int) -> str | None:
    text = pair.positive
    spans = [(i, i + len(a)) for a in pair.answers if a and (i := text.find(a)) >= 0]
    if not spans or budget < 8:
        return None
    a_start, a_end = min(spans)
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    ends = [e for _, e in offsets]
    if len(offsets) <= budget or ends[budget - 1] >= a_end:
        return None  # the whole passage, or the answer, fits in the cut training makes anyway
    newline = text.find("\n")
    head = text[: newline + 1] if 0 <= newline < a_start else ""
    first = sum(1 for e in ends if e <= len(head))  # tokens of the title line
    room = budget - first
    answer_tokens = [k for k, (s, e) in enumerate(offsets) if e > a_start and s < a_end]
    if room < len(answer_tokens) + 2:
        return None  # no window of the body can hold the answer
    lo, hi = answer_tokens[0], answer_tokens[-1] + 1
    start = max(first, min(lo - (room - (hi - lo)) // 2, len(offsets) - room))
    end = min(len(offsets), start + room)
    return head + text[offsets[start][0]: offsets[end - 1][1]]


def pairs_to_columns(
    pairs: Sequence[TrainPair], corpus: dict[str, CorpusDoc] | None, seed: int
) -> dict[str, list[str]]:
    """(question, positive, negative_1..n) columns. n is the most negatives any pair has; a pair with fewer gets
    random corpus passages (plain random negatives) so that every row has the same columns."""
    if not pairs:
        raise ValueError("no training pairs")
    n_neg = max(len(p.negatives) for p in pairs)
    rng = random.Random(seed)
    pool = [d.passage for d in corpus.values()] if corpus else sorted({p.positive for p in pairs})
    columns: dict[str, list[str]] = {"question": [], "positive": []}
    for i in range(n_neg):
        columns[f"negative_{i + 1}"] = []
    filled = 0
    for p in pairs:
        columns["question"].append(p.question)
        columns["positive"].append(p.positive)
        negatives = list(p.negatives)
        while len(negatives) < n_neg:
            candidate = rng.choice(pool)
            if candidate != p.positive and candidate not in negatives:
                negatives.append(candidate)
                filled += 1
        for i, text in enumerate(negatives[:n_neg]):
            columns[f"negative_{i + 1}"].append(text)
    if filled:
        log.info("padded short negative lists with random passages", extra={"random_negatives": filled})
    return columns


def pairs_fingerprint(pairs: Sequence[TrainPair]) -> str:
    h = hashlib.sha256()
    for p in pairs:
        h.update(p.question.encode())
        h.update(b"\x1f")
        h.update(hashlib.sha256(p.positive.encode()).digest())
        for n in p.negatives:
            h.update(hashlib.sha256(n.encode()).digest())
        h.update(b"\n")
    return h.hexdigest()[:16]


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
    teacher: Reranker | None = None,
) -> TrainResult:
    """Train towers on ``pairs`` and save them under ``models_dir``; returns the new model directory.

    ``dev``: held-out queries (carved from the training data) evaluated in memory after training (and before, with
    ``config.dev_baseline``); the numbers go into the model card. ``data_info`` is recorded in the card as is.
    ``teacher``: a reranker whose scores of each row's candidates the towers also learn (``encoders.distill``).
    """
    config = config or TrainConfig()
    config.validate()
    if teacher is not None and config.cached:
        raise ValueError("distillation runs the plain loss, not GradCache: drop --mini-batch-size (or set it to 0)")
    base = base or base_model_path()
    started, t0 = start_run(config.threads, config.seed)
    import torch
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
    labels: dict[str, list[list[float]]] = {}
    distilled: dict[str, Any] | None = None
    if teacher is not None:  # scored on the texts the towers train on (answer windows included)
        from encoders.distill import teacher_scores

        labels["label"], summary = teacher_scores(teacher.score, columns, config.distill_negatives_only)
        distilled = {"teacher": teacher.name, "fingerprint": teacher.fingerprint, "backend": teacher.backend,
                     **summary}
    # 3. loss
    loss = _loss(model, config, distil=teacher is not None)
    # 4. evaluator: the dev split, in memory (the same code path as `dpr eval`'s in-memory systems)
    dev_before = None
    if config.dev_baseline:
        set_passage_tokens(model, passage_max, config.shared)
        dev_before = _dev_metrics(model, dev, "before")
        set_passage_tokens(model, train_tokens, config.shared)
    # 5. arguments, 6. trainer
    out_tmp = Path(tempfile.mkdtemp(prefix="dpr-train-"))
    try:
        args = _arguments(config, list(columns), out_tmp, dict(model.prompts or {}))
        steps, losses = fit(model, args, Dataset.from_dict({**columns, **labels}), loss, progress)
    finally:
        shutil.rmtree(out_tmp, ignore_errors=True)
    train_seconds = time.perf_counter() - t0
    set_passage_tokens(model, passage_max, config.shared)
    blended = blend_with_pretrained(model, pretrained_root(base), config.blend) if config.blend is not None else None
    # 7. evaluate
    dev_after = _dev_metrics(model, dev, "after")
    # 8. save
    card: dict[str, Any] = {
        "towers": "shared" if config.shared else "separate (Router: query, document)",
        "base": {"path": str(base), "fingerprint": model_fingerprint(base)},
        **({"blended_with": blended} if blended is not None else {}),
        **({"distilled_from": distilled} if distilled is not None else {}),
        "training_data": {**(data_info or {}), "pairs": len(pairs), "hard_negatives_per_pair": len(columns) - 2,
                          "positives_cut_around_answer": windowed,
                          "fingerprint": pairs_fingerprint(pairs)},
        "hyperparameters": {**{k: v for k, v in asdict(config).items() if teacher or not k.startswith("distill_")},
                            "loss": type(loss).__name__, "batch_sampler": "no_duplicates",
                            "frozen_embedding_parameters": frozen},
        "seed": config.seed,
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "train_seconds": round(train_seconds, 1),
        "peak_rss_mib": peak_rss_mib(),
        "steps": steps,
        "final_loss": losses[-1] if losses else None,
        "dev_metrics": {"before": dev_before, "after": dev_after} if dev_after is not None else None,
        "environment": {"python": platform.python_version(), "torch": torch.__version__},
    }
    return save_model(model, models_dir, versioned_name(config.name, started), card, losses)


def _loss(model: Any, config: TrainConfig, distil: bool = False) -> Any:
    """In-batch negatives (+ hard negatives); GradCache when the batch is split into mini-batches; plus the
    teacher's KL term when distilling."""
    if distil:
        from encoders.distill import DistilledMNRL

        return DistilledMNRL(model, config.scale, config.distill_weight, config.distill_temperature,
                             config.distill_negatives_only)
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
    from encoders.evaluate import evaluate_model_in_memory

    metrics = evaluate_model_in_memory(model, dev)
    log.info("dev %s training", when, extra={"metrics": metrics})
    return metrics


def _arguments(config: TrainConfig, columns: list[str], output_dir: Path, prompts: dict[str, str]) -> Any:
    """``prompts``: the model's own (``query`` / ``document``), put before each column's texts as at inference."""
    from sentence_transformers import SentenceTransformerTrainingArguments

    roles = {c: ("query" if c == "question" else "document") for c in columns}
    router_mapping = {} if config.shared else roles
    column_prompts = {c: prompts.get(role, "") for c, role in roles.items()}
    return training_arguments(SentenceTransformerTrainingArguments, config, output_dir,
                              lr_scheduler_type=config.scheduler, router_mapping=router_mapping,
                              prompts=column_prompts if any(column_prompts.values()) else None)
