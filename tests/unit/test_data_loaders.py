"""Loaders: well-formed inputs load; malformed ones fail with the file, the line and the fix."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from encoders.data import CorpusDoc, labelled_pairs, split_dev_queries
from services.readers import (
    DataError,
    load_beir,
    load_corpus,
    load_pairs_jsonl,
    load_squad,
    squad_article_split,
)
from services.readers.jsonl import iter_objects

pytestmark = pytest.mark.unit


def _beir(tmp_path: Path, qrels: str = "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t1\nq2\td2\t0\n") -> Path:
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    with gzip.open(folder / "corpus.jsonl.gz", "wt") as f:
        f.write(json.dumps({"_id": "d1", "title": "T1", "text": "text one"}) + "\n")
        f.write(json.dumps({"_id": "d2", "text": ""}) + "\n")  # empty text is allowed (Cranfield has some)
    (folder / "queries.jsonl").write_text(
        json.dumps({"_id": "q1", "text": "question one"}) + "\n" + json.dumps({"_id": "q2", "text": "two"}) + "\n"
    )
    (folder / "qrels" / "test.tsv").write_text(qrels)
    return folder


def test_beir_loads_and_drops_unjudged_queries(tmp_path: Path) -> None:
    ds = load_beir(_beir(tmp_path), "test")
    assert ds.queries == {"q1": "question one"}  # q2's only judgment is 0: not relevant
    assert ds.qrels == {"q1": {"d1": 1, "d2": 1}}
    assert ds.corpus["d1"].passage == "T1\ntext one"
    pairs = labelled_pairs(ds)
    assert [p.positive_id for p in pairs] == ["d1", "d2"]
    assert pairs[0].relevant_ids == frozenset({"d1", "d2"})


def test_beir_unknown_split_lists_the_available_ones(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"train.*available splits: test.*--split"):
        load_beir(_beir(tmp_path), "train")


def test_beir_bad_qrels_row_names_file_and_line(tmp_path: Path) -> None:
    folder = _beir(tmp_path, "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1 d2 1\n")
    with pytest.raises(DataError, match=r"test\.tsv:3: expected 3 tab-separated columns"):
        load_beir(folder, "test")
    folder2 = _beir(tmp_path / "b", "query-id\tcorpus-id\tscore\nq1\td1\thigh\n")
    with pytest.raises(DataError, match=r"test\.tsv:2: score 'high' is not a number"):
        load_beir(folder2, "test")


def test_beir_corpus_line_errors(tmp_path: Path) -> None:
    folder = _beir(tmp_path)
    with gzip.open(folder / "corpus.jsonl.gz", "wt") as f:
        f.write(json.dumps({"_id": "d1", "text": "ok"}) + "\n")
        f.write('{"_id": "d2", "text": "broken\n')
    with pytest.raises(DataError, match=r"corpus\.jsonl\.gz:2: is not valid JSON.*one JSON object per line"):
        load_beir(folder, "test")
    with gzip.open(folder / "corpus.jsonl.gz", "wt") as f:
        f.write(json.dumps({"_id": "d1", "body": "no text field"}) + "\n")
    with pytest.raises(DataError, match=r"corpus\.jsonl\.gz:1: missing field 'text'"):
        load_beir(folder, "test")


def test_beir_missing_pieces(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a directory"):
        load_beir(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no corpus.jsonl"):
        load_beir(tmp_path / "empty")


def _squad(tmp_path: Path, n_articles: int = 6) -> Path:
    data = {
        "data": [
            {
                "title": f"Article_{i}",
                "paragraphs": [
                    {
                        "context": f"Paragraph {j} of article {i} mentions Paris.",
                        "qas": [{"id": f"a{i}p{j}", "question": f"Where in {i}/{j}?", "answers": [{"text": "Paris"}]}],
                    }
                    for j in range(2)
                ],
            }
            for i in range(n_articles)
        ]
    }
    path = tmp_path / "dev.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    return path


def test_squad_article_split_is_deterministic_and_disjoint(tmp_path: Path) -> None:
    path = _squad(tmp_path)
    train = load_squad(path, "train")
    test = load_squad(path, "test")
    assert load_squad(path, "test").queries == test.queries
    assert not set(train.corpus) & set(test.corpus)  # never a shared paragraph
    assert len(train.corpus) + len(test.corpus) == 12
    train_articles = {d.split("#")[0] for d in train.corpus}
    test_articles = {d.split("#")[0] for d in test.corpus}
    assert not train_articles & test_articles
    qid = next(iter(test.queries))
    assert test.answers[qid] == ["Paris"]
    assert set(test.qrels[qid]) <= set(test.corpus)
    split = squad_article_split([f"Article_{i}" for i in range(6)])
    assert sorted(split.values()).count("test") == 3


def test_squad_malformed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [{"title": "x"}]}')
    with pytest.raises(DataError, match=r"data\[0\] needs a string 'title' and a 'paragraphs' list"):
        load_squad(bad)
    bad.write_text("{not json")
    with pytest.raises(DataError, match=r"bad\.json:1: not valid JSON"):
        load_squad(bad)


def test_pairs_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        json.dumps({"question": "q?", "passage": "p", "negatives": ["n1"]})
        + "\n\n"
        + json.dumps({"question": "q2?", "positive_id": "d1", "negatives": ["d2", "free text"]})
        + "\n"
    )
    corpus = {
        "d1": CorpusDoc("d1", "T1", "text one"),
        "d2": CorpusDoc("d2", "", "text two"),
    }
    pairs = load_pairs_jsonl(path, corpus)
    assert pairs[0].positive == "p" and pairs[0].negatives == ("n1",)
    assert pairs[1].positive == "T1\ntext one"
    assert pairs[1].negatives == ("text two", "free text")  # a corpus id resolves to its passage
    assert pairs[1].relevant_ids == frozenset({"d1"})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"passage": "p"}', r"pairs\.jsonl:2: missing field 'question'"),
        ('{"question": "q"}', r"pairs\.jsonl:2: needs 'passage' or 'positive_id'"),
        ('{"question": "q", "passage": ""}', r"pairs\.jsonl:2: field 'passage' is empty"),
        ('{"question": "q", "passage": "p", "negatives": "n"}', r"pairs\.jsonl:2: 'negatives' must be a list"),
        ('["q", "p"]', r"pairs\.jsonl:2: is not a JSON object \(got list\)"),
        ('{"question": "q", "positive_id": "d1"}', r"pairs\.jsonl:2: 'positive_id' needs a corpus.*--corpus"),
    ],
)
def test_pairs_jsonl_errors(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"question": "ok", "passage": "fine"}\n' + line + "\n")
    with pytest.raises(DataError, match=message):
        load_pairs_jsonl(path)


def test_corpus_jsonl_follows_the_one_row_rule(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    rows = [{"id": 7, "title": 3, "text": "x"}, {"_id": "a", "text": ""}, {"id": "b", "_id": "ignored", "text": "z"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = load_corpus(path)
    assert sorted(corpus) == ["7", "a", "b"]  # "id", else "_id"; an integer id is its string
    assert corpus["7"].title == "3" and corpus["a"].text == ""  # an empty row stays in a corpus (qrels may judge it)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"text": "y"}, r"c\.jsonl:1: has no 'id' or '_id'"),
        ({"_id": 1.5, "text": "y"}, r"c\.jsonl:1: '_id' must be a string or an integer, got float"),
        ({"id": True, "text": "y"}, r"'id' must be a string or an integer, got bool"),
        ({"_id": " ", "text": "y"}, r"has a blank '_id'"),
        ({"_id": "a", "text": 3}, r"c\.jsonl:1: field 'text' must be a string, got int"),
        ({"_id": "a"}, r"c\.jsonl:1: missing field 'text'"),
    ],
)
def test_corpus_jsonl_row_errors(tmp_path: Path, row: dict[str, object], message: str) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=message):
        load_corpus(path)


def test_corpus_ids_must_be_unique_whatever_their_type(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"_id": 7, "text": "x"}) + "\n" + json.dumps({"id": "7", "text": "y"}) + "\n")
    with pytest.raises(DataError, match="duplicate id '7'"):
        load_corpus(path)


def test_pairs_jsonl_missing_file_and_non_utf8(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        load_pairs_jsonl(tmp_path / "none.jsonl")
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes('{"question": "caf\xe9", "passage": "p"}\n'.encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8"):
        load_pairs_jsonl(bad)


def test_an_endless_line_refuses_training_data_without_being_held(tmp_path: Path) -> None:
    """A gzip bomb of one endless line (tens of MB, a few KB on disk) in training or evaluation data: refused by
    line and size, and the reader never joins the line (it reads past it in pieces), so memory stays bounded."""
    import tracemalloc

    def bomb(name: str, size: int) -> Path:
        path = tmp_path / name
        with gzip.open(path, "wb") as f:
            f.write(json.dumps({"_id": "d1", "text": "ok"}).encode() + b"\n")
            f.write(b'{"_id": "d2", "text": "' + b"a" * size + b'"}\n')
        return path

    with pytest.raises(DataError, match=r"corpus.jsonl.gz:2: a line of 25,000,025 bytes, over the 20,000,000-byte"):
        load_corpus(bomb("corpus.jsonl.gz", 25_000_000))
    big = bomb("big.jsonl.gz", 60_000_000)
    tracemalloc.start()
    with pytest.raises(DataError, match="big.jsonl.gz:2: a line of 60,000,025 bytes, over the 1,000,000-byte"):
        list(iter_objects(big, max_bytes=1_000_000))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 10_000_000, peak  # a few pieces of the limit's size, never the 60 MB line


def test_dev_split_is_deterministic_and_disjoint() -> None:
    ids = [str(i) for i in range(50)]
    train, dev = split_dev_queries(ids, 10)
    assert (train, dev) == split_dev_queries(list(reversed(ids)), 10)
    assert len(dev) == 10 and not set(train) & set(dev) and set(train) | set(dev) == set(ids)
