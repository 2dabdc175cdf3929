"""GET /v1/status: what `dpr status --json` prints, for the collection this server answers for."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from dpr_client.wire import Status
from entrypoints.api.auth import requires
from entrypoints.api.state import ApiState, api_state
from entrypoints.status import collection_status

router = APIRouter(prefix="/v1")


@router.get("/status", response_model=Status,
            summary="Collection, generations, point counts, model fingerprints (as `dpr status`)")
@requires("read")
async def get_status(state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    info = await run_in_threadpool(state.runtime.store.info, wait=False)  # never waits for a re-embed's target
    return await run_in_threadpool(collection_status, state.settings, info, state.runtime.store)
