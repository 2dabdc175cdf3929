"""The `dpr adapt --question-only` teacher: hybrid search's scores over each pseudo-question's candidates
(``services.lab.adaptation.teacher.distill_targets``), and the loss that teaches them to the question tower
(``services.lab.towers.question_only.fixed_passages_loss`` with soft targets)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from services.lab.adaptation.teacher import TeacherConfig, distill_targets, distill_width

pytestmark = pytest.mark.unit


def _scores(probes: int, docs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.uniform(-0.2, 0.8, (probes, docs)).astype(np.float32), rng.gamma(2.0, 2.0, (probes, docs))


def test_candidates_are_both_tops_without_the_source_then_randoms() -> None:
    cos0, bm25 = _scores(3, 200)
    config = TeacherConfig(distill=True, window=5, randoms=4)
    sources = [int(np.argmax(cos0[0])), None, int(np.argmax(bm25[2]))]  # each a top document of a ranking
    cand, teacher = distill_targets(cos0, bm25, sources, config, np.random.default_rng(1))
    assert cand.shape == teacher.shape == (3, 14) == (3, distill_width(config, 200))
    for r, source in enumerate(sources):
        row = cand[r].tolist()
        assert len(set(row)) == len(row) and source not in row
        tops = {i for m in (cos0, bm25) for i in np.argsort(-m[r])[:5].tolist()} - {source}
        assert tops <= set(row[: 2 * 5])  # both rankings' tops come first (all of them but the source)
    assert distill_width(config, 6) == 5  # a small corpus: every document but the source


def test_teacher_is_the_towers_at_weight_zero_and_moves_toward_bm25_with_weight() -> None:
    cos0, bm25 = _scores(4, 100, seed=3)
    sources: list[int | None] = [None] * 4
    cand0, t0 = distill_targets(cos0, bm25, sources, TeacherConfig(distill=True, bm25_weight=0.0),
                                np.random.default_rng(0))
    assert np.allclose(t0, np.take_along_axis(cos0, cand0, axis=1))
    cand1, t1 = distill_targets(cos0, bm25, sources, TeacherConfig(distill=True, bm25_weight=1.0),
                                np.random.default_rng(0))
    assert (cand1 == cand0).all()
    gain = t1 - t0  # w * sd(cos0) * z(bm25): ordered as BM25 over the candidates
    b = np.take_along_axis(bm25, cand1, axis=1)
    for r in range(4):
        assert np.argmax(gain[r]) == np.argmax(b[r]) and np.argmin(gain[r]) == np.argmin(b[r])


def test_mismatched_inputs_are_refused() -> None:
    cos0, bm25 = _scores(2, 10)
    with pytest.raises(ValueError, match="same probes"):
        distill_targets(cos0, bm25[:1], [None, None], TeacherConfig(distill=True), np.random.default_rng(0))
    with pytest.raises(ValueError, match="too few documents"):
        distill_targets(cos0[:, :2], bm25[:, :2], [0, 0], TeacherConfig(distill=True), np.random.default_rng(0))


class _Questions:
    """A stand-in question tower: the question vector is a learnable row per pair index (the label)."""

    def __init__(self, vectors: Any) -> None:
        self.vectors = vectors

    def __call__(self, features: dict[str, Any]) -> dict[str, Any]:
        return {"sentence_embedding": self.vectors[features["index"]]}


def test_soft_targets_are_learnt_instead_of_the_positive() -> None:
    torch = pytest.importorskip("torch")
    from services.lab.towers.question_only import fixed_passages_loss, soft_rows

    passages = torch.nn.functional.normalize(torch.randn(6, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    soft = soft_rows([(["a", "b", "c"], [0.9, 0.1, 0.0]), None], {"a": 1, "b": 2, "c": 3})
    assert soft is not None and soft[2] == [True, False]
    questions = torch.nn.Parameter(torch.randn(2, 8, generator=torch.Generator().manual_seed(1)))
    model = _Questions(questions)
    loss = fixed_passages_loss(model, passages, positives=[0, 4], others=[[1], []], scale=20.0, soft=soft)
    labels = torch.tensor([0, 1])
    features = [{"index": labels}]
    value = loss(features, labels)
    value.backward()
    assert torch.isfinite(value)  # the masked row 1 is a soft candidate: scored unmasked there
    # the soft pair's gradient comes from the KL alone: with the teacher equal to the student it vanishes
    with torch.no_grad():
        student = 20.0 * questions[0] @ passages[[1, 2, 3]].T
    same = soft_rows([(["a", "b", "c"], (student / 20.0).tolist())], {"a": 1, "b": 2, "c": 3})
    questions.grad = None
    one = fixed_passages_loss(model, passages, positives=[0], others=[[]], scale=20.0, soft=same)
    value = one([{"index": torch.tensor([0])}], torch.tensor([0]))
    value.backward()
    assert float(value.detach()) == pytest.approx(0.0, abs=1e-5)
    assert float(questions.grad[0].abs().max()) < 1e-4
    with pytest.raises(ValueError, match="not in the passage table"):
        soft_rows([(["zz", "a", "b"], [0.0, 0.0, 0.0])], {"a": 1, "b": 2})
