"""Judgements (services.feedback) and their routes: validation, repeats collapse, a later judgement replaces the
earlier one, they persist across a reopen and a re-embed-like rewrite, a judgement naming a point or document
that does not exist is refused naming it, roles (write to judge, admin to export), training pairs, the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kit.documents import THREE_TOPICS
from kit.fakes import FakeRuntime, ingest_items
from typer.testing import CliRunner

from entrypoints.api.app import create_app
from services import feedback
from services.access.keys import KeyStore, keys_path
from services.core.errors import CollectionNotFound, ConfigError
from services.core.settings import Settings
from services.store.points import point_id

pytestmark = pytest.mark.unit


def test_validation_collapse_replace_and_reopen(tmp_path: Path) -> None:
    with feedback.FeedbackStore.in_data_dir(tmp_path) as store:
        assert store.record("c", "  Which  river? ", "nile", 0, True).outcome == "new"
        assert store.record("c", "Which river?", "nile", 0, True).outcome == "unchanged"  # a repeat collapses
        assert store.record("c", "Which river?", "cats", None, False).outcome == "new"
        assert store.record("c", "Which river?", "nile", 0, False).outcome == "replaced"  # the later one wins
        assert store.record("other", "Which river?", "nile", 0, True).outcome == "new"  # another collection
        for bad, match in (({"question": "  "}, "question is empty"), ({"doc_id": ""}, "doc_id must be"),
                           ({"chunk": -1}, "chunk must be >= 0"), ({"question": "x" * 2001}, "at most")):
            args: dict[str, Any] = {"question": "q", "doc_id": "d", "chunk": 0} | bad
            with pytest.raises(ConfigError, match=match):
                store.record("c", args["question"], args["doc_id"], args["chunk"], True)
    with feedback.FeedbackStore.in_data_dir(tmp_path) as reopened:
        got = reopened.judgements("c")
        assert [(j.question, j.doc_id, j.chunk, j.relevant) for j in got] == [
            ("Which river?", "cats", None, False), ("Which river?", "nile", 0, False)]
        assert reopened.counts("c") == {"judgements": 2, "relevant": 0, "not_relevant": 2, "questions": 1}
        assert len(reopened.judgements()) == 3
    assert feedback.counts_in(tmp_path / "nothing-here", "c")["judgements"] == 0
    assert not (tmp_path / "nothing-here").exists()  # counting creates nothing


def test_resolve_and_training_pairs_through_the_store() -> None:
    with FakeRuntime() as runtime:
        ingest_items(runtime.pipeline, THREE_TOPICS)
        store = runtime.store
        assert feedback.resolve(store, point=point_id("nile", 0)) == ("nile", 0)
        assert feedback.resolve(store, doc_id="cats") == ("cats", None)
        with pytest.raises(CollectionNotFound, match="document 'nope' is not in collection 'passages'"):
            feedback.resolve(store, doc_id="nope")
        with pytest.raises(CollectionNotFound, match="document 'nile' has no chunk 7"):
            feedback.resolve(store, doc_id="nile", chunk=7)
        with pytest.raises(CollectionNotFound, match=f"point {point_id('nope', 0)!r} is not in"):
            feedback.resolve(store, point=point_id("nope", 0))
        with pytest.raises(ConfigError, match="not a point id"):
            feedback.resolve(store, point="abc")
        with pytest.raises(ConfigError, match="exactly one"):
            feedback.resolve(store, point=point_id("nile", 0), doc_id="nile")
        judgements = [
            feedback.Judgement("passages", "longest river?", "nile", 0, True),
            feedback.Judgement("passages", "longest river?", "cats", None, False),
            feedback.Judgement("passages", "longest river?", "gone", 0, False),  # deleted since: left out
            feedback.Judgement("passages", "only negatives?", "py", 0, False),
        ]
        pairs = feedback.training_pairs(store, judgements)
        assert len(pairs) == 1
        pair = pairs[0]
        assert pair.question == "longest river?" and pair.positive.startswith("Rivers\n")
        assert "Nile" in pair.positive and pair.positive_id == "nile#0"
        assert len(pair.negatives) == 1 and "Cats" in pair.negatives[0] and pair.relevant_ids == {"nile#0"}
        rows = list(feedback.export_rows(store, judgements))
        assert [r["question"] for r in rows] == ["longest river?", "only negatives?"]
        assert rows[1]["positives"] == [] and rows[1]["negatives"][0]["id"] == "py#0"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, FakeRuntime, dict[str, str]]]:
    data = tmp_path / "dpr"
    keys = KeyStore(keys_path(data))
    tokens = {role: keys.create(role, name=f"{role}-key")[1] for role in ("read", "write", "admin")}
    runtime = FakeRuntime()
    ingest_items(runtime.pipeline, THREE_TOPICS)
    app = create_app(Settings(data_dir=data), runtime=runtime, warm_model=False)
    with TestClient(app) as client:
        yield client, runtime, tokens
    runtime.close()


def _as(tokens: dict[str, str], role: str) -> dict[str, str]:
    return {"X-API-Key": tokens[role]}


def test_routes_judge_refuse_and_export(served: tuple[TestClient, FakeRuntime, dict[str, str]], tmp_path: Path
                                        ) -> None:
    client, _, tokens = served
    body = {"question": "Which river flows north?", "doc_id": "nile", "chunk": 0, "relevant": True}
    assert client.post("/v1/feedback", json=body).status_code == 401
    assert client.post("/v1/feedback", json=body, headers=_as(tokens, "read")).status_code == 403
    r = client.post("/v1/feedback", json=body, headers=_as(tokens, "write"))
    assert r.status_code == 200, r.text
    assert r.json() | {"judged_at": ""} == {
        "collection": "passages", "question": "Which river flows north?", "doc_id": "nile", "chunk": 0,
        "relevant": True, "judged_at": "", "judged_by": "write-key", "outcome": "new", "judgements": 1}
    assert client.post("/v1/feedback", json=body, headers=_as(tokens, "write")).json()["outcome"] == "unchanged"
    r = client.post("/v1/feedback", json={**body, "relevant": False}, headers=_as(tokens, "write"))
    assert r.json()["outcome"] == "replaced" and r.json()["judgements"] == 1
    r = client.post("/v1/feedback", json={"question": "cats?", "point_id": point_id("cats", 0), "relevant": True},
                    headers=_as(tokens, "write"))
    assert r.status_code == 200 and (r.json()["doc_id"], r.json()["chunk"]) == ("cats", 0)
    # what does not exist is refused, named
    r = client.post("/v1/feedback", json={**body, "doc_id": "atlantis"}, headers=_as(tokens, "write"))
    assert r.status_code == 404 and "'atlantis'" in r.json()["error"]["message"]
    r = client.post("/v1/feedback", json={"question": "q", "point_id": point_id("x", 3), "relevant": True},
                    headers=_as(tokens, "write"))
    assert r.status_code == 404 and point_id("x", 3) in r.json()["error"]["message"]
    for bad in ({**body, "chunk": -1}, {**body, "question": ""}, {"question": "q", "relevant": True},
                {**body, "relevant": "maybe"}, {**body, "extra": 1}):
        assert client.post("/v1/feedback", json=bad, headers=_as(tokens, "write")).status_code in (400, 422), bad
    # the export is the admin's
    assert client.get("/v1/feedback", headers=_as(tokens, "write")).status_code == 403
    r = client.get("/v1/feedback", headers=_as(tokens, "admin"))
    assert r.status_code == 200
    assert r.json()["counts"] == {"judgements": 2, "relevant": 1, "not_relevant": 1, "questions": 2}
    assert [j["doc_id"] for j in r.json()["judgements"]] == ["nile", "cats"]  # by question: "Which..." < "cats?"
    # the count is in the status every reader sees (the console shows it)
    assert client.get("/v1/status", headers=_as(tokens, "read")).json()["feedback"]["judgements"] == 2


def test_judgements_survive_a_restart_and_a_rewrite_of_the_points(tmp_path: Path) -> None:
    with FakeRuntime() as runtime:
        ingest_items(runtime.pipeline, THREE_TOPICS)
        data = runtime.settings.data_dir
        with feedback.FeedbackStore.in_data_dir(data) as store:
            store.record("passages", "longest river?", *feedback.resolve(runtime.store, doc_id="nile", chunk=0), True)
        runtime.store.delete_documents(["nile"])  # the points go and come back (as a re-embed rewrites them)
        ingest_items(runtime.pipeline, THREE_TOPICS)
        with feedback.FeedbackStore.in_data_dir(data) as store:  # a new process opens the file again
            pairs = feedback.training_pairs(runtime.store, store.judgements("passages"))
        assert [p.positive_id for p in pairs] == ["nile#0"]


def test_cli_list_and_export(tmp_path: Path) -> None:
    from entrypoints.cli.main import app

    with FakeRuntime() as runtime:
        ingest_items(runtime.pipeline, THREE_TOPICS)
        with feedback.FeedbackStore.in_data_dir(runtime.settings.data_dir) as store:
            store.record("passages", "longest river?", "nile", 0, True)
            store.record("passages", "longest river?", "cats", 0, False)
        env = {"DPR_DATA_DIR": str(runtime.settings.data_dir), "DPR_COLLECTION": "passages"}
        runner = CliRunner()
        r = runner.invoke(app, ["feedback", "list", "--json"], env=env)
        assert r.exit_code == 0, r.output
        listed = json.loads(r.output)
        assert listed["counts"]["judgements"] == 2 and len(listed["judgements"]) == 2
        r = runner.invoke(app, ["feedback", "list"], env=env)
        assert r.exit_code == 0 and "longest river?" in r.output and "not relevant" in r.output
