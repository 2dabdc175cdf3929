"""`dpr query` and `dpr status` as clients of a running `dpr serve` (``DPR_API_URL``), through ``dpr_client``.

Imports nothing of the model, the store or the queue: the server holds them. The API key (``DPR_API__API_KEY``) is
sent as ``X-API-Key``; 429 / 503 and a refused connection are retried briefly (``dpr_client.Retry``). The client's
errors come back as the service's own error classes, so ``cli_errors`` prints them and exits with the same codes as
the local commands (404 -> 1, 409 -> 1, 400/401/403/422 -> 2, 429 (over the key's rate), 503 and an unreachable
server -> 3, any other 5xx -> 1).
"""

from __future__ import annotations

from typing import Any

import httpx

from dpr_client import ApiError, Client, Conflict, NotFound, RateLimited, Retry, Unauthorized, Unavailable
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

RETRY = Retry(attempts=2, backoff=0.25, max_wait=10.0)  # a person waits at the prompt
_ERRORS: list[tuple[type[ApiError], type[DprError]]] = [
    (NotFound, CollectionNotFound), (Conflict, ModelMismatch), (RateLimited, TransientError),
    (Unavailable, StoreUnavailable),  # an unreachable server included
]


class ApiClient:
    """The few calls `dpr query` / `dpr status` make. ``transport`` lets tests talk to the app in-process."""

    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None) -> None:
        if not settings.api_url:
            raise ConfigError("DPR_API_URL is not set; set it to a running `dpr serve` (http://host:8000)")
        key = settings.api.api_key
        self._client = Client(settings.api_url, api_key=key.get_secret_value() if key is not None else "",
                              retry=RETRY, transport=transport)
        self.url = self._client.url

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def search(self, question: str, options: QueryOptions) -> list[dict[str, Any]]:
        """The hits, each as ``Hit.to_json()`` (what `dpr query --json` prints)."""
        knobs = {"fusion": options.fusion, "rrf_k": options.rrf_k, "linear_weight": options.linear_weight,
                 "candidates": options.candidates, "rerank": options.rerank, "rerank_weight": options.rerank_weight}
        try:
            answer = self._client.search(question, k=options.k, mode=options.mode, filters=options.filters,
                                         **{k: v for k, v in knobs.items() if v is not None})  # type: ignore[arg-type]
        except ApiError as e:
            raise local_error(e, self.url) from None
        return [hit.model_dump(exclude_none=True) for hit in answer.hits]

    def status(self) -> dict[str, Any]:
        try:
            return self._client.status().model_dump()
        except ApiError as e:
            raise local_error(e, self.url) from None


def local_error(error: ApiError, url: str) -> DprError:
    """The service error class the local command would raise, with the server's message."""
    if isinstance(error, Unauthorized):
        return ConfigError(f"{url}: {error} (the key is DPR_API__API_KEY)")
    cls = next((local for api, local in _ERRORS if isinstance(error, api)), None)
    if cls is None:
        cls = DprError if error.status is None or error.status >= 500 else ConfigError
    return cls(str(error) if error.status is None else f"{url}: {error}")
