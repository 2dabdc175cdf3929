"""Distillation of a trained reranker into the towers (issue 16): the towers learn the labels (MNRL: in-batch and
hard negatives) and, on each question's own candidates (its positive and its mined hard negatives), the
cross-encoder's preferences among them (KL divergence between the two softmaxes).

Plain InfoNCE on a few hundred labels stalls: it only says which one passage is right. The reranker's scores also
say how wrong each hard negative is, and a near-duplicate of the positive is not pushed away as hard as an
off-topic passage. Measured on SciFact (README, ``research/distillation/results/scifact-dev.json``) it has not helped
yet: the reranker there is weaker than the towers it would teach.

Imported only when a training run distils (it imports torch); ``teacher_scores`` runs before the trainer starts, on
whatever backend the reranker was loaded on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from sentence_transformers.base.losses.merged_forward import embed_columns
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
from sentence_transformers.util import pairwise_cos_sim
from torch import Tensor, nn

log = logging.getLogger(__name__)

ScoreFn = Callable[[str, Sequence[str]], np.ndarray]


def teacher_scores(score: ScoreFn, columns: dict[str, list[str]]) -> tuple[list[list[float]], dict[str, Any]]:
    """The teacher's score of each row's (question, positive), (question, negative_1), ... in column order
    (``services.lab.shared.rows.pairs_to_columns``), and a summary for the model card (rows, seconds, how often the
    teacher ranks the labelled positive first, how peaked its softmax is)."""
    candidates = [c for c in columns if c != "question"]
    t0 = time.perf_counter()
    rows: list[list[float]] = []
    for i, question in enumerate(columns["question"]):
        scores = score(question, [columns[c][i] for c in candidates])
        rows.append([float(x) for x in scores])
    matrix = np.asarray(rows, dtype=np.float64)
    shifted = np.exp(matrix - matrix.max(axis=1, keepdims=True))
    probs = shifted / shifted.sum(axis=1, keepdims=True)
    summary = {"rows": len(rows), "candidates_per_row": len(candidates),
               "score_seconds": round(time.perf_counter() - t0, 1),
               "positive_ranked_first": round(float((matrix.argmax(axis=1) == 0).mean()), 4),
               "mean_top_probability": round(float(probs.max(axis=1).mean()), 4)}
    log.info("teacher scores", extra=summary)
    return rows, summary


class DistilledMNRL(nn.Module):
    """MNRL + ``weight`` x KL(teacher || towers) over each row's own candidates, from one forward pass.

    The towers' distribution over a row's candidates is the softmax of ``scale`` x cosine (MNRL's own logits); the
    teacher's is the softmax of its scores / ``temperature``. The KL term is not multiplied by the temperature
    squared (Hinton et al.'s correction), so ``weight`` 1 gives it gradients of the size of MNRL's.
    """

    def __init__(self, model: Any, scale: float, weight: float, temperature: float,
                 negatives_only: bool = False) -> None:
        super().__init__()
        if weight <= 0 or temperature <= 0:
            raise ValueError(f"distillation weight and temperature must be positive, got {weight} and {temperature}")
        self.model = model
        self.mnrl = MultipleNegativesRankingLoss(model, scale=scale)
        self.scale, self.weight, self.temperature = scale, weight, temperature
        self.negatives_only = negatives_only

    def forward(self, sentence_features: Sequence[dict[str, Tensor]], labels: Tensor) -> Tensor:
        embeddings = embed_columns(self.model, sentence_features)
        return self.mnrl.compute_loss_from_embeddings(embeddings, labels) + self.weight * self.kl(embeddings, labels)

    def kl(self, embeddings: Sequence[Tensor], labels: Tensor) -> Tensor:
        """KL(teacher || towers), averaged over the batch's rows; ``labels``: (rows, candidates) teacher scores.
        ``negatives_only``: over the hard negatives alone, so the teacher never argues with a label (the positive is
        MNRL's alone)."""
        query, candidates = embeddings[0], list(embeddings[1:])
        if labels.shape != (query.size(0), len(candidates)):
            raise ValueError(f"teacher scores of shape {tuple(labels.shape)} for {query.size(0)} rows of "
                             f"{len(candidates)} candidates")
        if self.negatives_only:
            candidates, labels = candidates[1:], labels[:, 1:]
        student = torch.stack([pairwise_cos_sim(query, c) for c in candidates], dim=1) * self.scale
        teacher = labels.detach().float() / self.temperature
        return nn.functional.kl_div(torch.log_softmax(student, dim=1), torch.log_softmax(teacher, dim=1),
                                    log_target=True, reduction="batchmean")

    def get_config_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "distill_weight": self.weight, "teacher_temperature": self.temperature,
                "negatives_only": self.negatives_only}
