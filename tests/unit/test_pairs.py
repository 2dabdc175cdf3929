"""Self-supervised pair building: ICT and title/heading -> body."""

from __future__ import annotations

import pytest

from encoders.data import CorpusDoc
from encoders.pairs import PairConfig, ict_pairs, sections, self_supervised_pairs, split_sentences, title_pairs

pytestmark = pytest.mark.unit

ABSTRACT = (
    "Aspirin reduces the risk of heart attacks in older adults. "
    "The trial enrolled twelve thousand patients across nine countries over five years. "
    "Bleeding events were more frequent in the treatment group than in the placebo group. "
    "Overall mortality did not differ between the two groups at the end of follow up."
)


def test_split_sentences() -> None:
    assert split_sentences("One two. Three four? Five!  ") == ["One two.", "Three four?", "Five!"]
    assert split_sentences("e.g. lower case continues here. Next one") == [
        "e.g. lower case continues here.",
        "Next one",
    ]


def test_ict_removes_the_question_sentence_from_the_positive() -> None:
    doc = CorpusDoc("d1", "Aspirin trial", ABSTRACT)
    config = PairConfig(min_context_words=10, keep_sentence_prob=0.0, ict_per_doc=2)
    pairs = ict_pairs([doc], config, seed=1)
    assert len(pairs) == 2
    for p in pairs:
        assert p.question in ABSTRACT
        assert p.question not in p.positive  # ICT: the sentence is removed
        assert p.positive.startswith("Aspirin trial\n")  # the title travels with the passage
        assert p.positive_id == "d1" and p.relevant_ids == frozenset({"d1"})


def test_ict_is_deterministic_per_seed_and_can_keep_the_sentence() -> None:
    doc = CorpusDoc("d1", "", ABSTRACT)
    config = PairConfig(min_context_words=10, keep_sentence_prob=1.0)
    a = ict_pairs([doc], config, seed=7)
    b = ict_pairs([doc], config, seed=7)
    assert a == b
    assert a[0].question in a[0].positive


def test_ict_skips_single_sentence_docs() -> None:
    assert ict_pairs([CorpusDoc("d", "t", "Only one sentence with enough words in it.")]) == []


def test_sections_markdown_and_rst() -> None:
    text = "Intro line.\n\n# Install\nRun pip install.\n\nUsage\n=====\nCall the thing.\n"
    assert sections(text) == [("Install", "Run pip install."), ("Usage", "Call the thing.")]


def test_title_pairs_from_title_and_headings() -> None:
    body = " ".join(["word"] * 30)
    doc = CorpusDoc("d1", "Python logging", f"{body}\n\nHandlers\n--------\n{body} handlers")
    pairs = title_pairs([doc], PairConfig(min_body_words=20))
    questions = [p.question for p in pairs]
    assert questions == ["Python logging", "Python logging: Handlers"]
    assert pairs[1].positive.endswith("handlers")


def test_self_supervised_both_caps_and_errors() -> None:
    docs = [CorpusDoc(f"d{i}", f"Aspirin study {i}", ABSTRACT) for i in range(5)]
    config = PairConfig(min_context_words=10, min_body_words=10)
    both = self_supervised_pairs(docs, "both", config, seed=0)
    assert {p.positive_id for p in both} == {f"d{i}" for i in range(5)}
    assert len(both) == 10  # one ICT and one title pair per document
    assert len(self_supervised_pairs(docs, "both", config, max_pairs=3)) == 3
    with pytest.raises(ValueError, match="no ict pairs"):
        self_supervised_pairs([CorpusDoc("x", "", "short")], "ict")
    with pytest.raises(ValueError, match="mode"):
        self_supervised_pairs(docs, "cloze")  # type: ignore[arg-type]
