"""A typed Python client of the dpr HTTP API (``dpr serve``): ``Client`` and ``AsyncClient``, one method per route,
the same names in both. A leaf: httpx and pydantic only, nothing of the model, the store or the queue.

    from dpr_client import Client
    with Client("http://127.0.0.1:8000") as dpr:          # key: api_key=... or DPR_API__API_KEY
        for hit in dpr.search("How do I save a plot as PNG?", k=3).hits:
            print(hit.score, hit.citation(), hit.text[:80])

The framework retrievers (``dpr_client.langchain``, ``.llamaindex``, ``.haystack``) and the MCP server
(``dpr_client.mcp``) sit on it, each in its optional extra (docs/integrations.md).
"""

from dpr_client.client import AsyncClient, Client, Retry
from dpr_client.errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    RateLimited,
    ServerError,
    TooLarge,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from dpr_client.wire import DeleteOut, DocumentIn, HitOut, JobAccepted, JobStatus, SearchOut

Hit = HitOut
__all__ = [
    "AsyncClient", "Client", "Retry", "Hit", "HitOut", "SearchOut", "DocumentIn", "JobAccepted", "JobStatus",
    "DeleteOut", "ApiError", "BadRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "TooLarge",
    "RateLimited", "Unavailable", "Unreachable", "ServerError",
]
