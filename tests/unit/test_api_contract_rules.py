"""The rules issue 71 made exact, one by one, on the real app in process (the fuzzer's view of them is
tests/integration/test_api_contract.py): what the schema says is what the server does.

- strict types: no boolean for a number, no numeric string; an integral float is an integer, as in JSON Schema;
- cross-field rules stated in the schema (oneOf, dependentRequired) and enforced (422 naming the fields);
- HTTP methods: 405 with the path's exact Allow, OPTIONS 204, HEAD as GET without a body, 401 with WWW-Authenticate;
- keys: none can be made over HTTP on a server without keys; a name is required, a rate bounded; an admin key
  cannot revoke itself;
- every /v1 operation documents each status with the one error shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from kit.fakes import FakeRuntime
from test_api_routes import DOCS, assert_error, ingest

from dpr_client import wire
from entrypoints.api.app import create_app, openapi_document
from services import feedback
from services.access import KeyStore, keys_path
from services.core.settings import ApiSettings, Settings
from services.readers import MAX_ID_CHARS
from services.store.common import FILTER_KEY_MAX_CHARS, FILTER_KEY_PATTERN

pytestmark = pytest.mark.unit


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(Settings(data_dir=tmp_path / "dpr", api=ApiSettings(max_documents=5)), runtime=FakeRuntime(),
                     warm_model=False)
    with TestClient(app) as c:
        yield c


def _component(client: TestClient, name: str) -> dict[str, Any]:
    schema = client.get("/openapi.json").json()
    return {"$defs": schema["components"]["schemas"], **schema["components"]["schemas"][name]}


def _valid(schema: dict[str, Any], body: object) -> bool:
    return bool(jsonschema.Draft202012Validator(schema).is_valid(body))


def test_a_boolean_or_a_string_is_no_number_and_an_integral_float_is_an_integer(client: TestClient) -> None:
    ingest(client, DOCS)
    for body in ({"question": "q", "rerank_weight": False}, {"question": "q", "k": True}, {"question": "q", "k": "3"},
                 {"question": "q", "k": 2.5}, {"question": "q", "linear_weight": "0.5"}):
        err = assert_error(client.post("/v1/search", json=body), 422, "validation")
        assert next(iter(set(body) - {"question"})) in err["message"], err
    assert client.post("/v1/search", json={"question": "river", "k": 2.0}).status_code == 200
    search = _component(client, "SearchIn")
    for name in ("k", "rerank_weight"):
        assert not _valid(search, {"question": "q", name: True})  # the schema refuses it too


def test_feedback_names_one_hit_in_the_schema_and_at_the_server(client: TestClient) -> None:
    ingest(client, DOCS)
    schema = _component(client, "FeedbackIn")
    point = "0b1c7a6e-2b7c-4f2a-9a3b-1a2b3c4d5e6f"
    refused = [{"question": "q", "relevant": True},  # neither
               {"question": "q", "relevant": True, "doc_id": "cats", "point_id": point},  # both
               {"question": "q", "relevant": True, "point_id": point, "chunk": 0},  # chunk without doc_id
               {"question": "q", "relevant": True, "doc_id": None},  # null: absent or a value
               {"question": "   ", "relevant": True, "doc_id": "cats"}]  # blank
    for body in refused:
        assert not _valid(schema, body), body
        assert_error(client.post("/v1/feedback", json=body), 422, "validation")
    ok = {"question": "what purrs?", "relevant": True, "doc_id": "cats", "chunk": 0}
    assert _valid(schema, ok)
    assert client.post("/v1/feedback", json=ok).json()["outcome"] == "new"
    assert (wire.MAX_FEEDBACK_QUESTION_CHARS, wire.MAX_ID_CHARS) == (feedback.MAX_QUESTION_CHARS,
                                                                              feedback.MAX_ID_CHARS)


def test_prune_needs_sync_prefix_in_the_schema_and_at_the_server(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/v1/documents"]["post"]
    (query,) = operation["parameters"]
    assert (query["in"], query["style"], query["explode"]) == ("query", "form", True)
    assert query["schema"]["dependentRequired"] == {"prune": ["sync_prefix"]}
    assert not _valid(query["schema"], {"prune": True})
    assert _valid(query["schema"], {"sync_prefix": "a/", "prune": True})
    docs = {"documents": DOCS[:1]}
    err = assert_error(client.post("/v1/documents?prune=true", json=docs), 422, "validation")
    assert "sync_prefix" in err["message"]
    assert_error(client.post("/v1/documents?sync_prefix=a/&prune=1", json=docs), 422, "validation")  # not true/false
    assert client.post("/v1/documents?sync_prefix=a/&prune=false", json=docs).status_code == 202
    # blank as the server's strip() knows it (U+001D is white space to Python, not to ECMA's or Rust's \s): the
    # schema's pattern spells it out, so the schema and the server agree (the long fuzz found the difference)
    assert not _valid(query["schema"], {"sync_prefix": "\x1d"})
    err = assert_error(client.post("/v1/documents?sync_prefix=%1D", json=docs), 422, "validation")
    assert "blank" in err["message"]
    assert wire.MAX_ID_CHARS == MAX_ID_CHARS  # sync_prefix is bounded as an id


def test_filter_keys_are_field_names_in_the_schema(client: TestClient) -> None:
    ingest(client, DOCS)
    filters = _component(client, "SearchIn")["properties"]["filters"]
    assert filters["propertyNames"] == {"type": "string", "minLength": 1, "maxLength": FILTER_KEY_MAX_CHARS,
                                        "pattern": FILTER_KEY_PATTERN}
    assert not _valid(filters, {"not a key": 1}) and not _valid(filters, {"lang": [True]})
    assert_error(client.post("/v1/search", json={"question": "q", "filters": {"not a key": 1}}), 422, "validation")
    assert_error(client.post("/v1/search", json={"question": "q", "filters": {"lang": [1, "en"]}}), 422,
                 "validation")
    assert client.post("/v1/search", json={"question": "q", "filters": {"lang": ["en", "fr"]}}).status_code == 200


def test_too_many_documents_is_the_schemas_max_items(client: TestClient) -> None:
    documents = _component(client, "DocumentsIn")["properties"]["documents"]
    assert documents["maxItems"] == 5  # this server's DPR_API__MAX_DOCUMENTS
    six = [{"id": str(i), "text": "t"} for i in range(6)]
    err = assert_error(client.post("/v1/documents", json={"documents": six}), 422, "validation")
    assert "DPR_API__MAX_DOCUMENTS" in err["message"]


def test_methods_allow_options_and_head(client: TestClient) -> None:
    for path, allow in (("/v1/feedback", "GET, HEAD, POST, OPTIONS"), ("/v1/snapshots", "GET, HEAD, POST, OPTIONS"),
                        ("/v1/search", "POST, OPTIONS"), ("/v1/documents/a/b.txt", "DELETE, OPTIONS"),
                        ("/healthz", "GET, HEAD, OPTIONS")):
        refused = client.request("PATCH", path)
        err = assert_error(refused, 405, "method_not_allowed")
        assert refused.headers["allow"] == allow and allow in err["message"], (path, refused.headers)
        options = client.options(path)
        assert (options.status_code, options.headers["allow"], options.content) == (204, allow, b"")
    got, head = client.get("/v1/status"), client.head("/v1/status")
    assert head.status_code == got.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]
    assert client.request("PATCH", "/no/such/path").status_code == 404


def test_keys_cannot_be_seized_and_are_checked(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path / "dpr"), runtime=FakeRuntime(), warm_model=False)
    with TestClient(app) as c:
        assert not any("security" in op for ops in c.get("/openapi.json").json()["paths"].values()
                       for op in ops.values())  # no keys: the schema asks for none
        for request in (c.post("/v1/keys", json={"role": "admin", "name": "me"}), c.get("/v1/keys")):
            err = assert_error(request, 403, "forbidden")
            assert "dpr keys create" in err["message"] and "DPR_API__API_KEY" in err["message"]
        assert not keys_path(tmp_path / "dpr").exists()
        _, token = KeyStore(keys_path(tmp_path / "dpr")).create("admin", name="operator")  # on the machine
        refused = c.get("/v1/status")
        assert_error(refused, 401, "unauthorized")
        assert refused.headers["www-authenticate"] == "Bearer"
        assert "security" in c.get("/openapi.json").json()["paths"]["/v1/status"]["get"]  # the schema follows
        h = {"X-API-Key": token}
        for body in ({"role": "read"}, {"role": "read", "name": ""}, {"role": "read", "name": "  "},
                     {"role": "read", "name": "x", "rate": 5e-324}, {"role": "read", "name": "x", "rate": 1e9},
                     {"role": "read", "name": "x", "rate": None}, {"role": "read", "name": "x", "rate": True}):
            assert_error(c.post("/v1/keys", json=body, headers=h), 422, "validation")
        made = c.post("/v1/keys", json={"role": "read", "name": "dashboard", "rate": 0.1}, headers=h)
        assert made.status_code == 201 and made.json()["rate"] == 0.1, made.text
        me = c.get("/v1/whoami", headers=h).json()["key"]["id"]
        err = assert_error(c.delete(f"/v1/keys/{me}", headers=h), 409, "conflict")
        assert f"dpr keys revoke {me}" in err["message"]


def test_every_status_is_documented_with_the_error_shape(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path / "dpr"), runtime=FakeRuntime(), warm_model=False)
    schema = openapi_document(app, locked=True)
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert any(code.startswith("2") for code in responses), (method, path)
            for code, response in responses.items():
                assert response.get("content") or code == "204", (method, path, code)
                if path.startswith("/v1/") and code[0] in "45":
                    ref = response["content"]["application/json"]["schema"]["$ref"]
                    assert ref == "#/components/schemas/ErrorResponse", (method, path, code)
            if path.startswith("/v1/"):
                assert {"400", "401", "403", "404", "409", "413", "415", "422", "429", "503"} <= set(responses)
                assert "WWW-Authenticate" in responses["401"]["headers"]
                assert "Retry-After" in responses["429"]["headers"] and "Retry-After" in responses["503"]["headers"]
