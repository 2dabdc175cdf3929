"""Pair building: self-supervised ICT and title/heading -> body; the training recipe's training sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from encoders.data import CorpusDoc
from services.core.settings import Settings
from services.lab.shared.self_supervised import (
    PairConfig,
    body_without_title,
    ict_pairs,
    pseudo_query_sets,
    sections,
    self_supervised_pairs,
    split_sentences,
    title_pairs,
)

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


KOREAN = (
    "1989년 2월 15일 여의도 농민 폭력 시위를 주도한 혐의로 지명수배되었다. "
    "같은 해 6월 30일 평양축전에 임수경을 대표로 파견하여 국가보안법위반 혐의가 추가되었다. "
    "경찰은 서울 경희대학교에서 임종석이 성명 발표를 추진하고 있다는 첩보를 입수했다. "
    "임종석은 청량리경찰서에서 약 1시간 동안 조사를 받은 뒤 공안분실로 인계되었다."
)


def test_split_sentences_in_scripts_without_capitals() -> None:
    # Korean sentences start with Hangul, not a capital: the English-only rule left the paragraph whole
    assert len(split_sentences(KOREAN)) == 4
    assert split_sentences(KOREAN)[1].startswith("같은 해")
    assert split_sentences("東京は日本の首都です。人口は多い。") == ["東京は日本の首都です。", "人口は多い。"]
    assert split_sentences("Il est là. «Oui», dit-il. Über alles.") == ["Il est là.", "«Oui», dit-il.", "Über alles."]
    assert split_sentences("Salt, pepper, etc. and more. Done") == ["Salt, pepper, etc. and more.", "Done"]
    # tokenised, lower-cased text (Cranfield): a stop between spaces ends a sentence whatever follows
    assert split_sentences("wing in a slipstream . an experimental study was made . the results") == [
        "wing in a slipstream .", "an experimental study was made .", "the results"]


def test_ict_pairs_from_korean_paragraphs() -> None:
    config = PairConfig(min_sentence_words=3, min_context_words=10, keep_sentence_prob=0.0, ict_per_doc=4)
    pairs = ict_pairs([CorpusDoc("k1", "임종석", KOREAN)], config, seed=3)
    assert len(pairs) == 4
    for p in pairs:
        assert p.question in KOREAN and p.question not in p.positive
        assert p.positive.startswith("임종석\n")


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


def test_title_pairs_drop_a_body_opening_with_its_title() -> None:
    # Cranfield's bodies repeat the title: the pair would be answered by matching the string
    body = " ".join(["flow"] * 25)
    doc = CorpusDoc("c1", "shear flow past a flat plate .", f"shear flow past a Flat Plate . {body}")
    assert body_without_title(doc) == body
    assert title_pairs([doc])[0].positive == body
    cranfield = CorpusDoc("c4", "shear flow past a flat plate .", f"shear flow past a flat plate . {ABSTRACT}")
    config = PairConfig(min_context_words=5)
    questions = {p.question for seed in range(20) for p in ict_pairs([cranfield], config, seed)}
    assert questions and not any(q.startswith("shear flow") for q in questions)  # ICT never asks the title's copy
    other = CorpusDoc("c2", "Shear flow", f"A study of {body}")
    assert body_without_title(other) == other.text and body_without_title(CorpusDoc("c3", "", "x y")) == "x y"


def _topic_corpus(n: int) -> dict[str, CorpusDoc]:
    sentences = ABSTRACT.split(". ")
    return {f"d{i:02d}": CorpusDoc(f"d{i:02d}", f"Study number {i} of aspirin",
                                   f"Study number {i} of aspirin. " + f" Cohort {i}. ".join(sentences))
            for i in range(n)}


def test_pseudo_query_sets_hide_the_question_from_its_answer() -> None:
    """Titles and ICT sentences as label-free dev questions (``dpr models blend --choose-on``): the title set's
    documents lose their titles (and a body's leading copy), each ICT question's document loses that sentence, the
    others stay whole; documents sharing a title all answer it; the sets are seeded."""
    corpus = _topic_corpus(30)
    shared = corpus["d29"].text.replace("Study number 29", "Study number 0", 1)
    corpus["d29"] = CorpusDoc("d29", "Study number 0 of aspirin", shared)  # shares d00's title
    sets = pseudo_query_sets(corpus, queries=25, seed=3, name="toy")
    assert set(sets) == {"title", "ict"}
    title = sets["title"]
    assert len(title.queries) == 25 and title.name == "toy-title25"
    assert all(d.title == "" and not d.text.startswith("Study number") for d in title.corpus.values())
    for qid, question in title.queries.items():
        relevant = set(title.qrels[qid])
        assert relevant == {d for d, doc in corpus.items() if doc.title == question}
    every = pseudo_query_sets(corpus, queries=40, seed=3)["title"]
    assert len(every.queries) == 29 and {"d00", "d29"} in [set(r) for r in every.qrels.values()]
    ict = sets["ict"]
    assert len(ict.queries) == 25 and len(ict.corpus) == 30
    changed = {d for d in corpus if ict.corpus[d] != corpus[d]}
    assert changed == {q.removeprefix("ict-") for q in ict.queries}
    for qid, sentence in ict.queries.items():
        doc_id = qid.removeprefix("ict-")
        assert ict.qrels[qid] == {doc_id: 1}
        assert sentence in corpus[doc_id].text and sentence not in ict.corpus[doc_id].text
        assert ict.corpus[doc_id].title == corpus[doc_id].title
    assert not any(q.startswith("Study number") for q in ict.queries.values())  # a title's copy is no question
    again = pseudo_query_sets(corpus, queries=25, seed=3, name="toy")
    assert again["ict"].queries == ict.queries and again["title"].queries == title.queries
    assert pseudo_query_sets(corpus, queries=25, seed=3, max_documents=22)["ict"].corpus.keys() <= corpus.keys()
    assert len(pseudo_query_sets(corpus, queries=25, seed=3, max_documents=22)["ict"].corpus) == 22


def test_keyword_pseudo_questions_are_heavy_shared_words_of_their_document() -> None:
    """``keywords``: 3-5 of a document's heaviest words (tf x idf), none found in that document alone, none in
    every document, in the document's order; the document unchanged is the answer; seeded; only the kinds asked."""
    words = "lava magma eruption crater basalt glacier moraine crevasse tundra permafrost".split()
    corpus = {}
    for i in range(30):
        own = [words[(i + j) % len(words)] for j in range(4)]
        corpus[f"d{i:02d}"] = CorpusDoc(f"d{i:02d}", f"Note {i}", f"The study of {' '.join(own)} looks at the "
                                        f"field. Then the {own[0]} {own[1]} again with uniqueword{i} in the field "
                                        "and more notes here. Every note in the set reads the same way at its end.")
    sets = pseudo_query_sets(corpus, queries=25, seed=3, kinds=("keywords",), name="toy")
    assert set(sets) == {"keywords"}
    kw = sets["keywords"]
    assert len(kw.queries) == 25 and kw.corpus == corpus
    for qid, question in kw.queries.items():
        doc_id = qid.removeprefix("keywords-")
        assert kw.qrels[qid] == {doc_id: 1}
        terms = question.split()
        assert 3 <= len(terms) <= 5 and len(set(terms)) == len(terms)
        text = corpus[doc_id].text.lower()
        assert all(t in words for t in terms)  # not the unique word, not "the" / "study" (in every document)
        assert [text.index(t) for t in terms] == sorted(text.index(t) for t in terms)  # the document's order
    assert pseudo_query_sets(corpus, queries=25, seed=3, kinds=("keywords",))["keywords"].queries == kw.queries
    assert set(pseudo_query_sets(corpus, queries=25, seed=3, kinds=("title", "ict", "keywords"))) == {
        "title", "ict", "keywords"}
    with pytest.raises(ValueError, match="kinds must be among"):
        pseudo_query_sets(corpus, kinds=("titles",))  # type: ignore[arg-type]


def test_pseudo_query_sets_leave_out_a_thin_kind_and_refuse_a_corpus_with_none() -> None:
    untitled = {d: CorpusDoc(d, "", doc.text) for d, doc in _topic_corpus(30).items()}
    assert set(pseudo_query_sets(untitled)) == {"ict"}  # no titles: the ICT set alone
    with pytest.raises(ValueError, match="no pseudo-questions could be built from the 19 documents of mine"):
        pseudo_query_sets(dict(list(untitled.items())[:19]), name="mine")


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


# --- the training recipe's data side (services.lab.towers.recipe.build_training_set): no model, no torch --------------


def _beir(root: Path, n_queries: int = 6) -> Path:
    folder = root / "beir"
    (folder / "qrels").mkdir(parents=True)
    topics = ["volcano lava", "glacier ice", "desert sand", "ocean wave", "forest tree", "river delta"]
    corpus = [{"_id": f"d{i}", "title": t.split()[0].title(), "text": f"{t} {ABSTRACT}"} for i, t in enumerate(topics)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    queries = [{"_id": f"q{i}", "text": f"about {topics[i]}"} for i in range(n_queries)]
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    qrels = "".join(f"q{i}\td{i}\t1\n" for i in range(n_queries))
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return folder


def test_labelled_training_set_holds_dev_out_and_mines_negatives(tmp_path: Path) -> None:
    from services.lab.shared.mining import MiningConfig
    from services.lab.towers.recipe import TrainingData, build_training_set

    data = TrainingData(_beir(tmp_path), dev_queries=2, mining=MiningConfig(num_negatives=1, rank_end=6))
    training = build_training_set(Settings(data_dir=tmp_path), data)
    assert training.dev is not None and len(training.dev.queries) == 2
    train_questions = {p.question for p in training.pairs}
    assert len(train_questions) == 4 and not train_questions & set(training.dev.queries.values())
    assert all(len(p.negatives) == 1 and p.negatives[0] != p.positive for p in training.pairs)
    assert training.info["format"] == "beir" and training.info["train_queries"] == 4
    assert training.info["mining"] == {
        "bm25": "bm25s", "num_negatives": 1, "rank_start": 0, "rank_end": 6, "language": "en"
    }


def test_pairs_file_and_self_supervised_training_sets(tmp_path: Path) -> None:
    from services.lab.shared.mining import MiningConfig
    from services.lab.towers.recipe import TrainingData, build_training_set

    settings = Settings(data_dir=tmp_path)
    no_mining = MiningConfig(num_negatives=0)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"question": f"q{i}?", "passage": f"p{i}"}) + "\n" for i in range(5)))
    capped = build_training_set(settings, TrainingData(pairs, max_pairs=3, seed=1, mining=no_mining))
    assert len(capped.pairs) == 3 and capped.corpus == {} and capped.info["format"] == "jsonl"
    again = build_training_set(settings, TrainingData(pairs, max_pairs=3, seed=1, mining=no_mining))
    assert [p.question for p in again.pairs] == [p.question for p in capped.pairs]  # a seeded sample

    selfsup = build_training_set(settings, TrainingData(_beir(tmp_path), self_supervised="ict", mining=no_mining))
    assert selfsup.info["self_supervised"] == "ict" and len(selfsup.corpus) == 6
    assert all(p.positive_id in selfsup.corpus for p in selfsup.pairs)


