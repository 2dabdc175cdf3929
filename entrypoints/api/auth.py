"""The API key check (``DPR_API__API_KEY``): header ``X-API-Key`` or ``Authorization: Bearer``."""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from entrypoints.api.errors import ApiError
from services.settings import Settings


def key_bytes(header_value: str) -> bytes:
    """The key a client sent, as UTF-8 bytes. HTTP headers arrive as bytes that the server decodes as Latin-1, so a
    UTF-8 client's "clé" arrives as "clÃ©": take the raw bytes back, read them as UTF-8 (or, failing that, as the
    Latin-1 a Latin-1 client meant) and compare UTF-8 with UTF-8."""
    raw = header_value.encode("latin-1", "replace")
    try:
        raw.decode("utf-8")
        return raw
    except UnicodeDecodeError:
        return header_value.encode("utf-8")


def auth_dependencies(settings: Settings) -> list[Any]:
    secret = settings.api.api_key
    if secret is None:
        return []
    expected = secret.get_secret_value().encode("utf-8")
    header = APIKeyHeader(name="X-API-Key", auto_error=False, description="The API key (DPR_API__API_KEY).")
    bearer = HTTPBearer(auto_error=False, description="The API key as a bearer token.")

    # Defaults, not Annotated: with postponed annotations FastAPI could not see these local schemes.
    def require_key(
        key: str | None = Security(header),  # noqa: B008
        credentials: HTTPAuthorizationCredentials | None = Security(bearer),  # noqa: B008
    ) -> None:
        given = key or (credentials.credentials if credentials is not None else None)
        if given is None or not hmac.compare_digest(key_bytes(given), expected):
            raise ApiError(
                401, "unauthorized",
                "missing or wrong API key; send it as header 'X-API-Key: KEY' or 'Authorization: Bearer KEY'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return [Security(require_key)]
