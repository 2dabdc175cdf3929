"""BM25 hard negatives: top-ranked, not relevant, not the positive, no answer string, inside the rank window."""

from __future__ import annotations

import pytest

from encoders.data import CorpusDoc, TrainPair
from encoders.mining import BM25Config, BM25Index, MiningConfig, mine_hard_negatives

pytestmark = pytest.mark.unit

CORPUS = {
    "pos": CorpusDoc("pos", "Denver Broncos", "The Denver Broncos won Super Bowl 50 in February 2016."),
    "rel2": CorpusDoc("rel2", "Super Bowl 50", "Super Bowl 50 was won by Denver, a second relevant passage."),
    "ans": CorpusDoc("ans", "Broncos history", "Super Bowl 50 winners: the Denver Broncos, again."),
    "neg1": CorpusDoc("neg1", "Super Bowl 49", "Super Bowl 49 was won by the New England Patriots."),
    "neg2": CorpusDoc("neg2", "Super Bowl halftime", "The Super Bowl halftime show had Coldplay."),
    "far": CorpusDoc("far", "Cooking", "Slow cooked beans with garlic and onions."),
}


@pytest.fixture(scope="module")
def index() -> BM25Index:
    return BM25Index(list(CORPUS.values()), BM25Config(stemmer=None))


def _pair(**kw: object) -> TrainPair:
    base = dict(
        question="Who won Super Bowl 50?",
        positive=CORPUS["pos"].passage,
        positive_id="pos",
        relevant_ids=frozenset({"pos", "rel2"}),
    )
    base.update(kw)
    return TrainPair(**base)  # type: ignore[arg-type]


def test_bm25_ranks_lexical_matches_first(index: BM25Index) -> None:
    ranked = index.search(["Super Bowl 50 Denver"], k=6)[0]
    assert ranked[0][0] in {"pos", "rel2", "ans"}
    assert ranked[-1][0] == "far"
    assert ranked == sorted(ranked, key=lambda x: -x[1])


def test_negatives_skip_relevant_positive_and_answer_passages(index: BM25Index) -> None:
    pairs = [_pair(answers=("Denver Broncos",))]
    mined = mine_hard_negatives(pairs, index, CORPUS, MiningConfig(num_negatives=2, rank_end=6))
    negs = mined[0].negatives
    assert len(negs) == 2
    texts = {d: c.passage for d, c in CORPUS.items()}
    for forbidden in ("pos", "rel2", "ans"):
        assert texts[forbidden] not in negs
    assert negs[0] == texts["neg1"]  # the best-ranked allowed passage comes first


def test_without_answers_an_answer_bearing_passage_may_be_mined(index: BM25Index) -> None:
    mined = mine_hard_negatives([_pair()], index, CORPUS, MiningConfig(num_negatives=3, rank_end=6))
    assert CORPUS["ans"].passage in mined[0].negatives
    ranked = [d for d, _ in index.search(["Who won Super Bowl 50?"], k=6)[0] if d not in {"pos", "rel2"}]
    assert mined[0].negatives == tuple(CORPUS[d].passage for d in ranked[:3])  # BM25 order


def test_rank_window_and_count(index: BM25Index) -> None:
    full = index.search(["Who won Super Bowl 50?"], k=6)[0]
    allowed = [d for d, _ in full if d not in {"pos", "rel2"}]
    mined = mine_hard_negatives([_pair()], index, CORPUS, MiningConfig(num_negatives=5, rank_start=3, rank_end=6))
    window_ids = [d for d, _ in full[3:6] if d not in {"pos", "rel2"}]
    assert mined[0].negatives == tuple(CORPUS[d].passage for d in window_ids)
    assert len(mined[0].negatives) < len(allowed)  # the window limits how many can be found
    with pytest.raises(ValueError, match="empty"):
        mine_hard_negatives([_pair()], index, CORPUS, MiningConfig(rank_start=5, rank_end=5))


def test_zero_negatives_is_a_no_op(index: BM25Index) -> None:
    pairs = [_pair()]
    assert mine_hard_negatives(pairs, index, CORPUS, MiningConfig(num_negatives=0)) == pairs


def test_query_with_unknown_words_only(index: BM25Index) -> None:
    assert len(index.search(["zzzz qqqq"], k=3)[0]) == 3
