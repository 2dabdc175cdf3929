"""Property-based tests from the served OpenAPI schema (schemathesis), over real HTTP against a live server.

Positive and negative (schema-violating) requests for every operation, bounded twice: ``MAX_EXAMPLES`` per
operation, and ``BUDGET_SECONDS`` of wall time for the whole run (cases past the budget are not sent, so a slow
machine shortens the run instead of timing out). No response may be a 5xx, every status must be one the schema
documents for that operation, and every error response is the JSON error shape ``{"error": {"type", "message"}}``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from api_server import LiveServer, wait_job, wait_ready
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from entrypoints.api.app import create_app
from services.runtime import Runtime
from services.settings import ApiSettings, ChunkSettings, Settings

pytestmark = pytest.mark.integration

MAX_EXAMPLES = 25
BUDGET_SECONDS = 180.0
_started: list[float] = []  # when the first case ran


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory, base_towers: Any) -> Iterator[str]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("fuzz") / "dpr",
        # small limits keep generated batches cheap to encode on 2 cores
        api=ApiSettings(max_request_bytes=64_000, max_documents=8),
        chunk=ChunkSettings(max_tokens=64, overlap=8),
    )
    runtime = Runtime(settings)
    runtime.__dict__["towers"] = base_towers
    with LiveServer(create_app(settings, runtime=runtime)) as server:
        wait_ready(server.url, timeout=60)
        with httpx.Client(base_url=server.url, timeout=60) as client:  # a collection to search and delete from
            docs = [{"id": "a", "text": "Alpha particles are helium nuclei."},
                    {"id": "b", "text": "Beta decay emits electrons.", "metadata": {"kind": "decay"}}]
            assert wait_job(client, client.post("/v1/documents", json={"documents": docs}).json()["job"])[
                "state"] == "done"
        yield server.url


def _served_schema() -> dict[str, Any]:
    """The schema the live server serves at /openapi.json (same code, same settings shape; nothing loads here).

    Built at collection time because schemathesis' lazy ``from_fixture`` loader does not work with pytest 9;
    ``test_served_schema_is_the_one_fuzzed`` checks that the live server serves exactly this document.
    """
    return create_app(Settings(data_dir=Path("/nonexistent")), warm_model=False).openapi()


schema = schemathesis.openapi.from_dict(_served_schema())
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=MAX_EXAMPLES)


def test_served_schema_is_the_one_fuzzed(live_url: str) -> None:
    assert httpx.get(f"{live_url}/openapi.json").json() == _served_schema()


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_gets_a_server_error(case: Any, live_url: str) -> None:
    _started[:] = _started or [time.monotonic()]
    if time.monotonic() - _started[0] > BUDGET_SECONDS:
        return  # over the run's time budget: the cases already sent are the run
    response = case.call(base_url=live_url, timeout=60)
    assert response.status_code < 500, f"{case.method} {case.formatted_path} -> {response.status_code}: " \
        f"{response.text[:500]}"
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance])
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert body["error"]["type"] and body["error"]["message"], body
