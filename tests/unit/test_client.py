"""``dpr_client``: every method against the real app in-process (over the fake runtime, through httpx's
MockTransport), the retry policy (429 / 503 with and without Retry-After, refused connections, the bound, a timeout
never retried), typed errors with the server's message, the key from the argument or the environment, the async
twin, and the import that stays a leaf."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from kit.fakes import FakeRuntime
from test_api_routes import DOCS

import dpr_client.client as client_module
from dpr_client import (
    AsyncClient,
    BadRequest,
    Client,
    Forbidden,
    NotFound,
    RateLimited,
    Retry,
    Unauthorized,
    Unavailable,
    Unreachable,
    wire,
)
from entrypoints.api.app import create_app
from services.core.settings import ApiSettings, Settings

pytestmark = pytest.mark.unit

KEY = "s3cret"


@pytest.fixture
def app(tmp_path: Path) -> Iterator[TestClient]:
    # no sleep between the client's job polls (``waits``): a busy machine polls past the default 50/s, 100 at once
    settings = Settings(data_dir=tmp_path / "server", api=ApiSettings(api_key=KEY, rate_limit=100_000))
    with TestClient(create_app(settings, runtime=FakeRuntime(), warm_model=False),
                    raise_server_exceptions=False) as c:
        yield c


def through(app: TestClient) -> httpx.MockTransport:
    def forward(request: httpx.Request) -> httpx.Response:
        r = app.request(request.method, request.url.raw_path.decode(), headers=dict(request.headers),
                        content=request.read())
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)

    return httpx.MockTransport(forward)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The retry waits the client asked for (none is slept)."""
    asked: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", asked.append)

    async def no_sleep(seconds: float) -> None:
        asked.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", no_sleep)
    return asked


def scripted(*answers: httpx.Response | type[httpx.TransportError]) -> tuple[httpx.MockTransport, list[str]]:
    """A server that gives these answers in turn; the paths it was asked for."""
    asked: list[str] = []
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        answer = queue.pop(0)
        if isinstance(answer, httpx.Response):
            return answer
        raise answer("scripted", request=request)

    return httpx.MockTransport(handler), asked


def refusal(status: int, message: str, retry_after: str | None = None) -> httpx.Response:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return httpx.Response(status, json={"error": {"type": "x", "message": message}}, headers=headers)


OK = {"hits": [], "took_ms": 1.0}


def test_every_route_against_the_real_app(app: TestClient) -> None:
    with Client("http://dpr.test", api_key=KEY, transport=through(app)) as dpr:
        accepted = dpr.ingest(DOCS)
        progress: list[str] = []
        job = dpr.wait(accepted, progress=lambda s: progress.append(s.state))
        assert job.state == "done" and job.documents == 3 and progress[-1] == "done"
        found = dpr.search("Nile river", k=2, mode="hybrid", filters={"lang": ["en", "fr"]}, fusion="rrf")
        assert [h.doc_id for h in found.hits] == ["py"]  # the filter left one
        hit = dpr.search("longest river", k=1).hits[0]
        assert (hit.doc_id, hit.chunk_index, hit.title) == ("nile", 0, "Rivers")
        assert hit.model and hit.text.startswith("The Nile") and hit.citation() == "nile (passage 0)"
        assert hit.metadata()["doc_id"] == "nile" and "text" not in hit.metadata()
        uploaded = dpr.upload("notes.md", content=b"# Notes\n\nThe Danube flows east.\n")
        assert dpr.wait(uploaded.job).documents == 1
        status = dpr.status()  # typed models from dpr_client.wire, as the server's schema says
        assert isinstance(status, wire.Status) and status.points is not None and status.points >= 4
        assert status.model_dump()["collection"] == status.collection  # and every field dpr status prints
        assert dpr.whoami().key.role == "admin"
        assert dpr.feedback("longest river", relevant=True, doc_id="nile", chunk=0).outcome == "new"
        assert dpr.judgements().counts.judgements == 1
        made = dpr.create_key("read", name="reader", rate=5.0)
        assert isinstance(made, wire.KeyCreated) and made.rate == 5.0
        assert any(k.id == made.id for k in dpr.keys().keys)
        assert dpr.revoke_key(made.id).revoked
        assert dpr.delete("cats").points_deleted >= 1
        assert dpr.health().status == "ok" and dpr.ready().status in ("ready", "not_ready")
        with pytest.raises(NotFound, match="has no passages"):
            dpr.delete("cats")
        with pytest.raises(NotFound, match="dpr eval"):
            dpr.eval_report()
        with pytest.raises(BadRequest, match="filter key") as bad:
            dpr.search("x", filters={"not a key": 1})
        assert bad.value.status == 422 and bad.value.details
    with Client("http://dpr.test", api_key="wrong", transport=through(app)) as stranger:
        with pytest.raises(Unauthorized):
            stranger.status()
    with Client("http://dpr.test", api_key=made.token, transport=through(app)) as revoked:
        with pytest.raises(Unauthorized):
            revoked.search("x")


def test_a_read_key_is_refused_writes_with_the_servers_message(app: TestClient) -> None:
    with Client("http://dpr.test", api_key=KEY, transport=through(app)) as admin:
        token = admin.create_key("read", name="reader").token
    with Client("http://dpr.test", api_key=token, transport=through(app)) as reader:
        with pytest.raises(Forbidden, match="write") as refused:
            reader.ingest(DOCS)
    assert refused.value.status == 403 and refused.value.type == "forbidden"


