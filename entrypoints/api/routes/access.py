"""GET /v1/whoami: the key a request was sent with (id, name, role, collections; never the secret) and what it
may do here, so a client (the console) shows only what the key may do. GET/POST /v1/keys and DELETE
/v1/keys/{key_id}: `dpr keys list|create|revoke` over HTTP, for an admin key valid for every collection (an admin
limited to some collections could otherwise mint itself a wider key)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool

from dpr_client.wire import KeyCreated, KeyIn, KeyInfo, KeyList, WhoAmI
from entrypoints.api.auth import request_principal, requires
from entrypoints.api.errors import ApiError
from entrypoints.api.state import api_state
from services.access import ROLES, KeyStoreError, allows

router = APIRouter(prefix="/v1")


@router.get("/whoami", response_model=WhoAmI, summary="The request's key: role, collections, what it may do")
@requires("read", collection=False)
def whoami(request: Request) -> dict[str, Any]:
    state = api_state(request)
    principal = request_principal(request)
    collection = state.settings.collection
    usable = principal.collections is None or collection in principal.collections
    return {
        "key": principal.to_json(),
        "locked": state.gate.locked,
        "collection": collection,
        "may": {role: usable and allows(principal.role, role) for role in ROLES},
    }


NO_KEYS_YET = (
    "this server has no API keys yet, so a key made over HTTP would be made by anyone who can reach it (and would "
    "lock out everyone else at once); make the first key on the server's machine: `dpr keys create --role admin "
    "--name NAME` (with this server's DPR_DATA_DIR), or start the server with DPR_API__API_KEY set (an admin key), "
    "then send that key as X-API-Key"
)


def _unlimited_admin(request: Request) -> None:
    """Managing keys needs a real admin key for every collection: on a server with no keys (every caller the
    anonymous admin) nobody may mint the first one over HTTP, and an admin limited to some collections could
    otherwise mint itself a wider key."""
    if not api_state(request).gate.locked:
        raise ApiError(403, "forbidden", NO_KEYS_YET)
    principal = request_principal(request)
    if principal.collections is not None:
        raise ApiError(403, "forbidden", f"managing keys needs an admin key for every collection; this key "
                       f"({principal.id}) is limited to {', '.join(principal.collections)}")


@router.get("/keys", response_model=KeyList, summary="The API keys (never their tokens), as `dpr keys list`")
@requires("admin", collection=False)
def list_keys(request: Request) -> dict[str, Any]:
    _unlimited_admin(request)
    return {"keys": [k.to_json() for k in api_state(request).gate.store.keys()]}


@router.post("/keys", status_code=201, response_model=KeyCreated, summary="Create a key; its token is shown once")
@requires("admin", collection=False)
async def create_key(body: KeyIn, request: Request) -> dict[str, Any]:
    _unlimited_admin(request)
    store = api_state(request).gate.store
    try:
        key, token = await run_in_threadpool(store.create, body.role, body.collections, body.name, body.rate)
    except KeyStoreError as e:
        raise ApiError(400, "bad_request", str(e)) from None
    return key.to_json() | {"token": token}


@router.delete("/keys/{key_id}", response_model=KeyInfo, summary="Revoke a key (refused from the next request)")
@requires("admin", collection=False)
async def revoke_key(key_id: str, request: Request) -> dict[str, Any]:
    _unlimited_admin(request)
    if key_id == request_principal(request).id:  # one request would lock its own caller out
        raise ApiError(409, "conflict", f"key {key_id} is the key this request was sent with; revoke it with "
                       "another admin key, or on the server's machine: `dpr keys revoke " + key_id + "`")
    store = api_state(request).gate.store
    try:
        key = await run_in_threadpool(store.revoke, key_id)
    except KeyStoreError as e:
        raise ApiError(404, "not_found", str(e)) from None
    return key.to_json()
