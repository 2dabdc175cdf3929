"""Training positives cut around their answer (SQuAD-style pairs) instead of to their first tokens."""

from __future__ import annotations

import re
from typing import Any

import pytest

from encoders.data import TrainPair
from services.lab.shared.rows import fit_answers

pytestmark = pytest.mark.unit


class WordTokenizer:
    """A stand-in tokenizer: one token per word or punctuation mark, with character offsets."""

    def __call__(self, text: str, add_special_tokens: bool = True, return_offsets_mapping: bool = False) -> Any:
        offsets = [(m.start(), m.end()) for m in re.finditer(r"\w+|[^\w\s]", text)]
        return {"input_ids": list(range(len(offsets))), "offset_mapping": offsets}


def _paragraph(n: int, answer_at: int, answer: str = "Zanzibar") -> str:
    words = [f"w{i}" for i in range(n)]
    words[answer_at] = answer
    return "The Title\n" + " ".join(words)


def test_an_answer_past_the_cut_gets_a_window_with_the_title_and_the_answer_in_its_middle() -> None:
    pair = TrainPair("where?", _paragraph(300, 200), positive_id="d1", answers=("Zanzibar",))
    (out,), cut = fit_answers([pair], WordTokenizer(), budget=50)
    assert cut == 1
    assert out.positive.startswith("The Title\n")
    assert "Zanzibar" in out.positive
    tokens = WordTokenizer()(out.positive)["input_ids"]
    assert len(tokens) == 50  # the title's two tokens and 48 of the body
    body = out.positive.split("\n", 1)[1].split()
    assert abs(body.index("Zanzibar") - len(body) // 2) <= 1
    assert (out.question, out.positive_id, out.answers) == (pair.question, pair.positive_id, pair.answers)


def test_pairs_that_fit_or_have_no_answer_stay_as_they_are() -> None:
    early = TrainPair("q1", _paragraph(300, 10), answers=("Zanzibar",))
    short = TrainPair("q2", _paragraph(30, 25), answers=("Zanzibar",))
    unlabelled = TrainPair("q3", _paragraph(300, 200))
    missing = TrainPair("q4", _paragraph(300, 200), answers=("Timbuktu",))
    pairs = [early, short, unlabelled, missing]
    out, cut = fit_answers(pairs, WordTokenizer(), budget=50)
    assert cut == 0
    assert all(a is b for a, b in zip(out, pairs, strict=True))


def test_an_answer_near_the_end_gets_the_last_window_and_the_first_occurrence_counts() -> None:
    pair = TrainPair("q", _paragraph(300, 298) + " Zanzibar", answers=("Zanzibar",))
    (out,), _ = fit_answers([pair], WordTokenizer(), budget=40)
    assert out.positive.startswith("The Title\n")
    assert out.positive.endswith("Zanzibar w299 Zanzibar")
    assert len(WordTokenizer()(out.positive)["input_ids"]) == 40


def test_a_passage_without_a_title_line_is_windowed_from_its_body() -> None:
    text = " ".join(f"w{i}" if i != 150 else "Zanzibar" for i in range(300))
    (out,), cut = fit_answers([TrainPair("q", text, answers=("Zanzibar",))], WordTokenizer(), budget=30)
    assert cut == 1 and "Zanzibar" in out.positive and len(out.positive.split()) == 30


def test_the_real_passage_tokenizer_keeps_the_answer_inside_the_training_cut() -> None:
    from transformers import AutoTokenizer

    from encoders.towers import base_model_path

    tokenizer = AutoTokenizer.from_pretrained(str(base_model_path()))
    sentences = [f"Sentence number {i} talks about the weather in a town by the sea." for i in range(60)]
    sentences[45] = "The treaty was signed by Ambassador Okonkwo-Haraldsen in 1871."
    pair = TrainPair("who signed the treaty?", "Treaties\n" + " ".join(sentences), answers=("Okonkwo-Haraldsen",))
    (out,), cut = fit_answers([pair], tokenizer, budget=126)
    assert cut == 1
    kept = tokenizer(out.positive, truncation=True, max_length=128, return_offsets_mapping=True)
    last = max(end for _, end in kept["offset_mapping"])
    assert out.positive.startswith("Treaties\n")
    assert out.positive.index("Okonkwo-Haraldsen") + len("Okonkwo-Haraldsen") <= last
