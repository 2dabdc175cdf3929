"""`dpr query` / `dpr status` with DPR_API_URL: plain HTTP clients of the real app (over the fake runtime),
printing what the local commands print, the API key sent, the server's errors mapped to the same exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from functools import partialmethod
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from kit.fakes import FakeRuntime
from test_api_routes import DOCS, ingest
from typer.testing import CliRunner

from entrypoints.api.app import create_app
from entrypoints.cli import client as client_module
from entrypoints.cli.main import app
from entrypoints.status import collection_status
from services.core.settings import ApiSettings, Settings
from services.query import QueryOptions

pytestmark = pytest.mark.unit

KEY = "s3cret"
URL = "http://dpr.test"


@pytest.fixture
def runtime() -> Iterator[FakeRuntime]:
    yield FakeRuntime()


@pytest.fixture
def server(tmp_path: Path, runtime: FakeRuntime) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path / "server", api=ApiSettings(api_key=KEY))
    with TestClient(create_app(settings, runtime=runtime, warm_model=False), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def over_http(server: TestClient, monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    """Every ``ApiClient`` talks to the in-process app; returns the requests it sent."""
    sent: list[httpx.Request] = []

    def forward(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        r = server.request(request.method, request.url.path, headers=dict(request.headers), content=request.content)
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    init = partialmethod(client_module.ApiClient.__init__, transport=httpx.MockTransport(forward))
    monkeypatch.setattr(client_module.ApiClient, "__init__", init)
    monkeypatch.setenv("DPR_API_URL", URL)
    monkeypatch.setenv("DPR_API__API_KEY", KEY)
    return sent


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_query_json_is_the_servers_answer_with_the_key_sent(
    server: TestClient, runtime: FakeRuntime, over_http: list[httpx.Request]
) -> None:
    ingest(server, DOCS, headers={"X-API-Key": KEY})
    code, out, _ = run("query", "Nile river", "-k", "2", "--mode", "hybrid", "--json")
    assert code == 0
    local = [h.to_json() for h in runtime.search("Nile river", QueryOptions(k=2, mode="hybrid"))]
    assert json.loads(out) == local and len(local) == 2
    assert over_http[-1].headers["X-API-Key"] == KEY
    assert json.loads(over_http[-1].content) == {"question": "Nile river", "k": 2, "mode": "hybrid", "filters": {}}


def test_query_table_and_status_print_like_the_local_commands(
    server: TestClient, runtime: FakeRuntime, over_http: list[httpx.Request]
) -> None:
    ingest(server, DOCS, headers={"X-API-Key": KEY})
    code, out, _ = run("query", "Nile river", "-k", "1")
    assert code == 0 and "score" in out and "chunk 0" in out
    code, out, _ = run("status", "--json")
    assert code == 0
    server_settings = server.app.state.api.settings  # type: ignore[attr-defined]
    got, want = json.loads(out), collection_status(server_settings, runtime.store.info(), runtime.store)
    for status in (got, want):  # the disk's free MB moves between the two reads while other tests write
        assert status["disk"].pop("free_mb") > 0
    assert got == want
    code, out, _ = run("status")
    assert code == 0 and "collection passages" in out and "points" in out


def test_server_errors_keep_the_local_exit_codes(
    server: TestClient, over_http: list[httpx.Request], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run("query", "anything")
    assert code == 1 and "does not exist" in err  # 404: no collection yet
    code, _, err = run("query", "x", "--collection", "other")
    assert code == 2 and "DPR_API_URL" in err
    monkeypatch.setenv("DPR_API__API_KEY", "wrong")
    code, _, err = run("status")
    assert code == 2 and "DPR_API__API_KEY" in err


def test_an_unreachable_server_exits_3(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    init = partialmethod(client_module.ApiClient.__init__, transport=httpx.MockTransport(refuse))
    monkeypatch.setattr(client_module.ApiClient, "__init__", init)
    monkeypatch.setenv("DPR_API_URL", URL)
    code, _, err = run("status")
    assert code == 3 and "unreachable" in err and "dpr serve" in err


def test_the_client_path_imports_no_model_store_or_queue() -> None:
    code = (
        "import sys; import entrypoints.cli.main, entrypoints.cli.client; "
        "heavy = {'torch', 'transformers', 'sentence_transformers', 'qdrant_edge', 'qdrant_client', 'celery', "
        "'fastapi'} & set(sys.modules); print(sorted(heavy))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
