"""Every error the API returns is JSON: ``{"error": {"type", "message"[, "details"]}}``.

The service's own errors map to statuses by what they mean for the caller: bad arguments 400, a document that
cannot be read 422, no collection 404, towers that do not match the collection or a request the collection as it
is cannot serve (``Conflict``: a mode without its vectors, a reranker it lacks, another language) 409, store or
broker down 503.
Anything unexpected is a 500 with a generic message (details go to the log, not to the client).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dpr_client.wire import NOT_BLANK
from services.core.errors import (
    CollectionNotFound,
    ConfigError,
    Conflict,
    DocumentError,
    DprError,
    ModelMismatch,
    TransientError,
)

log = logging.getLogger(__name__)

# Most specific first.
SERVICE_ERRORS: list[tuple[type[DprError], int, str]] = [
    (CollectionNotFound, 404, "not_found"),
    (ModelMismatch, 409, "model_mismatch"),
    (Conflict, 409, "conflict"),  # before ConfigError, its base
    (DocumentError, 422, "invalid_document"),
    (ConfigError, 400, "bad_request"),
    (TransientError, 503, "unavailable"),
    (DprError, 400, "bad_request"),
]

HTTP_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "too_large",
    415: "unsupported_media_type",
    422: "validation",
    503: "unavailable",
}


class ApiError(Exception):
    def __init__(self, status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.headers = headers


def _printable(value: Any) -> Any:
    """``value`` with every string valid UTF-8: an echoed lone surrogate (``"\\ud800"``) becomes ``\\ud800``."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def error_response(
    status: int, type_: str, message: str, details: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"type": type_, "message": message}
    if details:
        body["details"] = details
    return JSONResponse(_printable({"error": body}), status_code=status, headers=headers)


def status_of(error: DprError) -> tuple[int, str]:
    for cls, status, type_ in SERVICE_ERRORS:
        if isinstance(error, cls):
            return status, type_
    return 400, "bad_request"  # pragma: no cover - DprError is last in the table


# The names pydantic gives the members of a union in an error's location (``function-after[...]``, ``int``):
# noise to a client, who wants the field.
_UNION_MEMBER = re.compile(r"(function-(after|before|wrap|plain)|list|dict|union|tagged-union)\[.*\]|"
                           r"constrained-(str|int|float|bytes)|str|int|float|bool|none")


def _validation_details(error: RequestValidationError) -> list[dict[str, Any]]:
    details = []
    for e in error.errors()[:20]:
        loc = [str(p) for p in e.get("loc", ()) if not (isinstance(p, str) and _UNION_MEMBER.fullmatch(p))]
        message = str(e.get("msg", "")).removeprefix("Value error, ")
        if e.get("type") == "string_pattern_mismatch" and (e.get("ctx") or {}).get("pattern") == NOT_BLANK:
            message = "is blank; send some text (a character that is not white space)"
        details.append({"loc": ".".join(loc), "message": message, "type": str(e.get("type", ""))})
    return details


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.type, exc.message, headers=exc.headers)

    @app.exception_handler(DprError)
    async def _service_error(request: Request, exc: DprError) -> JSONResponse:
        status, type_ = status_of(exc)
        headers = {"Retry-After": "5"} if status == 503 else None
        return error_response(status, type_, str(exc), headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = _validation_details(exc)
        first = details[0] if details else {"loc": "body", "message": "invalid request"}
        more = f" (and {len(details) - 1} more problems)" if len(details) > 1 else ""
        message = f"invalid request: {first['loc']}: {first['message']}{more}; see the OpenAPI schema at /openapi.json"
        return error_response(422, "validation", message, details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = HTTP_TYPES.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}; see /docs for the API"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}; see /docs for the API"
        return error_response(exc.status_code, type_, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", extra={"path": request.url.path, "method": request.method})
        return error_response(500, "internal", "internal error; the server log has the details")
