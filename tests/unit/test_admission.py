"""Admission control (entrypoints/api/admission.py): at most N requests at work, a bounded FIFO queue, and 503 +
Retry-After beyond it or after the wait; health routes never held back; a client that leaves frees its place."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.types import Receive, Scope, Send

from entrypoints.api.admission import Admission
from entrypoints.api.app import create_app
from services.core.settings import ApiSettings, Settings

pytestmark = pytest.mark.unit


class Gate:
    """An ASGI app whose /v1 requests wait until released; records the order they started in."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.started.append(scope["path"])
        if scope["path"].startswith("/v1/"):
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(app: Any, path: str) -> tuple[int, dict[str, str], bytes]:
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await app({"type": "http", "path": path, "method": "POST", "headers": []}, receive, send)
    start = messages[0]
    headers = {k.decode(): v.decode() for k, v in start.get("headers", [])}
    return start["status"], headers, b"".join(m.get("body", b"") for m in messages[1:])


def test_beyond_the_queue_is_shed_with_retry_after_and_the_rest_are_answered() -> None:
    async def scenario() -> None:
        inner = Gate()
        app = Admission(inner, max_in_flight=2, max_queue=2, queue_timeout=30)
        admitted = [asyncio.create_task(call(app, f"/v1/search/{i}")) for i in range(4)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert (app.active, len(app.waiting)) == (2, 2)
        status, headers, body = await call(app, "/v1/search/5")  # the queue is full: refused at once
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert json.loads(body)["error"]["type"] == "overloaded"
        assert (await call(app, "/healthz"))[0] == 200  # not held back
        inner.release.set()
        assert [r[0] for r in await asyncio.gather(*admitted)] == [200, 200, 200, 200]
        assert [p for p in inner.started if p != "/healthz"] == [f"/v1/search/{i}" for i in range(4)]  # FIFO
        assert (app.active, len(app.waiting), app.shed) == (0, 0, 1)

    asyncio.run(scenario())


def test_a_request_that_waits_too_long_gets_503() -> None:
    async def scenario() -> None:
        inner = Gate()
        app = Admission(inner, max_in_flight=1, max_queue=5, queue_timeout=0.05)
        first = asyncio.create_task(call(app, "/v1/search"))
        await asyncio.sleep(0)
        status, headers, _ = await call(app, "/v1/search")
        assert status == 503 and "retry-after" in headers
        assert len(app.waiting) == 0
        inner.release.set()
        assert (await first)[0] == 200
        assert app.active == 0

    asyncio.run(scenario())


def test_a_client_that_leaves_the_queue_frees_its_place() -> None:
    async def scenario() -> None:
        inner = Gate()
        app = Admission(inner, max_in_flight=1, max_queue=1, queue_timeout=30)
        first = asyncio.create_task(call(app, "/v1/search"))
        await asyncio.sleep(0)
        leaver = asyncio.create_task(call(app, "/v1/search"))
        await asyncio.sleep(0)
        assert len(app.waiting) == 1
        leaver.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaver
        assert len(app.waiting) == 0
        later = asyncio.create_task(call(app, "/v1/search"))  # the freed place is taken
        await asyncio.sleep(0)
        assert len(app.waiting) == 1
        inner.release.set()
        assert [(await first)[0], (await later)[0]] == [200, 200]
        assert (app.active, len(app.waiting)) == (0, 0)

    asyncio.run(scenario())


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        Admission(Gate(), max_in_flight=0, max_queue=1, queue_timeout=1)


def test_the_api_registers_admission_from_the_settings(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, api=ApiSettings(max_in_flight=3, max_queue=7, queue_timeout=2.5))
    app = create_app(settings, warm_model=False)
    [options] = [m.kwargs for m in app.user_middleware if m.cls is Admission]
    assert options == {"max_in_flight": 3, "max_queue": 7, "queue_timeout": 2.5}
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