def test_the_key_comes_from_the_argument_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []
    transport = httpx.MockTransport(lambda r: seen.append(r.headers.get("x-api-key")) or httpx.Response(200, json=OK))
    monkeypatch.setenv("DPR_API__API_KEY", "from-env")
    monkeypatch.setenv("DPR_API_URL", "http://env.test:9/")
    with Client(transport=transport) as dpr:
        dpr.search("q")
        assert dpr.url == "http://env.test:9"
    with Client("http://dpr.test", api_key="given", transport=transport) as dpr:
        dpr.search("q")
    assert seen == ["from-env", "given"]


def test_429_and_503_are_retried_after_the_servers_retry_after(waits: list[float]) -> None:
    transport, asked = scripted(refusal(429, "over the rate", "2"), refusal(503, "at capacity", "0.5"),
                                httpx.Response(200, json=OK))
    with Client("http://dpr.test", transport=transport) as dpr:
        assert dpr.search("q").hits == []
    assert waits == [2.0, 0.5] and len(asked) == 3


def test_retries_are_bounded_and_raise_the_last_refusal(waits: list[float]) -> None:
    transport, asked = scripted(*[refusal(503, "the store is unavailable; retry")] * 4)
    with Client("http://dpr.test", transport=transport, retry=Retry(attempts=3, backoff=0.1)) as dpr:
        with pytest.raises(Unavailable, match="the store is unavailable") as refused:
            dpr.status()
    assert waits == [0.1, 0.2, 0.4] and len(asked) == 4 and refused.value.status == 503


def test_a_retry_after_beyond_the_bound_is_raised_at_once(waits: list[float]) -> None:
    transport, asked = scripted(refusal(429, "over the key's rate", "120"))
    with Client("http://dpr.test", transport=transport, retry=Retry(max_wait=30)) as dpr:
        with pytest.raises(RateLimited) as refused:
            dpr.search("q")
    assert waits == [] and len(asked) == 1 and refused.value.retry_after == 120.0


def test_refused_connections_are_retried_and_timeouts_are_not(waits: list[float]) -> None:
    transport, asked = scripted(httpx.ConnectError, httpx.RemoteProtocolError, httpx.Response(200, json=OK))
    with Client("http://dpr.test", transport=transport) as dpr:
        assert dpr.search("q").took_ms == 1.0
    assert waits == [0.5, 1.0]
    transport, asked = scripted(httpx.ReadTimeout, httpx.Response(200, json=OK))
    with Client("http://dpr.test", transport=transport) as dpr:
        with pytest.raises(Unreachable, match="did not answer in time"):
            dpr.search("q")
    assert len(asked) == 1
    transport, asked = scripted(*[httpx.ConnectError] * 4)
    with Client("http://dpr.test", transport=transport) as dpr:
        with pytest.raises(Unreachable, match="unreachable.*dpr serve"):
            dpr.status()
    assert len(asked) == 4


def test_client_errors_are_not_retried(waits: list[float]) -> None:
    transport, asked = scripted(refusal(404, "collection 'passages' does not exist; run `dpr ingest`"))
    with Client("http://dpr.test", transport=transport) as dpr:
        with pytest.raises(NotFound, match="does not exist") as refused:
            dpr.search("q")
    assert len(asked) == 1 and waits == [] and refused.value.status == 404


def test_invalid_arguments_fail_before_anything_is_sent() -> None:
    transport, asked = scripted()
    with Client("http://dpr.test", transport=transport) as dpr:
        with pytest.raises(ValueError, match="k"):
            dpr.search("q", k=0)
        with pytest.raises(ValueError, match="mode"):
            dpr.search("q", mode="fuzzy")  # type: ignore[arg-type]
    assert asked == []


def test_the_async_client_has_the_same_methods_and_policy(app: TestClient, waits: list[float]) -> None:
    sync_names = {n for n in vars(Client) if not n.startswith("_")}
    assert sync_names == {n for n in vars(AsyncClient) if not n.startswith("_")}

    async def forward(request: httpx.Request) -> httpx.Response:
        return through(app).handle_request(request)

    async def run() -> tuple[list[str], int]:
        async with AsyncClient("http://dpr.test", api_key=KEY, transport=httpx.MockTransport(forward)) as dpr:
            job = await dpr.wait(await dpr.ingest(DOCS))
            hits = (await dpr.search("longest river", k=1)).hits
            return [h.doc_id for h in hits], job.documents

    assert asyncio.run(run()) == (["nile"], 3)
    waits.clear()  # the job's polls
    transport, _ = scripted(refusal(429, "slow down", "1"), httpx.Response(200, json=OK))

    async def limited() -> float:
        async with AsyncClient("http://dpr.test", transport=transport) as dpr:
            return (await dpr.search("q")).took_ms

    assert asyncio.run(limited()) == 1.0 and waits == [1.0]


@pytest.mark.parametrize("module", ["dpr_client"])
def test_the_client_is_a_leaf(module: str) -> None:
    code = (f"import sys; import {module}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'services', 'entrypoints', 'encoders', "
            "'workers', 'torch', 'transformers', 'fastapi', 'qdrant_client', 'celery', 'numpy', 'langchain_core', "
            "'llama_index', 'haystack', 'mcp', 'asyncio'}))")  # the integrations and asyncio load only when used
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


