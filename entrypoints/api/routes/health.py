"""Liveness, readiness (model loaded, store and broker reachable) and Prometheus metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse

from entrypoints.api import schemas
from entrypoints.api.auth import requires
from entrypoints.api.metrics import CONTENT_TYPE_LATEST
from entrypoints.api.state import ApiState, api_state
from services.core.settings import Settings

router = APIRouter()


@router.get("/healthz", response_model=schemas.Health, summary="Liveness: the process answers")
@requires("public")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz", response_model=schemas.Readiness, summary="Readiness: model loaded, broker and store reachable",
    responses={503: {"model": schemas.Readiness, "description": "Not ready"}},
)
@requires("public")
async def readyz(state: ApiState = Depends(api_state)) -> JSONResponse:  # noqa: B008
    checks: dict[str, dict[str, Any]] = {}
    settings = state.settings
    timeout = settings.api.ready_timeout
    if state.model_error:
        checks["model"] = {"ok": False, "error": state.model_error}
    else:
        ready = state.model_ready.is_set()
        checks["model"] = {"ok": ready} | ({} if ready else {"error": "the towers are still loading"})
    checks["store"] = await _probe(state.probes, lambda: _store_check(state), timeout, "store")
    if settings.broker_url:
        checks["broker"] = await _probe(state.probes, lambda: _broker_check(settings, timeout), timeout, "broker")
    ok = all(c["ok"] for c in checks.values())
    body = {"status": "ready" if ok else "not_ready", "checks": checks}
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics", summary="Prometheus metrics", response_class=Response, responses={
    200: {"description": "The Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}})
@requires("public")  # counters and latencies, no data: Prometheus scrapes without a key
def metrics_route(state: ApiState = Depends(api_state)) -> Response:  # noqa: B008
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def _probe(pool: ThreadPoolExecutor, check: Callable[[], dict[str, Any]], timeout: float,
                 what: str) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(asyncio.wrap_future(pool.submit(check)), timeout)
    except TimeoutError:
        return {"ok": False, "error": f"{what} did not answer within {timeout:g} s"}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def _store_check(state: ApiState) -> dict[str, Any]:
    """The served generation only: counting every generation (``info()``) would wait, on the embedded engine, for
    a re-embed's target that workers hold, and the probe would time out while queries answer."""
    store = state.runtime.store
    active = store.active()
    return {"ok": True, "backend": store.backend, "collection": store.alias, "exists": active is not None,
            "points": store.count(active.name) if active is not None else 0}


def _broker_check(settings: Settings, timeout: float) -> dict[str, Any]:
    import redis

    from services.jobs import write_refused

    url = str(settings.broker_url)
    with redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout) as client:
        try:
            client.ping()
        except redis.exceptions.ResponseError as e:  # reachable but refusing writes (its disk is full): queries go on
            refused = write_refused(url, e, client, "ingest is refused meanwhile")
            if refused is None:
                raise
            return {"ok": True, "writes_refused": True, "warning": str(refused)}
    return {"ok": True}
