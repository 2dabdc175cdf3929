"""Property-based tests from the served OpenAPI schema (schemathesis), over real HTTP against a live server.

Positive and negative (schema-violating) requests for every operation, once per role (the server has one key per
role: read, write, admin), bounded twice: ``MAX_EXAMPLES`` per operation, and ``BUDGET_SECONDS`` of wall time per
role (cases past the budget are not sent, so a slow machine shortens the run instead of timing out): 30 s in `make
test`, 90 s (the budget before the suite was halved) with ``FUZZ_SECONDS=90``, which `make test-slow` sets. No
response may be a 5xx, every status must be one the schema documents for that operation, every error response is the
JSON error shape ``{"error": {"type", "message"}}``, and no operation beyond the key's role (its ``x-dpr-role``)
answers 2xx: those get 403 (or 404 / 405 when a negative case changes the method or breaks the path: no route at
all). The case counts per role and status go to ``fuzz-role-counts.json`` in the run's temp dir.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
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

from entrypoints.api.app import create_app, openapi_document
from services.access import ROLES, KeyStore, allows, keys_path
from services.core.settings import ApiSettings, ChunkSettings, Settings
from services.runtime import Runtime

pytestmark = pytest.mark.integration

MAX_EXAMPLES = 25
BUDGET_SECONDS = float(os.environ.get("FUZZ_SECONDS", "30"))  # per role
_started: dict[str, float] = {}  # role -> when its first case ran
COUNTS: dict[str, Counter[str]] = {role: Counter() for role in ROLES}  # role -> "cases", "2xx", "403", ...
# small limits keep generated batches cheap to encode on 2 cores; no rate limit in the way of the run
FUZZ_API = ApiSettings(max_request_bytes=64_000, max_documents=8, rate_limit=100_000, rate_burst=100_000)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, base_towers: Any) -> Iterator[tuple[str, dict[str, str]]]:
    root = tmp_path_factory.mktemp("fuzz")
    settings = Settings(data_dir=root / "dpr", api=FUZZ_API, chunk=ChunkSettings(max_tokens=64, overlap=8))
    store = KeyStore(keys_path(settings.data_dir))
    tokens = {role: store.create(role, name=f"fuzz-{role}")[1] for role in ROLES}
    runtime = Runtime(settings)
    runtime.__dict__["towers"] = base_towers
    with LiveServer(create_app(settings, runtime=runtime)) as server:
        wait_ready(server.url, timeout=60)
        with httpx.Client(base_url=server.url, timeout=60, headers={"X-API-Key": tokens["write"]}) as client:
            docs = [{"id": "a", "text": "Alpha particles are helium nuclei."},  # a collection to search, delete
                    {"id": "b", "text": "Beta decay emits electrons.", "metadata": {"kind": "decay"}}]
            assert wait_job(client, client.post("/v1/documents", json={"documents": docs}).json()["job"])[
                "state"] == "done"
        yield server.url, tokens
    (root / "fuzz-role-counts.json").write_text(json.dumps(COUNTS, indent=2))
    print(f"\nfuzz cases per role: {json.dumps(COUNTS)} ({root / 'fuzz-role-counts.json'})")


def _served_schema() -> dict[str, Any]:
    """The schema the live server serves at /openapi.json (same code, same API settings, keys configured; nothing
    loads here).

    Built at collection time because schemathesis' lazy ``from_fixture`` loader does not work with pytest 9;
    ``test_served_schema_is_the_one_fuzzed`` checks that the live server serves exactly this document.
    """
    app = create_app(Settings(data_dir=Path("/nonexistent"), api=FUZZ_API), warm_model=False)
    return openapi_document(app, locked=True)


schema = schemathesis.openapi.from_dict(_served_schema())
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=MAX_EXAMPLES)


def test_served_schema_is_the_one_fuzzed(live: tuple[str, dict[str, str]]) -> None:
    assert httpx.get(f"{live[0]}/openapi.json").json() == _served_schema()


@pytest.mark.parametrize("role", ROLES)
@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_request_gets_a_server_error(case: Any, role: str, live: tuple[str, dict[str, str]]) -> None:
    started = _started.setdefault(role, time.monotonic())
    if time.monotonic() - started > BUDGET_SECONDS:
        return  # over the role's time budget: the cases already sent are the run
    live_url, tokens = live
    headers = dict(case.headers or {}) | {"X-API-Key": tokens[role]}
    response = case.call(base_url=live_url, timeout=60, headers=headers)
    needs = case.operation.definition.raw.get("x-dpr-role")
    COUNTS[role]["cases"] += 1
    COUNTS[role][f"{response.status_code // 100}xx"] += 1
    if case.method == "OPTIONS":  # which methods exist is public (no data): 204 with Allow, whatever the key
        assert response.status_code == 204 and "OPTIONS" in response.headers.get("allow", [""])[0], response.headers
        return
    beyond = needs in ROLES and not allows(role, needs)  # type: ignore[arg-type]
    COUNTS[role]["beyond the role"] += beyond
    assert response.status_code < 500, f"{case.method} {case.formatted_path} -> {response.status_code}: " \
        f"{response.text[:500]}"
    if beyond:  # refused (403), or a method / path the router has no route for (405 / 404): never served
        COUNTS[role]["beyond the role, 403"] += response.status_code == 403
        assert response.status_code in (403, 404, 405), f"{role} key: {case.method} {case.formatted_path} (needs " \
            f"{needs}) -> {response.status_code}: {response.text[:300]}"
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance])
    if response.status_code >= 400:
        body = response.json()
        assert set(body) == {"error"}, body
        assert body["error"]["type"] and body["error"]["message"], body
