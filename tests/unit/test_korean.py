"""Korean BM25 and the language plumbing: the Kiwi tokeniser, English vectors unchanged, detection, the language
stored with the collection (and read back by a fresh process), the --language conflict, Korean answer matching."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kit.fakes import FakeRuntime, HashTowers, ingest_items
from kit.policy import make_settings
from typer.testing import CliRunner

from encoders.data import CorpusDoc, RetrievalDataset
from encoders.korean import korean_terms
from entrypoints.cli.main import app
from services.core.errors import ConfigError, StoreUnavailable
from services.ingest.language import detect_language, hangul_share, prepare_collection, resolve_language
from services.ingest.pipeline import IngestPipeline
from services.lab.shared.metrics import has_answer
from services.lab.shared.mining import BM25Config, BM25Index
from services.query import QueryOptions, search
from services.readers import Document
from services.store import open_store
from services.store.sparse import Bm25Embedder, default_embedder, embedder_for, for_spec, spec_language

pytestmark = pytest.mark.unit

KO_DOCS = {
    "school": ("학교", "학생들은 매일 아침 학교에서 공부한다. 선생님은 교실에서 수학을 가르친다."),
    "river": ("한강", "한강은 서울을 가로지르는 큰 강이다. 강변에는 공원이 많다."),
    "food": ("김치", "김치는 배추와 고춧가루로 만드는 한국의 전통 음식이다."),
}
ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "Foxes are JUMPING; the dogs were sleeping in the café.",
    "the and are",
    "Dense passage retrieval trains a question tower and a passage tower.",
]


def test_particles_and_endings_are_dropped_and_stems_kept() -> None:
    assert "학교" in korean_terms("학교에서") and "학교" in korean_terms("학교는")
    assert not {"에서", "는", "을", "다", "."} & set(korean_terms("학교에서 공부를 했다."))
    assert korean_terms("Python 3.11과 漢字를 쓴다") == ["python", "3.11", "漢字", "쓰"]
    ko = embedder_for("ko")
    assert ko.embed_query("학교에서").indices == ko.embed_query("학교는").indices
    # the English tokenisation sees two unrelated words
    assert default_embedder().embed_query("학교에서").indices != default_embedder().embed_query("학교는").indices


def test_english_vectors_are_those_of_the_implementation_before_languages() -> None:
    from qdrant_edge import Bm25, Bm25Config

    before = Bm25(Bm25Config(k=1.2, b=0.75, avg_len=256.0, language="english"))  # what Bm25Embedder wrapped
    en = default_embedder()
    assert en.config() == {"language": "en", "k": 1.2, "b": 0.75, "avg_len": 256.0}
    assert Bm25Embedder(language="english").config() == en.config()
    for text in ENGLISH:
        ours, theirs = en.embed_document(text), before.embed_document(text)
        assert ours.indices == list(theirs.indices)
        assert ours.values == pytest.approx(list(theirs.values))
        # the question's tokens are the same; each now weighs its count in the question (it weighed 1.0)
        question, old = en.embed_query(text), before.embed_query(text)
        assert sorted(question.indices) == sorted(old.indices) and set(old.values) <= {1.0}
        assert dict(zip(question.indices, question.values, strict=True)) == en.term_counts(text)


def test_term_ids_are_the_same_in_another_process() -> None:
    code = (
        "import json; from services.store.sparse import embedder_for; "
        "print(json.dumps([embedder_for(l).embed_document(t).indices for l, t in "
        "[('ko', '한강은 서울을 가로지른다'), ('en', 'foxes jumping')]]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    here = [embedder_for("ko").embed_document("한강은 서울을 가로지른다").indices,
            default_embedder().embed_document("foxes jumping").indices]
    assert json.loads(done.stdout) == here


def test_detection() -> None:
    assert detect_language([v[1] for v in KO_DOCS.values()]) == "ko"
    assert detect_language(ENGLISH) == "en"
    assert detect_language([]) == "en" and detect_language(["1234 !!"]) == "en"
    # digits, spaces and markup do not dilute Korean; a Korean word in English prose does not make it Korean
    assert detect_language(["<p>2024년 3월 15일 서울 (Seoul) 12,345명</p>"]) == "ko"
    assert detect_language(["We ate kimchi (김치) in Seoul with friends after the conference."]) == "en"
    assert 0.0 < hangul_share(["abc 가나다"]) == pytest.approx(0.5)


def test_resolve_language_keeps_the_stored_one_and_refuses_a_conflict() -> None:
    assert resolve_language("auto", stored="ko", sample=ENGLISH) == "ko"
    assert resolve_language("ko", stored="ko") == "ko"
    assert resolve_language(None, stored=None, sample=[KO_DOCS["food"][1]]) == "ko"
    assert resolve_language("en", stored=None, sample=[KO_DOCS["food"][1]]) == "en"
    with pytest.raises(ConfigError) as e:
        resolve_language("en", stored="ko", collection="docs-ko")
    assert "collection 'docs-ko'" in str(e.value) and "drop --language" in str(e.value)
    with pytest.raises(ConfigError, match="use auto, en or ko"):
        resolve_language("fr", stored=None)


def _ko_items() -> list[Document]:
    return [Document(doc_id=k, title=t, text=x, source="test") for k, (t, x) in KO_DOCS.items()]


def test_a_new_collection_gets_its_detected_language_and_sparse_search_finds_korean() -> None:
    with FakeRuntime() as runtime:
        assert prepare_collection(runtime.store, lambda: pytest.fail("auto needs no model"), "auto", []) is None
        assert runtime.store.active() is None  # auto: the first batch decides, whoever runs it
        ingest_items(runtime.pipeline, _ko_items())  # the runtime's default embedder has no language chosen: detected
        spec = runtime.store.active().spec  # type: ignore[union-attr]
        assert spec.settings["bm25"]["language"] == "ko" and spec_language(spec) == "ko"
        hits = runtime.search("학생이 공부하는 곳은?", QueryOptions(mode="sparse", k=1))
        assert hits[0].passage.doc_id == "school"
        hits = search("서울의 강", store=runtime.store, towers=runtime.towers, sparse=default_embedder(),
                      options=QueryOptions(mode="sparse", k=1))
        assert hits[0].passage.doc_id == "river"
        # an existing collection keeps its language; an explicit other one is refused
        assert prepare_collection(runtime.store, lambda: pytest.fail("no towers needed"), "ko", []) == "ko"
        with pytest.raises(ConfigError, match="collection 'passages' tokenises BM25 as 'ko'"):
            prepare_collection(runtime.store, lambda: runtime.towers, "en", [])


def test_an_explicit_language_creates_the_collection_before_any_batch() -> None:
    with FakeRuntime() as runtime:
        assert prepare_collection(runtime.store, lambda: runtime.towers, "ko", []) == "ko"
        assert runtime.store.active() is None  # nothing to ingest: nothing created
        english = [Document(doc_id="e", title="", text=ENGLISH[0], source="t")]
        assert prepare_collection(runtime.store, lambda: runtime.towers, "ko", english) == "ko"
        assert spec_language(runtime.store.active().spec) == "ko"  # type: ignore[union-attr]
        ingest_items(runtime.pipeline, english)  # a batch of English text does not change the chosen language
        assert spec_language(runtime.store.active().spec) == "ko"  # type: ignore[union-attr]


def test_a_down_store_is_left_to_the_job() -> None:

    class DownStore:
        alias = "passages"

        def active(self) -> Any:
            raise StoreUnavailable("store down; retry")

    assert prepare_collection(DownStore(), lambda: HashTowers(), "ko", _ko_items()) is None  # type: ignore[arg-type]


def test_a_korean_collection_is_queried_in_korean_by_a_fresh_process(tmp_path: Path) -> None:
    settings = make_settings(data_dir=tmp_path, collection="ko-docs")
    store = open_store(settings)
    try:
        prepare_collection(store, lambda: HashTowers(), "ko", _ko_items())
        pipeline = IngestPipeline(store=store, towers=HashTowers(), chunking=settings.chunk, sparse=default_embedder())
        ingest_items(pipeline, _ko_items())
    finally:
        store.close()
    code = f"""
