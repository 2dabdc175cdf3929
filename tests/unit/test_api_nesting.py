"""JSON documents nested thousands of levels deep over the API: that document fails with a reason naming it, the
others of the request are written (entrypoints/api/uploads.split_too_deep), for a JSON batch and an upload."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kit.fakes import FakeRuntime

from entrypoints.api.app import create_app
from entrypoints.api.uploads import MAX_JSON_DEPTH, split_too_deep
from services.core.settings import Settings

pytestmark = pytest.mark.unit

DEEP = "[" * 5000 + "]" * 5000


def _job(client: TestClient, job: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        body = client.get(f"/v1/jobs/{job}").json()
        if body["state"] in ("done", "failed") or time.monotonic() > deadline:
            return body  # type: ignore[no-any-return]
        time.sleep(0.02)


@pytest.fixture
def client(tmp_path: Path) -> Any:
    with TestClient(create_app(Settings(data_dir=tmp_path / "d"), runtime=FakeRuntime(), warm_model=False)) as c:
        yield c


def test_a_deep_document_in_a_json_batch_fails_alone(client: TestClient) -> None:
    body = ('{"documents": [{"id": "a", "text": "first [fine] \\" { text"}, '
            '{"id": "deep", "text": "x", "metadata": {"m": ' + DEEP + '}}, {"id": "b", "text": "second"}]}')
    r = client.post("/v1/documents", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 202, r.text
    assert r.json()["documents_received"] == 3
    job = _job(client, r.json()["job"])
    assert job["documents"] == 2
    assert [(f["source"], f["reason"]) for f in job["failed"]] == [("request.documents[1]", "too_deep")]
    assert "more than 64 levels" in job["failed"][0]["error"]


def test_a_batch_of_only_deep_documents_is_a_422_naming_it(client: TestClient) -> None:
    body = '{"documents": [{"id": "deep", "text": "x", "metadata": {"m": ' + DEEP + '}}]}'
    r = client.post("/v1/documents", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert "request.documents[0]" in r.json()["error"]["message"]


def test_a_deep_row_in_an_uploaded_jsonl_fails_alone(client: TestClient) -> None:
    rows = '{"id": "a", "text": "fine"}\n{"id": "deep", "text": "x", "m": ' + DEEP + '}\n{"id": "b", "text": "fine"}\n'
    r = client.post("/v1/documents", files={"file": ("rows.jsonl", rows.encode())})
    assert r.status_code == 202, r.text
    job = _job(client, r.json()["job"])
    assert job["documents"] == 2 and len(job["failed"]) == 1 and job["failed"][0]["source"].endswith(":2")


def test_split_too_deep_reads_strings_and_leaves_other_bodies_alone() -> None:
    ok = b'{"language": "en", "documents": [{"id": "a", "text": "[[[[\\"]]"}, {"id": "b", "text": "y"}]}'
    assert split_too_deep(ok) == (ok, [], 2)
    nested = "[" * (MAX_JSON_DEPTH + 5) + "]" * (MAX_JSON_DEPTH + 5)
    body = ('{"documents": [{"id": "a", "text": "x"}, {"id": "d", "text": "y", "metadata": {"m": ' + nested + '}}, '
            '{"id": "c", "text": "z"}], "language": "en"}').encode()
    reduced, deep, kept = split_too_deep(body)
    assert (deep, kept) == ([1], 2)
    assert [d["id"] for d in json.loads(reduced)["documents"]] == ["a", "c"]
    assert json.loads(reduced)["language"] == "en"
    assert split_too_deep(b"not json at all [[[") == (b"not json at all [[[", [], 0)
