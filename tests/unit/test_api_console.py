"""The search console's routes in-process (TestClient, FakeRuntime): the page and its assets load without a key and
reference nothing outside the server; GET /v1/eval/report serves the report `dpr eval --report` kept in the data
dir (and says how to make one when there is none); GET /v1/status carries what the console's collection panel
shows (default mode, model name, rollback target)."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from kit.fakes import FakeRuntime, HashTowers
from test_api_routes import DOCS, _settings, assert_error, ingest

from encoders.data import CorpusDoc, RetrievalDataset
from entrypoints.api.app import create_app
from entrypoints.api.routes.console import ASSET_DIR
from services.lab.evaluation.retrieval import Retrieval, bm25_retriever, evaluate_systems, write_report
from services.latest_report import keep_latest, latest_dir
from services.lifecycle.state import PREVIOUS_KEY
from services.store.points import CollectionSpec

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
KEY = {"X-API-Key": "s3cret"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(_settings(tmp_path), runtime=FakeRuntime(), warm_model=False)) as c:
        yield c


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(_settings(tmp_path, api_key="s3cret"), runtime=FakeRuntime(), warm_model=False)
    with TestClient(app) as c:
        yield c


# --- the page --------------------------------------------------------------------------------------------------


def test_page_and_assets_are_served_with_a_same_origin_policy(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    linked = re.findall(r'(?:src|href)="([^"#]+)"', page.text)
    assert set(linked) == {"data:,", "/console/console.css", "/console/api.js", "/console/console.js",
                           "/console/sources.js"}
    for path, kind in (("/console/api.js", "text/javascript"), ("/console/console.js", "text/javascript"),
                       ("/console/sources.js", "text/javascript"), ("/console/console.css", "text/css")):
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), path
        assert r.content == (ASSET_DIR / path.rsplit("/", 1)[1]).read_bytes()
    assert_error(client.get("/console/index.py"), 404, "not_found")
    assert_error(client.get("/console/..%2Fapp.py"), 404, "not_found")
    assert "/" not in client.get("/openapi.json").json()["paths"]


def test_the_shipped_files_fetch_nothing_from_elsewhere() -> None:
    """Works offline: no URL with a scheme or a protocol-relative URL in any shipped file."""
    files = sorted(ASSET_DIR.iterdir())
    assert {f.name for f in files} == {"index.html", "api.js", "console.js", "sources.js", "console.css"}
    for f in files:
        text = f.read_text()
        assert not re.search(r"\b(?:https?|wss?|ftp):", text), f.name
        assert not re.search(r"""(?:src|href|url\()\s*=?\s*["']?//""", text), f.name
        assert "@import" not in text, f.name
        # data reaches the page as text nodes: no HTML parsing of strings anywhere
        assert not re.search(r"\.(?:inner|outer)HTML\s*=|insertAdjacentHTML|document\.write", text), f.name


def test_package_data_ships_every_console_file() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = patterns["entrypoints.api"]
    package = ASSET_DIR.parent
    for f in ASSET_DIR.iterdir():
        assert any(f.relative_to(package).match(g) for g in globs), f"{f.name} is not in package-data"


def test_with_a_key_the_page_loads_and_the_data_routes_still_need_it(keyed: TestClient) -> None:
    for path in ("/", "/console/api.js", "/console/console.js", "/console/sources.js", "/console/console.css"):
        assert keyed.get(path).status_code == 200, path
    for path in ("/v1/status", "/v1/eval/report", "/v1/eval/report/plots/recall_at_k.png"):
        err = assert_error(keyed.get(path), 401, "unauthorized")
        assert "X-API-Key" in err["message"]
    assert keyed.get("/v1/status", headers=KEY).status_code == 200
    assert_error(keyed.get("/v1/eval/report", headers=KEY), 404, "not_found")


# --- the evaluation report -------------------------------------------------------------------------------------


def _report(tmp_path: Path, name: str, with_answers: bool = True) -> Path:
    corpus = {
        "p1": CorpusDoc("p1", "Paris", "Paris is the capital of France."),
        "p2": CorpusDoc("p2", "Berlin", "Berlin is the capital of Germany."),
        "p3": CorpusDoc("p3", "Rome", "Rome is the capital of Italy."),
    }
    answers = {"q1": ["Paris"], "q2": ["Berlin"]} if with_answers else {}
    ds = RetrievalDataset(name=name, corpus=corpus, queries={"q1": "capital of France", "q2": "capital of Germany"},
                          qrels={"q1": {"p1": 1}, "q2": {"p2": 1}}, answers=answers)

    def wrong(dataset: RetrievalDataset, k: int) -> Retrieval:
        return Retrieval(run={q: {"p3": 1.0} for q in dataset.queries}, texts={q: ["Rome"] for q in dataset.queries})

    out = tmp_path / f"out-{name}"
    write_report(evaluate_systems(ds, {"bm25": bm25_retriever(), "wrong": wrong}, k=3), out)
    return out


def test_no_report_is_a_404_that_says_how_to_make_one(client: TestClient) -> None:
    err = assert_error(client.get("/v1/eval/report"), 404, "not_found")
    assert "dpr eval" in err["message"] and "--report" in err["message"]
    assert_error(client.get("/v1/eval/report/plots/recall_at_k.png"), 404, "not_found")


def test_the_latest_report_and_its_plots(client: TestClient, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    keep_latest(settings, _report(tmp_path, "toy"))
    body = client.get("/v1/eval/report").json()
    assert body["dataset"] == "toy" and body["queries"] == 2 and body["documents"] == 3
    assert body["systems"]["bm25"]["metrics"]["mrr@10"] == pytest.approx(1.0)
    assert body["systems"]["wrong"]["metrics"]["recall@100"] == pytest.approx(0.0)
    assert body["source"] == str((tmp_path / "out-toy").resolve()) and body["written_at"]
    assert {(p["name"], p["label"]) for p in body["plots"]} == {
        ("recall_at_k.png", "recall@k"), ("answer_at_k.png", "top-k answer accuracy")}
    for plot in body["plots"]:
        png = client.get(plot["url"])
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert png.content == (tmp_path / "out-toy" / plot["name"]).read_bytes()
    err = assert_error(client.get("/v1/eval/report/plots/results.json"), 404, "not_found")
    assert "answer_at_k.png" in err["message"]
    assert_error(client.get("/v1/eval/report/plots/..%2Fmeta.json"), 404, "not_found")


def test_a_new_report_replaces_the_whole_old_one(client: TestClient, tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    keep_latest(settings, _report(tmp_path, "first"))
    keep_latest(settings, _report(tmp_path, "second", with_answers=False))
    body = client.get("/v1/eval/report").json()
    assert body["dataset"] == "second"
    assert [p["name"] for p in body["plots"]] == ["recall_at_k.png"]  # the first report's answer plot is gone
    assert_error(client.get("/v1/eval/report/plots/answer_at_k.png"), 404, "not_found")
    assert sorted(p.name for p in latest_dir(settings).parent.iterdir()) == ["latest"]  # no staging left over


def test_an_unreadable_report_is_reported_as_none(client: TestClient, tmp_path: Path) -> None:
    folder = latest_dir(_settings(tmp_path))
    folder.mkdir(parents=True)
    (folder / "results.json").write_text("[1, 2")
    assert_error(client.get("/v1/eval/report"), 404, "not_found")


# --- what the collection panel shows ---------------------------------------------------------------------------


def test_status_says_default_mode_model_name_and_rollback_target(client: TestClient) -> None:
    empty = client.get("/v1/status").json()
    assert (empty["default_mode"], empty["model_name"], empty["rollback"]) == (None, None, None)
    ingest(client, DOCS)
    first = client.get("/v1/status").json()
    assert first["default_mode"] == "hybrid" and first["rollback"] is None  # BM25 vectors, no tuning: label-free
    assert first["serving"]["source"] == "label-free"
    assert first["serving"]["fusion"] == {"fusion": "linear", "linear_weight": 0.5}
    assert first["serving"]["reason"].startswith("label-free default: hybrid linear, dense weight 0.5, measured")
    assert first["search_ef"]["search"] == "exact scan"  # below the index threshold: no graph to calibrate
    assert first["model_name"] is None  # hashing towers: no model of that fingerprint in the registry

    store = client.app.state.api.runtime.store  # type: ignore[attr-defined]
    old = store.info().active
    towers = HashTowers(dim=old.spec.dim, name="hash-b")
    newer = store.create_generation(CollectionSpec(dim=towers.dim, distance=towers.similarity,
                                                   model=towers.fingerprint, sparse=True))
    store.activate(newer)
    store.update_settings({PREVIOUS_KEY: old.name, "model_name": "hash-b", "mode": "hybrid",
                           "hybrid": {"fusion": "rrf", "rrf_k": 60, "tuned_on": {"dataset": "dev"}}},
                          generation=newer)
    now = client.get("/v1/status").json()
    assert now["generation"] == newer and now["model_name"] == "hash-b" and now["default_mode"] == "hybrid"
    assert now["rollback"] == {"generation": old.name, "points": old.count, "model": old.spec.model}
    assert now["search_settings"]["hybrid"]["tuned_on"] == {"dataset": "dev"}
    assert now["serving"]["source"] == "tuned" and now["serving"]["reason"].startswith("tuned on dev")