import json
from kit.fakes import HashTowers
from kit.policy import make_settings
from services.query import QueryOptions, search
from services.store.sparse import default_embedder, spec_language
from services.store import open_store
store = open_store(make_settings(data_dir={str(tmp_path)!r}, collection="ko-docs"))
hits = search("배추로 만든 음식", store=store, towers=HashTowers(), sparse=default_embedder(),
              options=QueryOptions(mode="sparse", k=1))
print(json.dumps([spec_language(store.active().spec), hits[0].passage.doc_id]))
store.close()
"""
    env_path = f"{Path(__file__).parents[2]}:{Path(__file__).parents[1]}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["ko", "food"]


def test_for_spec_passes_test_doubles_and_defaults_legacy_collections_to_english() -> None:
    from services.store.points import CollectionSpec

    legacy = CollectionSpec(dim=4, distance="cosine", model="m")
    assert spec_language(legacy) == "en" and for_spec(legacy, default_embedder()) is default_embedder()
    ko = CollectionSpec(dim=4, distance="cosine", model="m", settings={"bm25": embedder_for("ko").config()})
    assert for_spec(ko, default_embedder()) is embedder_for("ko")
    double = object()
    assert for_spec(ko, double) is double and for_spec(ko, None) is None


def test_cli_ingest_refuses_a_language_that_contradicts_the_collection(tmp_path: Path) -> None:
    settings = make_settings(data_dir=tmp_path / "dpr", collection="ko-docs")
    store = open_store(settings)
    try:
        prepare_collection(store, lambda: HashTowers(), "ko", _ko_items())
    finally:
        store.close()
    doc = tmp_path / "a.txt"
    doc.write_text("An English note.\n")
    env = {"DPR_DATA_DIR": str(tmp_path / "dpr")}
    res = CliRunner().invoke(app, ["ingest", str(doc), "--collection", "ko-docs", "--language", "en"], env=env)
    assert res.exit_code == 2, res.output
    assert "collection 'ko-docs' tokenises BM25 as 'ko'" in res.stderr and "--language ko" in res.stderr
    res = CliRunner().invoke(app, ["ingest", str(doc), "--language", "klingon"], env=env)
    assert res.exit_code == 2 and "use auto, en or ko" in res.stderr


def test_api_ingest_takes_the_language() -> None:
    from fastapi.testclient import TestClient

    from entrypoints.api.app import create_app

    runtime = FakeRuntime()
    app_ = create_app(runtime.settings, runtime=runtime, warm_model=False)
    body = {"documents": [{"id": k, "title": t, "text": x} for k, (t, x) in KO_DOCS.items()], "language": "ko"}
    with TestClient(app_) as c:
        assert c.post("/v1/documents", json=body).status_code == 202
        assert spec_language(runtime.store.active().spec) == "ko"  # type: ignore[union-attr]
        r = c.post("/v1/documents", json=body | {"language": "en"})
        assert r.status_code == 409 and "tokenises BM25 as 'ko'" in r.json()["error"]["message"]
        assert c.post("/v1/documents", json=body | {"language": "fr"}).status_code == 422


def test_korean_bm25_index_matches_across_particles_where_english_tokens_do_not() -> None:
    docs = [CorpusDoc(k, t, x) for k, (t, x) in KO_DOCS.items()]
    ko = BM25Index(docs, BM25Config.for_language("ko"))
    en = BM25Index(docs)
    assert ko.search(["학교는 어디에 있나?"], k=1)[0][0][0] == "school"
    assert en.search(["학교는 어디에 있나?"], k=3)[0][0][1] == 0.0  # no shared token at all
    with pytest.raises(ValueError, match="use en or ko"):
        BM25Config.for_language("de")


def test_korean_answers_match_with_particles_english_rule_unchanged() -> None:
    assert has_answer("그는 서울에서 태어났다.", ["서울"])
    assert has_answer("「서울」은 수도이다", ["서울"]) and has_answer("BTV를 통해 방송했다", ["BTV"])
    assert not has_answer("남서울에서 태어났다", ["서울"])
    assert has_answer("The cat sat.", ["cat"]) and not has_answer("The cats sat.", ["cat"])
    assert has_answer("He was born in the U.S. in 1990", ["US"])


def test_eval_detects_korean_and_tokenises_its_bm25_baseline_so() -> None:
    from services.lab.evaluation.store_retriever import compare_systems

    corpus = {k: CorpusDoc(k, t, x) for k, (t, x) in KO_DOCS.items()}
    ds = RetrievalDataset(
        name="ko", corpus=corpus,
        queries={"q1": "김치를 무엇으로 만드나?", "q2": "학교로 가서 무엇을 하나?", "q3": "한강이 가로지르는 도시"},
        qrels={"q1": {"food": 1}, "q2": {"school": 1}, "q3": {"river": 1}},
        answers={"q1": ["배추"], "q2": ["공부"], "q3": ["서울"]},
    )
    report = compare_systems(ds, settings=make_settings(), models=[], k=3)
    assert report.notes[0].startswith("language: ko") and "Kiwi" in report.notes[1]
    assert report.results[0].metrics["mrr@10"] == pytest.approx(1.0)
    english = compare_systems(ds, settings=make_settings(), models=[], k=3, language="en")
    assert english.results[0].metrics["mrr@10"] < 1.0


def _shared_data() -> Path | None:
    """../shared/data beside the checkout (or a worktree's parents); None when absent."""
    return next((p / "shared" / "data" for p in Path(__file__).resolve().parents if (p / "shared" / "data").is_dir()),
                None)


def test_korquad_folder_reads_with_an_article_split() -> None:
    """Needs ../shared/data/korquad-v1.0-dev (skipped without it): the folder reads as SQuAD, the article split
    gives disjoint paragraphs, and every question's own paragraph holds its answer under the Korean matching."""
    from services.readers import load_dataset

    shared = _shared_data()
    folder = shared / "korquad-v1.0-dev" if shared else None
    if folder is None or not folder.is_dir():
        pytest.skip("needs ../shared/data/korquad-v1.0-dev")
    full, train, test = (load_dataset(folder, split, "squad") for split in ("all", "train", "test"))
    assert (len({d.rsplit("#", 1)[0] for d in full.corpus}), len(full.corpus), len(full.queries)) == (140, 964, 5774)
    assert not set(train.corpus) & set(test.corpus)
    assert len(train.queries) + len(test.queries) == 5774 and len(train.corpus) + len(test.corpus) == 964
    found = sum(has_answer(full.corpus[next(iter(r))].passage, full.answers[q]) for q, r in full.qrels.items())
    assert found / len(full.qrels) > 0.99


def test_a_squad_folder_must_hold_one_json(tmp_path: Path) -> None:
    from services.core.errors import DataError
    from services.readers import load_squad

    with pytest.raises(DataError, match="exactly one .json"):
        load_squad(tmp_path)
    qa = {"id": "1", "question": "수도는?", "answers": [{"text": "서울"}]}
    data = {"data": [{"title": "T", "paragraphs": [{"context": "서울은 수도이다.", "qas": [qa]}]}]}
    (tmp_path / "a.json").write_text(json.dumps(data))
    assert load_squad(tmp_path).queries == {"1": "수도는?"}
