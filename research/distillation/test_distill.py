"""The distillation experiment's loss (research/distillation/distill.py; once `dpr train --distill`): the KL term
is zero where the towers agree with the teacher and pulls a negative the teacher prefers toward the question.

Outside the product's suite: `pytest research/distillation -q`."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from kit.tiny_models import tiny_sentence_model

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytestmark = pytest.mark.integration


def test_distill_loss_pulls_the_towers_toward_the_teacher(tmp_path: Path) -> None:
    import torch
    from distill import DistilledMNRL, teacher_scores
    from sentence_transformers import SentenceTransformer

    towers = SentenceTransformer(str(tiny_sentence_model(tmp_path)), device="cpu")
    loss = DistilledMNRL(towers, scale=20.0, weight=1.0, temperature=1.0)
    query = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    positive = torch.tensor([[1.0, 1.0], [0.0, 1.0]], requires_grad=True)
    negative = torch.tensor([[1.0, -1.0], [1.0, 0.0]], requires_grad=True)
    cos = torch.stack([torch.nn.functional.cosine_similarity(query, c) for c in (positive, negative)], dim=1)
    agreeing = (20.0 * cos).detach()
    assert loss.kl([query, positive, negative], agreeing).item() == pytest.approx(0.0, abs=1e-6)
    # a teacher that prefers the first row's negative: the KL is positive and its gradient raises that negative's
    # cosine with the question (a gradient step moves the embedding toward the question)
    disagreeing = agreeing.clone()
    disagreeing[0] = torch.tensor([0.0, 5.0])
    kl = loss.kl([query, positive, negative], disagreeing)
    assert kl.item() > 0.1
    kl.backward()
    stepped = negative.detach()[0] - 0.1 * negative.grad[0]  # type: ignore[index]
    assert torch.nn.functional.cosine_similarity(query[0], stepped, dim=0) > cos[0, 1]
    with pytest.raises(ValueError, match="teacher scores of shape"):
        loss.kl([query, positive, negative], agreeing[:, :1])
    # --distill-negatives-only: the term orders the hard negatives alone; a teacher that puts the first row's
    # positive last does not argue with its label there
    second = torch.tensor([[0.0, -1.0], [-1.0, 0.0]])
    three = [query, positive, negative, second]
    cos3 = torch.stack([torch.nn.functional.cosine_similarity(query, c) for c in three[1:]], dim=1)
    flipped = (20.0 * cos3).detach()
    flipped[0, 0] = -100.0
    negatives_only = DistilledMNRL(loss.model, scale=20.0, weight=1.0, temperature=1.0, negatives_only=True)
    assert negatives_only.kl(three, flipped).item() == pytest.approx(0.0, abs=1e-6)
    assert loss.kl(three, flipped).item() > 0.1
    columns = {"question": ["q1", "q2"], "positive": ["p1", "p2"], "negative_1": ["n1", "n2"]}
    rows, summary = teacher_scores(lambda q, ps: np.array([1.0 if p.startswith("p") else 0.0 for p in ps]), columns)
    assert rows == [[1.0, 0.0], [1.0, 0.0]] and summary["positive_ranked_first"] == 1.0
