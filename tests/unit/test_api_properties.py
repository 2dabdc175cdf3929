"""Property-based (hypothesis) over the API's request bodies (issue 12): arbitrary JSON, arbitrary unicode (lone
surrogates included), nesting and names never produce a 5xx; an accepted batch never ends in a job-level error.

Bounded: a fixed number of examples each, derandomized, so the suite's time stays flat.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kit.fakes import FakeRuntime
from test_api_routes import DOCS, ingest

from entrypoints.api.app import create_app
from services.core.settings import ApiSettings, Settings

pytestmark = pytest.mark.unit

EXAMPLES = 60
BOUNDED = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Every code point, lone surrogates too (JSON can carry them as \ud800 escapes).
any_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
scalars = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | any_text
any_json = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4), max_leaves=12
)
keys = st.sampled_from(["lang", "a.b", "a..b", "a.", ".a", "a b", "é", "doc_id", "x" * 70]) | any_text
document = st.fixed_dictionaries(
    {"id": any_text | st.integers(min_value=-5, max_value=2**64), "text": any_text},
    optional={"title": any_text | scalars, "metadata": st.dictionaries(keys, scalars | any_json, max_size=3),
              "extra": any_json},
)
batch = st.fixed_dictionaries({"documents": st.lists(document, max_size=4)}) | any_json
# Within the schema: valid Unicode of every kind (no lone surrogates), ids unique per batch, field-name keys.
valid_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=["Cs"]), max_size=60)
field_names = st.from_regex(r"\A[a-z_][a-z0-9_-]{0,8}(\.[a-z0-9_-]{1,5}){0,2}\Z")
valid_batch = st.lists(
    st.fixed_dictionaries(
        {"text": valid_text},
        optional={"title": valid_text, "metadata": st.dictionaries(
            field_names, valid_text | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1) | st.booleans(),
            max_size=3)},
    ),
    min_size=1, max_size=6,
).map(lambda docs: {"documents": [{"id": f"d{i}-{len(d['text'])}", **d} for i, d in enumerate(docs)]})
search = st.fixed_dictionaries(
    {"question": any_text},
    optional={"k": scalars, "mode": st.sampled_from(["dense", "sparse", "hybrid", "other"]) | scalars,
              "filters": st.dictionaries(keys, scalars | st.lists(scalars, max_size=3), max_size=3),
              "fusion": st.sampled_from(["rrf", "linear", "x"]), "rrf_k": scalars, "linear_weight": scalars,
              "candidates": scalars},
) | any_json


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings_ = Settings(data_dir=tmp_path_factory.mktemp("props") / "dpr",
                         api=ApiSettings(max_documents=8, max_request_bytes=64_000))
    with TestClient(create_app(settings_, runtime=FakeRuntime(), warm_model=False),
                    raise_server_exceptions=False) as c:
        assert ingest(c, DOCS)["state"] == "done"  # a collection, so searches reach the store
        yield c


def _post(client: TestClient, url: str, body: Any) -> Any:
    raw = json.dumps(body, ensure_ascii=True, allow_nan=True)  # ASCII escapes: lone surrogates travel as \ud800
    return client.post(url, content=raw.encode(), headers={"content-type": "application/json"})


def _assert_client_error_or_ok(r: Any) -> None:
    event(f"HTTP {r.status_code}")
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["type"] and error["message"]


def _wait(client: TestClient, job: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job}").json()
        if body["state"] in ("done", "failed") or time.monotonic() > deadline:
            return body
        time.sleep(0.01)


@BOUNDED
@given(body=batch)
def test_any_documents_body_is_never_a_server_error(client: TestClient, body: Any) -> None:
    r = _post(client, "/v1/documents", body)
    _assert_client_error_or_ok(r)
    if r.status_code == 202:  # accepted: the job ends, and bad documents fail one by one, not the job
        job = _wait(client, r.json()["job"])
        assert job["state"] == "done" and not job.get("errors"), job


@BOUNDED
@given(body=valid_batch)
def test_well_formed_batches_of_any_unicode_are_accepted(client: TestClient, body: Any) -> None:
    r = _post(client, "/v1/documents", body)
    assert r.status_code == 202, r.text
    job = _wait(client, r.json()["job"])
    assert job["state"] == "done" and not job.get("errors"), job
    assert job["documents"] + job["unchanged"] + len(job["failed"]) == len(body["documents"]), job


@BOUNDED
@given(question=valid_text.filter(str.strip), k=st.integers(min_value=1, max_value=50),
       filters=st.dictionaries(field_names, valid_text | st.integers(min_value=0, max_value=10), max_size=2),
       mode=st.sampled_from(["dense", "sparse", "hybrid"]))
def test_well_formed_searches_answer(client: TestClient, question: str, k: int, filters: dict[str, Any],
                                     mode: str) -> None:
    r = _post(client, "/v1/search", {"question": question, "k": k, "filters": filters, "mode": mode})
    assert r.status_code == 200, r.text


@BOUNDED
@given(body=search)
def test_any_search_body_is_never_a_server_error(client: TestClient, body: Any) -> None:
    _assert_client_error_or_ok(_post(client, "/v1/search", body))


@BOUNDED
@given(doc_id=st.text(st.characters(min_codepoint=1, max_codepoint=0x10FFFF, exclude_categories=["Cs"]),
                      min_size=1, max_size=600),
       job_id=any_text)
def test_any_path_is_never_a_server_error(client: TestClient, doc_id: str, job_id: str) -> None:
    from urllib.parse import quote

    _assert_client_error_or_ok(client.delete(f"/v1/documents/{quote(doc_id, safe='')}"))
    _assert_client_error_or_ok(client.get(f"/v1/jobs/{quote(job_id, safe='', errors='surrogatepass')}"))
