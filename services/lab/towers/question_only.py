"""Question-only training: the question tower learns, the passage tower stays its partner's, byte for byte.

The new model shares its partner's passage fingerprint (``encoders.towers.PASSAGE_TOWER_FILE``), so it serves the
points the partner's passage tower embedded: activating it needs no re-embed, and rollback is the ACTIVE pointer.

The recipe, in the sentence-transformers order:

- Model: the partner's towers behind a ``Router`` (a shared-tower partner such as the base is split into a question
  tower and a passage tower, both its copies); every parameter of the passage side is frozen.
- Data: each pair's question, and the row of its positive in a table of passages (the corpus, plus any positive or
  negative text it lacks) that the frozen passage tower encodes **once**, at its full inference length: a step
  then runs the question tower alone, where a frozen tower inside the trainer would encode batch x (1 + negatives)
  passages again at every step.
- Loss: softmax over the whole table (every corpus passage is a negative; the question's other labelled positives
  are masked), ``scale`` x cosine, cross-entropy on the positive's row; or, for a pair given soft targets (a
  teacher's scores over some corpus passages), KL divergence to the teacher's softmax over those passages.
- Evaluate: the dev queries against the same table, before and after (no passage is encoded again).
- Save: with ``passage_tower.json`` naming the partner, after checking that the passage weights are unchanged.

torch, datasets and sentence_transformers are imported inside functions.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from encoders.data import CorpusDoc, RetrievalDataset, TrainPair
from encoders.towers import PASSAGE_TOWER_FILE, model_fingerprint, passage_fingerprint, read_model_card
from services.lab.shared.training_run import (
    base_record,
    card_fields,
    data_record,
    fit_towers,
    precision_of,
    save_model,
    start_run,
    versioned_name,
)

if TYPE_CHECKING:
    from services.lab.shared.training_run import ProgressFn, TrainResult
    from services.lab.towers.trainer import TrainConfig

log = logging.getLogger(__name__)

ENCODE_BATCH = 64  # passages per forward pass when the table is encoded (no gradients: memory is small)


def check_config(config: TrainConfig) -> None:
    """Settings that would change the passage tower, or that have no meaning without its gradients."""
    if config.shared:
        raise ValueError("--question-only keeps the passage tower and trains a separate question tower: set the "
                         "recipe's shared = false")
    if config.blend is not None:
        raise ValueError("--question-only cannot blend (the recipe's blend): blending moves the passage tower's "
                         "weights too")
    if config.max_passage_tokens is not None:
        raise ValueError("--question-only keeps the partner's passage length; drop max_passage_tokens")


def partner_record(base: Path, name: str | None = None) -> dict[str, Any]:
    """The partner a question-only model shares its passage tower with (the card's ``partner``)."""
    card = read_model_card(base)
    return {"name": name or card.get("name") or base.name, "path": str(base),
            "fingerprint": model_fingerprint(base), "passage_fingerprint": passage_fingerprint(base)}


# --- model ----------------------------------------------------------------------------------------------------


def build_question_only_model(base: Path, max_query_tokens: int) -> Any:
    """The partner's towers as a Router model with the passage side frozen."""
    from services.lab.towers.trainer import build_model

    model = build_model(base, shared=False, max_query_tokens=max_query_tokens, max_passage_tokens=None)
    for param in document_tower(model).parameters():
        param.requires_grad_(False)
    return model


def document_tower(model: Any) -> Any:
    """The passage side of a Router model (a module list: Transformer, Pooling)."""
    return model[0].sub_modules["document"]


def passage_state(model: Any) -> dict[str, Any]:
    """A copy of the passage side's tensors (to prove they did not move)."""
    return {k: v.detach().clone() for k, v in document_tower(model).state_dict().items()}


def check_passage_unchanged(model: Any, before: dict[str, Any]) -> None:
    import torch

    after = document_tower(model).state_dict()
    moved = [k for k, v in before.items() if not torch.equal(v, after[k])]
    if moved or set(after) != set(before):
        raise RuntimeError(f"question-only training moved the passage tower ({len(moved)} tensors); not saved")


# --- data -----------------------------------------------------------------------------------------------------


def passage_table(pairs: Sequence[TrainPair], corpus: dict[str, CorpusDoc] | None) -> tuple[list[str], list[str]]:
    """(texts, doc ids): the corpus's passages in doc-id order, then every positive or negative text the corpus
    lacks (doc id ""). Each text appears once, where it first came."""
    table: dict[str, str] = {}  # text -> doc id, in order
    for doc_id, doc in sorted((corpus or {}).items()):
        table.setdefault(doc.passage, doc_id)
    for p in pairs:
        for text in (p.positive, *p.negatives):
            table.setdefault(text, "")
    return list(table), list(table.values())


def targets(pairs: Sequence[TrainPair], texts: Sequence[str]) -> tuple[list[int], list[list[int]]]:
    """Per pair: its positive's row, and the rows of the same question's other positives (masked in its softmax:
    they are right answers, not negatives)."""
    row = {t: i for i, t in enumerate(texts)}
    by_question: dict[str, set[int]] = {}
    for p in pairs:
        by_question.setdefault(p.question, set()).add(row[p.positive])
    positives = [row[p.positive] for p in pairs]
    others = [sorted(by_question[p.question] - {row[p.positive]}) for p in pairs]
    return positives, others


def encode_table(model: Any, texts: Sequence[str]) -> Any:
    """The frozen passage tower over ``texts``: (n, dim) float32 tensor, L2-normalised (the model's Normalize)."""
    import torch

    model.eval()
    with torch.no_grad():
        vectors = model.encode_document(list(texts), batch_size=ENCODE_BATCH, convert_to_tensor=True,
                                        show_progress_bar=False)  # (n, dim)
    return vectors.detach().float().cpu().clone()  # encode() runs in inference mode: a plain tensor for autograd


# --- loss -----------------------------------------------------------------------------------------------------


def soft_rows(soft_targets: Sequence[tuple[Sequence[str], Sequence[float]] | None], row: dict[str, int],
              ) -> tuple[list[list[int]], list[list[float]], list[bool]] | None:
    """Per pair, the table rows of its soft-target candidates (corpus doc ids; ``row``: doc id -> table row) and the
    teacher's scores, and whether it has them; None when no pair has. Rows without targets get zeros (never
    read)."""
    if not any(soft_targets):
        return None
    width = max(len(t[0]) for t in soft_targets if t)
    rows: list[list[int]] = []
    scores: list[list[float]] = []
    has: list[bool] = []
    for target in soft_targets:
        if not target:
            rows.append([0] * width)
            scores.append([0.0] * width)
            has.append(False)
            continue
        doc_ids, teacher = target
        if len(doc_ids) != width or len(teacher) != width:
            raise ValueError("every soft target needs the same number of candidates")
        missing = [d for d in doc_ids if d not in row]
        if missing:
            raise ValueError(f"soft-target candidates not in the passage table: {missing[:3]}")
        rows.append([row[d] for d in doc_ids])
        scores.append([float(x) for x in teacher])
        has.append(True)
    return rows, scores, has


def fixed_passages_loss(model: Any, passages: Any, positives: list[int], others: list[list[int]],
                        scale: float, soft: tuple[list[list[int]], list[list[float]], list[bool]] | None = None) -> Any:
    """Cross-entropy of ``scale`` x cosine(question, every table row) on the positive's row; the question's other
    positives masked. The dataset's ``label`` column is the pair's index into ``positives`` / ``others``.

    With ``soft`` (``soft_rows``), a pair that has soft targets learns them instead: KL divergence between the
    softmax of the teacher's scores and of the question's cosines over its candidate rows, both x ``scale``
    (`dpr adapt --question-only`: hybrid search distilled, ``services.lab.adaptation.teacher.distill_targets``)."""
    import torch
    from torch import nn

    target = torch.tensor(positives, dtype=torch.long)  # (pairs,)
    mask_rows = [i for i, rows in enumerate(others) for _ in rows]
    mask_cols = [c for rows in others for c in rows]
    soft_cand = torch.tensor(soft[0], dtype=torch.long) if soft else None  # (pairs, width)
    soft_score = torch.tensor(soft[1], dtype=torch.float32) if soft else None  # (pairs, width)
    soft_has = torch.tensor(soft[2], dtype=torch.bool) if soft else None  # (pairs,)

    class FixedPassagesLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.scale = scale
            self.register_buffer("passages", passages, persistent=False)  # (n, dim)
            self.mask = torch.zeros(len(positives), passages.shape[0], dtype=torch.bool)  # (pairs, n)
            if mask_rows:
                self.mask[mask_rows, mask_cols] = True

        def forward(self, sentence_features: Any, labels: Any) -> Any:
            features = list(sentence_features)
            questions = self.model(features[0])["sentence_embedding"]  # (batch, dim)
            raw = self.scale * questions @ self.passages.T  # (batch, n)
            index = labels.long().cpu()
            scores = raw.masked_fill(self.mask[index].to(raw.device), float("-inf"))
            hard = nn.functional.cross_entropy(scores, target[index].to(scores.device), reduction="none")  # (batch,)
            if soft_has is None or soft_cand is None or soft_score is None:
                return hard.mean()
            has = soft_has[index].to(scores.device)  # (batch,)
            student = torch.gather(raw, 1, soft_cand[index].to(raw.device))  # (batch, width)
            teacher = self.scale * soft_score[index].to(scores.device)  # (batch, width)
            kl = nn.functional.kl_div(torch.log_softmax(student, -1), torch.log_softmax(teacher, -1),
                                      log_target=True, reduction="none").sum(-1)  # (batch,)
            return torch.where(has, kl, hard).mean()

        @property
        def citation(self) -> str:
            return ""

    return FixedPassagesLoss()


# --- evaluate -------------------------------------------------------------------------------------------------


def dev_metrics(model: Any, dev: RetrievalDataset | None, passages: Any, ids: Sequence[str],
                k: int = 100) -> dict[str, float] | None:
    """The dev queries against the table's corpus rows (the vectors the passage tower already made)."""
    if dev is None or not dev.queries:
        return None
    import numpy as np
    import torch

    from services.lab.evaluation.retrieval import Retrieval, score_retrieval

    rows = [i for i, d in enumerate(ids) if d and d in dev.corpus]
    qids = sorted(dev.queries)
    was_training = bool(model.training)
    model.eval()
    with torch.no_grad():
        questions = model.encode_query([dev.queries[q] for q in qids], batch_size=ENCODE_BATCH,
                                       convert_to_numpy=True, show_progress_bar=False)  # (q, dim)
    if was_training:
        model.train()
    matrix = passages[rows].numpy()  # (docs, dim)
    scores = np.asarray(questions, dtype=np.float32) @ matrix.T  # (q, docs)
    k = min(k, len(rows))
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    out = Retrieval(run={}, texts={})
    for r, qid in enumerate(qids):
        order = top[r][np.argsort(-scores[r, top[r]])]
        out.run[qid] = {ids[rows[i]]: float(scores[r, i]) for i in order}
        out.texts[qid] = [dev.corpus[ids[rows[i]]].passage for i in order]
    metrics, _ = score_retrieval(dev, out)
    return metrics


# --- the run --------------------------------------------------------------------------------------------------


def train_question_only(
    pairs: Sequence[TrainPair],
    models_dir: Path,
    config: TrainConfig,
    *,
    base: Path,
    partner_name: str | None = None,
    corpus: dict[str, CorpusDoc] | None = None,
    dev: RetrievalDataset | None = None,
    data_info: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
    soft_targets: Sequence[tuple[Sequence[str], Sequence[float]] | None] | None = None,
) -> TrainResult:
    """Train the question tower of ``base`` (the partner) on ``pairs`` against its frozen passage tower; save the
    model with the partner's passage fingerprint. ``soft_targets`` (aligned with ``pairs``; None for a pair that
    has none): corpus doc ids and a teacher's scores of them, learnt instead of the pair's positive
    (``fixed_passages_loss``)."""
    from datasets import Dataset

    from services.lab.towers.trainer import freeze_word_embeddings

    check_config(config)
    if not pairs:
        raise ValueError("no training pairs")
    started, t0 = start_run(config.threads, config.seed)
    partner = partner_record(base, partner_name)
    # 1. model
    model = build_question_only_model(base, config.max_query_tokens)
    frozen_embeddings = freeze_word_embeddings(model, config.freeze_embeddings)  # the question tower's (large vocab)
    before = passage_state(model)
    frozen_passage = sum(v.numel() for v in before.values())
    # 2. data: the passage table, encoded once
    texts, ids = passage_table(pairs, corpus)
    t_enc = time.perf_counter()
    passages = encode_table(model, texts)  # (n, dim)
    encode_seconds = time.perf_counter() - t_enc
    log.info("encoded the passage table", extra={"passages": len(texts), "seconds": round(encode_seconds, 1)})
    positives, others = targets(pairs, texts)
    if soft_targets is not None and len(soft_targets) != len(pairs):
        raise ValueError("soft_targets must be aligned with pairs")
    text_row = {t: i for i, t in enumerate(texts)}
    corpus_row = {d: text_row[doc.passage] for d, doc in (corpus or {}).items()}
    soft = soft_rows(soft_targets, corpus_row) if soft_targets is not None else None
    dataset = Dataset.from_dict({"question": [p.question for p in pairs], "label": list(range(len(pairs)))})
    # 3. loss
    loss = fixed_passages_loss(model, passages, positives, others, config.scale, soft)
    # 4. evaluator: the dev queries against the table, before training (cheap: no passage is encoded)
    dev_before = dev_metrics(model, dev, passages, ids)
    # 5. arguments, 6. trainer
    model.train()
    steps, losses = fit_towers(model, config, ["question"], dataset, loss, progress, prefix="dpr-train-q-")
    train_seconds = time.perf_counter() - t0
    check_passage_unchanged(model, before)
    # 7. evaluate
    dev_after = dev_metrics(model, dev, passages, ids)
    # 8. save
    card: dict[str, Any] = {
        "towers": "separate (Router: query, document); question tower trained, passage tower the partner's",
        **card_fields(
            base=base_record(base),
            training_data=data_record(pairs, data_info, passage_table=len(texts)),
            hyperparameters={**asdict(replace(config, max_passage_tokens=None)), "precision": precision_of(config),
                             "loss": type(loss).__name__,
                             "negatives": "every passage of the table (other labelled positives masked)"
                             + ("; pairs with soft targets: the teacher's candidates, by KL" if soft else ""),
                             "soft_targets": sum(soft[2]) if soft else 0,
                             "frozen_passage_parameters": frozen_passage,
                             "frozen_embedding_parameters": frozen_embeddings},
            seed=config.seed, started=started, train_seconds=train_seconds, steps=steps, losses=losses,
            dev_metrics={"before": dev_before, "after": dev_after} if dev_after is not None else None,
        ),
        "question_only": True,
        "partner": partner,
        "passage_fingerprint": partner["passage_fingerprint"],
        "passage_encode_seconds": round(encode_seconds, 1),
    }
    shared = {"fingerprint": partner["passage_fingerprint"], "partner": partner["name"],
              "partner_fingerprint": partner["fingerprint"]}
    return save_model(model, models_dir, versioned_name(config.name, started), card, losses,
                      extra_files={PASSAGE_TOWER_FILE: json.dumps(shared, indent=2) + "\n"})
