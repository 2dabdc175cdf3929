"""The client's errors: one class per kind of answer, each carrying the server's message (``{"error": {"type",
"message", "details"}}``, docs/api.md#errors), its HTTP status and, for 429 / 503, the Retry-After it asked for."""

from __future__ import annotations

from typing import Any

import httpx


class ApiError(Exception):
    """An answer the server refused, or no answer. ``str(e)`` is the server's message (with the details)."""

    def __init__(self, message: str, *, status: int | None = None, type: str = "", url: str = "",
                 details: list[dict[str, Any]] | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.type, self.url = message, status, type, url
        self.details = details or []
        self.retry_after = retry_after


class BadRequest(ApiError):
    """400, 415 or 422: the request itself is wrong (``details`` names each field)."""


class Unauthorized(ApiError):
    """401: a missing, wrong or revoked key (``api_key=`` or DPR_API__API_KEY)."""


class Forbidden(ApiError):
    """403: the key's role or collections do not allow this route."""


class NotFound(ApiError):
    """404: no such collection, document, job or report."""


class Conflict(ApiError):
    """409: the server's towers do not match the collection."""


class TooLarge(ApiError):
    """413: the body or the batch is over the server's limit."""


class RateLimited(ApiError):
    """429: over the key's rate; retried by the client within its bound, then raised."""


class Unavailable(ApiError):
    """503: the store or broker is unavailable, or the server is at capacity; retried, then raised."""


class Unreachable(Unavailable):
    """No answer at all (connection refused or reset): retried, then raised."""


class ServerError(ApiError):
    """Any other 5xx."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 413: TooLarge,
    415: BadRequest, 422: BadRequest, 429: RateLimited, 503: Unavailable,
}


def retry_after(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds (the server sends seconds; an HTTP date is not honoured)."""
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def error_for(response: httpx.Response) -> ApiError:
    """The error a refused answer stands for, with the server's message and details."""
    try:
        body = response.json().get("error") or {}
    except (ValueError, AttributeError):
        body = {}
    message = str(body.get("message") or response.text[:300] or response.reason_phrase)
    details = [d for d in body.get("details") or [] if isinstance(d, dict)]
    for detail in details:
        message += f"\n  {detail.get('loc', '')}: {detail.get('message', detail)}"
    status = response.status_code
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    try:
        url = str(response.request.url)
    except RuntimeError:  # a response built by hand (tests) has no request
        url = ""
    return cls(message, status=status, type=str(body.get("type") or ""), url=url, details=details,
               retry_after=retry_after(response))
