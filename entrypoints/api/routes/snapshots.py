"""POST /v1/snapshots (snapshot this server's collection) and GET /v1/snapshots (those kept): admin only.

The snapshot is taken in-process, through the server's own store (the embedded engine's lease is this process's,
so searches pause only while the generation is copied; the archive is written after). Restoring stays a command
(`dpr snapshot restore FILE --data-dir NEW`): it writes a data dir, which a running server must not do under
itself.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from dpr_client.wire import Snapshot, SnapshotList
from entrypoints.api.auth import requires
from entrypoints.api.state import ApiState, api_state
from services.ops.snapshots import create_snapshot, list_snapshots

router = APIRouter(prefix="/v1")


@router.post("/snapshots", status_code=201, response_model=Snapshot,
             summary="Snapshot the collection (as `dpr snapshot create --json`): archive path, points, sha256")
@requires("admin")
async def post_snapshot(state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    engine = state.runtime.store.engine  # type: ignore[attr-defined]
    return await run_in_threadpool(create_snapshot, state.settings, engine)


@router.get("/snapshots", response_model=SnapshotList,
            summary="The snapshots kept under DATA_DIR/snapshots (as `dpr snapshot list --json`)")
@requires("admin")
async def get_snapshots(state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    return {"snapshots": await run_in_threadpool(list_snapshots, state.settings)}
