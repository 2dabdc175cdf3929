"""`dpr query` and `dpr status` as plain HTTP clients of a running `dpr serve` (``DPR_API_URL``).

Imports httpx and nothing of the model, the store or the queue: the server holds them. The API key
(``DPR_API__API_KEY``) is sent as ``X-API-Key``. The server's errors come back as the service's own error classes, so
``cli_errors`` prints them and exits with the same codes as the local commands (404 -> 1, 409 -> 1, 400/401/403/422
-> 2, 429 (over the key's rate), 503 and an unreachable server -> 3, any other 5xx -> 1).
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from services.core.errors import (
    CollectionNotFound,
    ConfigError,
    DprError,
    ModelMismatch,
    StoreUnavailable,
    TransientError,
)
from services.core.settings import Settings
from services.query import QueryOptions

log = logging.getLogger(__name__)

TIMEOUT = httpx.Timeout(60.0, connect=5.0)  # a cold server loads its model on the first search
_ERRORS: dict[int, type[DprError]] = {
    404: CollectionNotFound, 409: ModelMismatch, 429: TransientError, 503: StoreUnavailable,  # 429: over the key's rate
}


class ApiClient:
    """The few calls `dpr query` / `dpr status` make. ``transport`` lets tests talk to the app in-process."""

    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None) -> None:
        if not settings.api_url:
            raise ConfigError("DPR_API_URL is not set; set it to a running `dpr serve` (http://host:8000)")
        self.url = settings.api_url.rstrip("/")
        key = settings.api.api_key
        headers = {"X-API-Key": key.get_secret_value()} if key is not None else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT, transport=transport)

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def search(self, question: str, options: QueryOptions) -> list[dict[str, Any]]:
        """The hits, each as ``Hit.to_json()`` (what `dpr query --json` prints)."""
        body = {
            "question": question, "k": options.k, "mode": options.mode, "filters": options.filters,
            "fusion": options.fusion, "rrf_k": options.rrf_k, "linear_weight": options.linear_weight,
            "candidates": options.candidates, "rerank": options.rerank,
            "rerank_weight": options.rerank_weight,
        }
        answer = self._call("POST", "/v1/search", json={k: v for k, v in body.items() if v is not None})
        return list(answer["hits"])

    def status(self) -> dict[str, Any]:
        return dict(self._call("GET", "/v1/status"))

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise StoreUnavailable(
                f"the dpr API at {self.url} is unreachable ({type(e).__name__}: {e}); start it with `dpr serve` or "
                "check DPR_API_URL"
            ) from e
        if response.is_success:
            return response.json()
        raise _error(response, self.url)


def _error(response: httpx.Response, url: str) -> DprError:
    try:
        error = response.json().get("error") or {}
    except ValueError:
        error = {}
    message = str(error.get("message") or response.text[:300] or response.reason_phrase)
    for detail in error.get("details") or []:
        message += f"\n  {detail.get('loc', '')}: {detail.get('message', detail)}"
    status = response.status_code
    if status == 401:
        return ConfigError(f"{url}: {message} (the key is DPR_API__API_KEY)")
    cls = _ERRORS.get(status) or (DprError if status >= 500 else ConfigError)
    return cls(f"{url}: {message}")
