"""The sources over HTTP, as `dpr sources` (docs/sources.md): ``GET /v1/sources`` and ``GET /v1/sources/{name}``
(read: each source, its last sync, outcome, counts and next run), ``POST /v1/sources`` (admin: add one),
``POST /v1/sources/{name}/sync`` (write: start a sync now; 202, then follow it with ``GET /v1/sources/{name}``) and
``DELETE /v1/sources/{name}?purge=true`` (admin: remove it, with its documents when purged). A sync started here
runs on a thread of this server through its own runtime and ingest executor, as the schedule's do; a second sync
of a source whose sync runs is refused (409). No credential is ever sent or shown: a source names the variables
that hold them."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from dpr_client.wire_sources import SourceIn, SourceList, SourceOut, SourceRemoved, SourceStatus, SyncAccepted
from entrypoints.api.auth import requires
from entrypoints.api.errors import ApiError
from entrypoints.api.state import ApiState, api_state
from services.core.errors import ConfigError, Conflict
from services.sources.registry import Registry, SourceNotFound, SourceSpec, local_path, new_spec, parse_interval
from services.sources.schedule import source_status, sources_status
from services.sources.state import is_running

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1")


def _known(state: ApiState, name: str) -> Registry:
    """The data dir's sources, once ``name`` is known among them (404 when it is not)."""
    registry = Registry(state.settings.data_dir)
    try:
        registry.get(name)
    except SourceNotFound as e:
        raise ApiError(404, "not_found", str(e)) from None
    return registry


@router.get("/sources", response_model=SourceList, summary="Every source with its last sync (as `dpr sources list`)")
@requires("read")
async def get_sources(state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    return {"sources": await run_in_threadpool(sources_status, state.settings.data_dir)}


@router.get("/sources/{name}", response_model=SourceStatus,
            summary="One source: its last sync's outcome, counts and error, whether a sync runs, its next run")
@requires("read")
async def get_source(name: str, state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    registry = _known(state, name)
    return await run_in_threadpool(source_status, registry, name)


@router.post("/sources", status_code=201, response_model=SourceOut,
             summary="Add a source (as `dpr sources add`): nothing is read until it syncs")
@requires("admin")
async def post_source(body: SourceIn, state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    try:
        if body.collection:
            state.settings.for_collection(body.collection)
        spec = new_spec(body.name, body.uri, every_s=parse_interval(body.every), include=tuple(body.include),
                        exclude=tuple(body.exclude), collection=body.collection, endpoint=body.endpoint,
                        key_env=body.key_env, secret_env=body.secret_env, branch=body.branch)
    except ConfigError as e:  # well-formed, but not a source this server can read as it is (409, as Conflict)
        raise Conflict(str(e)) from None
    _check_local(spec, state.settings.sources.folder_roots)
    return (await run_in_threadpool(Registry(state.settings.data_dir).add, spec)).to_json()


def _check_local(spec: SourceSpec, roots: list[Path]) -> None:
    """A source on the server's own disk is added over HTTP only under ``DPR_SOURCES__FOLDER_ROOTS``: a key's
    holder must not make the server read (and serve) any folder it can."""
    path = local_path(spec)
    if path is None:
        return
    real = path.resolve()
    if not any(real.is_relative_to(root.resolve()) for root in roots):
        raise Conflict(f"{spec.uri}: a source on the server's disk is added over HTTP only under "
                       "DPR_SOURCES__FOLDER_ROOTS (none holds it); add it there, or with `dpr sources add` on the "
                       "server")


@router.post("/sources/{name}/sync", status_code=202, response_model=SyncAccepted,
             summary="Start a sync of the source now; follow it with GET /v1/sources/{name}")
@requires("write")
async def post_sync(name: str, state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    registry = _known(state, name)
    if is_running(registry.folder(name)):
        raise ApiError(409, "conflict", f"source {name}: a sync is already running; follow it with GET "
                       f"/v1/sources/{name}, then sync again")
    threading.Thread(target=_sync, args=(state, registry, name), name=f"dpr-sync-{name}", daemon=True).start()
    return {"source": name, "state": "started"}


def _sync(state: ApiState, registry: Registry, name: str) -> None:
    from services.sources.sync import sync_source

    try:
        sync_source(state.runtime, registry, name, state.executor)
    except Exception as e:  # noqa: BLE001 - recorded with the source (its last sync): GET /v1/sources/{name}
        log.warning("sync failed: %s", e, extra={"source": name})


@router.delete("/sources/{name}", response_model=SourceRemoved,
               summary="Remove a source; purge=true also removes its documents (exactly those)")
@requires("admin")
async def delete_source(name: str, purge: bool = False,
                        state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    from services.sources.sync import purge_source

    registry = _known(state, name)

    def remove() -> tuple[int, int]:
        done = purge_source(state.runtime, registry, name) if purge else (0, 0)
        registry.remove(name)
        return done

    documents, points = await run_in_threadpool(remove)
    return {"source": name, "purged": purge, "documents": documents, "points": points}
