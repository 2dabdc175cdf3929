"""POST /v1/search: question tower -> passages, through the runtime as ``dpr query`` does."""

from __future__ import annotations

import time
from dataclasses import fields
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from entrypoints.api import schemas
from entrypoints.api.auth import requires
from entrypoints.api.state import api_state
from services.query import QueryOptions

router = APIRouter(prefix="/v1")  # the prefix on the router itself: route templates (metrics labels) carry it


@router.post("/search", response_model=schemas.SearchOut, response_model_exclude_none=True,
             summary="Question tower -> passages [-> reranker]")
@requires("read")
async def post_search(body: schemas.SearchIn, request: Request) -> dict[str, Any]:
    # async, the state read here (a plain-function Depends runs on a worker thread of its own): with batching on the
    # question waits for its batch on the event loop, no thread hop in or out (the response is checked here too)
    state = api_state(request)
    options = QueryOptions(**{f.name: getattr(body, f.name) for f in fields(QueryOptions)})  # the same names
    runtime = state.runtime
    t0 = time.perf_counter()
    with state.metrics.time_query(body.mode or "default"):
        if runtime.batches:
            hits = await runtime.search_async(body.question, options)
        else:
            hits = await run_in_threadpool(runtime.search, body.question, options)
    return {"hits": [h.to_json() for h in hits], "took_ms": round((time.perf_counter() - t0) * 1000, 3)}
