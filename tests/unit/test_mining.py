"""BM25 hard negatives: top-ranked, not relevant, not the positive, no answer string, inside the rank window."""

from __future__ import annotations

import numpy as np
import pytest

from encoders.data import CorpusDoc, TrainPair
from services.lab.shared.mining import BM25Config, BM25Index, DenseIndex, MiningConfig, mine_hard_negatives

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


# --- dense ranking and denoising (a second mining round; positive-aware false-negative removal) ---------------


class BagOfWords:
    """Stand-in towers for the unit tests: normalised word counts over the texts' own vocabulary."""

    fingerprint = "bag-of-words"

    def __init__(self) -> None:
        import re

        words = sorted({w for d in CORPUS.values() for w in re.findall(r"\w+", d.passage.lower())})
        self._re, self._vocab = re, {w: i for i, w in enumerate(words)}

    def _encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), len(self._vocab)), dtype=np.float32)
        for row, text in enumerate(texts):
            for w in self._re.findall(r"\w+", text.lower()):
                if w in self._vocab:
                    out[row, self._vocab[w]] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    def encode_queries(self, questions: list[str], batch_size: int = 32) -> np.ndarray:
        return self._encode(questions)

    def encode_documents(self, passages: list[str], batch_size: int = 32) -> np.ndarray:
        return self._encode(passages)


DUPLICATE = CorpusDoc("dup", "Denver Broncos", "The Denver Broncos won Super Bowl 50 in February 2016 again.")


def test_dense_index_ranks_by_inner_product() -> None:
    towers = BagOfWords()
    dense = DenseIndex(list(CORPUS.values()), towers)
    ranked = dense.search(["Who won Super Bowl 49?", "garlic beans"], k=3)
    assert [len(r) for r in ranked] == [3, 3]
    assert ranked[0][0][0] == "neg1" and ranked[1][0][0] == "far"
    for row in ranked:
        assert [s for _, s in row] == sorted((s for _, s in row), reverse=True)
    q = towers.encode_queries(["Who won Super Bowl 49?"])[0]
    assert ranked[0][0][1] == pytest.approx(float(q @ towers.encode_documents([CORPUS["neg1"].passage])[0]))
    assert len(dense.search(["anything"], k=100)[0]) == len(CORPUS)  # k capped at the corpus


def test_dense_mining_takes_the_towers_ranking() -> None:
    dense = DenseIndex(list(CORPUS.values()), BagOfWords())
    mined = mine_hard_negatives([_pair()], dense, CORPUS, MiningConfig(num_negatives=2, rank_end=6, source="dense"))
    allowed = [d for d, _ in dense.search([_pair().question], k=6)[0] if d not in {"pos", "rel2"}]
    assert mined[0].negatives == tuple(CORPUS[d].passage for d in allowed[:2])


def test_denoise_drops_what_the_towers_score_near_the_positive() -> None:
    corpus = {**CORPUS, "dup": DUPLICATE}  # an unlabelled near-copy of the positive: a false negative
    dense = DenseIndex(list(corpus.values()), BagOfWords())
    bm25 = BM25Index(list(corpus.values()), BM25Config(stemmer=None))
    pair = _pair(question="Denver Broncos Super Bowl 50 February 2016")
    plain = mine_hard_negatives([pair], bm25, corpus, MiningConfig(num_negatives=2, rank_end=7))[0].negatives
    assert DUPLICATE.passage in plain
    denoised = mine_hard_negatives([pair], bm25, corpus, MiningConfig(num_negatives=2, rank_end=7, denoise=0.9),
                                   scorer=dense)[0].negatives
    assert DUPLICATE.passage not in denoised and len(denoised) == 2
    ceiling = 0.9 * dense.scores([pair.question], [pair.positive])[0]
    assert all(dense.scores([pair.question], [n])[0] < ceiling for n in denoised)


def test_denoise_needs_towers_and_a_fraction() -> None:
    dense = DenseIndex(list(CORPUS.values()), BagOfWords())
    bm25 = BM25Index(list(CORPUS.values()), BM25Config(stemmer=None))
    with pytest.raises(ValueError, match="scorer"):
        mine_hard_negatives([_pair()], bm25, CORPUS, MiningConfig(denoise=0.95))
    with pytest.raises(ValueError, match="denoise"):
        mine_hard_negatives([_pair()], bm25, CORPUS, MiningConfig(denoise=1.5), scorer=dense)