def test_self_supervised_pairs_from_a_squad_file_read_every_article(tmp_path: Path) -> None:
    """`dpr train SQUAD --pretrain ict` builds stage 1 from the paragraphs of the whole file (no question read),
    as a BEIR folder's corpus serves every split; the pair settings reach the builder and the card."""
    from services.lab.shared.mining import MiningConfig
    from services.lab.towers.recipe import TrainingData, build_training_set

    qas = [{"id": "q", "question": "지명수배된 날은?", "answers": [{"text": "1989년 2월 15일", "answer_start": 0}]}]
    articles = [{"title": f"기사 {i}", "paragraphs": [{"context": KOREAN, "qas": qas}]} for i in range(6)]
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"version": "1.1", "data": articles}, ensure_ascii=False))
    config = PairConfig(min_sentence_words=3, min_context_words=10, ict_per_doc=2)
    data = TrainingData(squad, fmt="squad", self_supervised="ict", pair_config=config,
                        mining=MiningConfig(num_negatives=0))
    training = build_training_set(Settings(data_dir=tmp_path), data)
    assert len(training.corpus) == 6 and len(training.pairs) == 12
    assert training.info["documents"] == 6 and training.info["pair_config"]["ict_per_doc"] == 2
    assert training.info["language"] == "ko"


def test_training_set_needs_data(tmp_path: Path) -> None:
    from services.core.errors import ConfigError
    from services.lab.towers.recipe import TrainingData, build_training_set

    with pytest.raises(ConfigError, match="give DATA"):
        build_training_set(Settings(data_dir=tmp_path), TrainingData())
