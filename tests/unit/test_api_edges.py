"""Hostile requests (issue 12): every error a client can cause is a 4xx naming the field and the fix, never a 500.

Filter keys the engine cannot parse, lone surrogates anywhere in a body, a non-ASCII API key, over-long ids, and
uploads that are big, many-rowed or compressed (the limits apply while reading, not after).
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kit.fakes import FakeRuntime
from test_api_routes import DOCS, assert_error, ingest

from entrypoints.api.app import create_app
from entrypoints.api.uploads import collect
from services.core.settings import ApiSettings, Settings
from services.readers import MAX_ID_CHARS, Document, DocumentFailure, Item

pytestmark = pytest.mark.unit


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path / "dpr", api=ApiSettings(max_documents=5, max_request_bytes=64_000))
    with TestClient(create_app(settings, runtime=FakeRuntime(), warm_model=False),
                    raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("key", ["a..b", "a.", ".a", "a b", "a[]", "é", "1a", "a" * 65, "a\ud800"])
def test_filter_keys_the_engine_rejects_are_422_naming_the_key(client: TestClient, key: str) -> None:
    ingest(client, DOCS)
    body = json.dumps({"question": "Nile", "filters": {key: "x"}})  # ASCII: a lone surrogate travels as \\ud800
    err = assert_error(_raw_post(client, "/v1/search", body), 422, "validation")
    assert "filters" in err["message"] and "dots only between names" in err["message"], err


@pytest.mark.parametrize("key", ["lang", "a.b", "a-b", "_x", "meta.year", "a.1"])
def test_well_formed_filter_keys_search(client: TestClient, key: str) -> None:
    ingest(client, DOCS)
    assert client.post("/v1/search", json={"question": "Nile", "filters": {key: "en"}}).status_code == 200


def _raw_post(client: TestClient, url: str, body: str) -> Any:
    return client.post(url, content=body.encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"documents": [{"id": "\\ud800", "text": "x"}]}', "body.documents.0.id"),
        ('{"documents": [{"id": "a", "text": "x\\udfff"}]}', "body.documents.0.text"),
        ('{"documents": [{"id": "a", "text": "x", "title": "\\ud800"}]}', "body.documents.0.title"),
        ('{"documents": [{"id": "a", "text": "x", "metadata": {"k": "\\ud800"}}]}', "body.documents.0.metadata.k"),
        ('{"documents": [{"id": "a", "text": "x", "metadata": {"\\ud800": 1}}]}', "body.documents.0.metadata"),
    ],
)
def test_lone_surrogates_in_a_batch_are_422_naming_the_field(client: TestClient, body: str, field: str) -> None:
    err = assert_error(_raw_post(client, "/v1/documents", body), 422, "validation")
    assert err["details"][0]["loc"].startswith(field), err
    json.dumps(err).encode("utf-8")  # the answer itself is valid UTF-8


@pytest.mark.parametrize(
    ("body", "field"),
    [('{"question": "\\ud800"}', "body.question"), ('{"question": "q", "filters": {"k": "\\udc00"}}', "body.filters.k"),
     ('{"question": "q", "filters": {"k": ["a", "\\ud800"]}}', "body.filters.k")],
)
def test_lone_surrogates_in_a_search_are_422(client: TestClient, body: str, field: str) -> None:
    err = assert_error(_raw_post(client, "/v1/search", body), 422, "validation")
    assert err["details"][0]["loc"].startswith(field), err


def test_a_non_ascii_api_key_matches(tmp_path: Path) -> None:
    key = "clé-ü"
    settings = Settings(data_dir=tmp_path / "dpr", api=ApiSettings(api_key=key))
    with TestClient(create_app(settings, runtime=FakeRuntime(), warm_model=False)) as c:
        search = {"question": "q"}
        for sent in (key.encode("utf-8"), key.encode("latin-1")):  # a UTF-8 client, a Latin-1 client
            assert c.post("/v1/search", json=search, headers={"X-API-Key": sent}).status_code == 404  # no collection
            bearer = b"Bearer " + sent
            assert c.post("/v1/search", json=search, headers={"Authorization": bearer}).status_code == 404
        for wrong in (b"cle-u", "clé-ü!".encode()):
            assert_error(c.post("/v1/search", json=search, headers={"X-API-Key": wrong}), 401, "unauthorized")


def test_delete_refuses_ids_over_the_readers_limit(client: TestClient) -> None:
    ingest(client, [{"id": "k" * MAX_ID_CHARS, "text": "a long id that ingest accepts"}])
    assert client.delete("/v1/documents/" + "k" * MAX_ID_CHARS).json()["points_deleted"] == 1
    err = assert_error(client.delete("/v1/documents/" + "k" * (MAX_ID_CHARS + 1)), 404, "not_found")
    assert f"1-{MAX_ID_CHARS}" in err["message"]


def _jsonl(rows: int, text: str = "a few words") -> bytes:
    return b"".join(json.dumps({"id": str(i), "text": text}).encode() + b"\n" for i in range(rows))


def test_upload_count_limit_applies_while_reading(client: TestClient) -> None:
    assert client.post("/v1/documents", files={"file": ("ok.jsonl", _jsonl(5))}).status_code == 202
    err = assert_error(client.post("/v1/documents", files={"file": ("many.jsonl", _jsonl(6))}), 413, "too_large")
    assert "DPR_API__MAX_DOCUMENTS" in err["message"]
    malformed = b"{not json\n" * 50_000  # failures count as items too: one bad row each, not a list of 50,000
    gz = gzip.compress(malformed)
    assert len(gz) < 2_000
    r = client.post("/v1/documents", files={"file": ("bad.jsonl.gz", gz)})
    assert_error(r, 413, "too_large")


def test_a_compressed_upload_cannot_expand_past_the_request_limit(client: TestClient) -> None:
    small = gzip.compress(_jsonl(2))
    assert client.post("/v1/documents", files={"file": ("ok.jsonl.gz", small)}).status_code == 202
    bomb = gzip.compress(_jsonl(3, text="z" * 30_000))  # 90 KB of text in ~300 bytes; the limit is 64 KB
    err = assert_error(client.post("/v1/documents", files={"file": ("bomb.jsonl.gz", bomb)}), 413, "too_large")
    assert "expands" in err["message"] and "DPR_API__MAX_REQUEST_BYTES" in err["message"]


def test_a_corrupt_gzip_upload_is_never_a_5xx(client: TestClient) -> None:
    whole = gzip.compress(_jsonl(3))
    for broken in (whole[:-12] + b"garbage!", whole[:10] + b"\xff" * 40, b"\x1f\x8b" + b"\x00" * 30):
        r = client.post("/v1/documents", files={"file": ("broken.jsonl.gz", broken)})
        assert r.status_code in (202, 422), r.text  # refused with the reason, or the readers report the rows


def test_an_upload_over_the_byte_limit_is_413(client: TestClient) -> None:
    big = io.BytesIO(b"word " * 14_000)
    assert_error(client.post("/v1/documents", files={"file": ("big.txt", big)}), 413, "too_large")


def test_collect_stops_at_the_first_item_over_a_limit() -> None:
    read: list[int] = []

    def items() -> Iterator[Item]:
        for i in range(1_000_000):
            read.append(i)
            yield DocumentFailure(source=f"row {i}", reason="invalid_json", error="bad") if i % 2 else Document(
                doc_id=str(i), text="abc")

    with pytest.raises(Exception, match="DPR_API__MAX_DOCUMENTS"):
        collect(items(), max_documents=10, max_text_bytes=10_000)
    assert len(read) == 11  # the eleventh item ends it; nothing past it is read
    read.clear()
    with pytest.raises(Exception, match="expands"):
        collect(items(), max_documents=100, max_text_bytes=9)
    assert len(read) == 7  # documents 0, 2, 4 are 9 bytes; document 6 takes it over
