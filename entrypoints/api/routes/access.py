"""GET /v1/whoami: the key a request was sent with (id, name, role, collections; never the secret) and what it
may do here, so a client (the console) shows only what the key may do. GET/POST /v1/keys and DELETE
/v1/keys/{key_id}: `dpr keys list|create|revoke` over HTTP, for an admin key valid for every collection (an admin
limited to some collections could otherwise mint itself a wider key)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from entrypoints.api.auth import request_principal, requires
from entrypoints.api.errors import ApiError
from entrypoints.api.state import api_state
from services.access import ROLES, KeyStoreError, allows

router = APIRouter(prefix="/v1")


class KeyOut(BaseModel):
    id: str = Field(description="The key's id ('env': DPR_API__API_KEY; 'anonymous': no keys configured).")
    name: str
    role: str = Field(description="read < write < admin")
    collections: list[str] | None = Field(description="The collections it may use; null: every collection.")


class WhoAmI(BaseModel):
    key: KeyOut
    locked: bool = Field(description="Whether this server asks for keys at all.")
    collection: str = Field(description="The collection this server answers for.")
    may: dict[str, bool] = Field(description="Per role: whether this key may call that role's routes here.")


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


class KeyIn(BaseModel):
    role: Literal["read", "write", "admin"]
    collections: list[str] | None = Field(default=None, max_length=100,
                                          description="Limit the key to these collections; null: every collection.")
    name: str = Field(default="", max_length=200)
    rate: float | None = Field(default=None, gt=0, description="Requests per second (default DPR_API__RATE_LIMIT).")


class KeyInfo(KeyOut):
    rate: float | None
    created: str
    revoked: str | None


class KeyCreated(KeyInfo):
    token: str = Field(description="The token, shown this once (only its SHA-256 is stored).")


class KeyList(BaseModel):
    keys: list[KeyInfo]


def _unlimited_admin(request: Request) -> None:
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
    store = api_state(request).gate.store
    try:
        key = await run_in_threadpool(store.revoke, key_id)
    except KeyStoreError as e:
        raise ApiError(404, "not_found", str(e)) from None
    return key.to_json()
