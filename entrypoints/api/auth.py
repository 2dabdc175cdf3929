"""The API key check (``DPR_API__API_KEY``): header ``X-API-Key`` or ``Authorization: Bearer``."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from entrypoints.api.errors import ApiError
from services.settings import Settings


def auth_dependencies(settings: Settings) -> list[Any]:
    secret = settings.api.api_key
    if secret is None:
        return []
    expected = secret.get_secret_value().encode()
    header = APIKeyHeader(name="X-API-Key", auto_error=False, description="The API key (DPR_API__API_KEY).")
    bearer = HTTPBearer(auto_error=False, description="The API key as a bearer token.")

    # Defaults, not Annotated: with postponed annotations FastAPI could not see these local schemes.
    def require_key(
        key: str | None = Security(header),  # noqa: B008
        credentials: HTTPAuthorizationCredentials | None = Security(bearer),  # noqa: B008
    ) -> None:
        given = key or (credentials.credentials if credentials is not None else None)
        if given is None or not hmac.compare_digest(given.encode(), expected):
            raise ApiError(
                401, "unauthorized",
                "missing or wrong API key; send it as header 'X-API-Key: KEY' or 'Authorization: Bearer KEY'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return [Security(require_key)]
