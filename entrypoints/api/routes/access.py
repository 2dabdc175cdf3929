"""GET /v1/whoami: the key a request was sent with (id, name, role, collections; never the secret) and what it
may do here, so a client (the console) shows only what the key may do."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from entrypoints.api.auth import request_principal, requires
from entrypoints.api.state import api_state
from services.access import ROLES, allows

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
