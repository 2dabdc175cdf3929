"""A Haystack component over a dpr API (``pip install 'dpr-ingest[haystack]'``): ``DprRetriever`` takes a query
(and top_k, filters) and returns ``{"documents": [Document]}``, each with the passage as ``content``, the score, and
``meta`` holding doc id, title, page / page_end, heading path, format, model fingerprint and citation. It
serialises with ``to_dict`` / ``from_dict`` (the key as a ``Secret``: an environment variable, never its value)."""

from __future__ import annotations

from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.utils import Secret, deserialize_secrets_inplace

from dpr_client.client import AsyncClient, Client
from dpr_client.wire import HitOut, Mode


@component
class DprRetriever:
    def __init__(self, url: str | None = None, *, top_k: int = 4, mode: Mode | None = None,
                 filters: dict[str, Any] | None = None,
                 api_key: Secret = Secret.from_env_var("DPR_API__API_KEY", strict=False)) -> None:  # noqa: B008
        self.url, self.top_k, self.mode, self.filters, self.api_key = url, top_k, mode, filters or {}, api_key

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, url=self.url, top_k=self.top_k, mode=self.mode, filters=self.filters,
                               api_key=self.api_key.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DprRetriever:
        deserialize_secrets_inplace(data["init_parameters"], keys=["api_key"])
        return default_from_dict(cls, data)

    @component.output_types(documents=list[Document])
    def run(self, query: str, top_k: int | None = None, filters: dict[str, Any] | None = None) -> dict[str, Any]:
        with Client(self.url, api_key=self.api_key.resolve_value()) as client:
            answer = client.search(query, k=top_k or self.top_k, mode=self.mode, filters=self.filters | (filters or {}))
        return {"documents": [to_document(h) for h in answer.hits]}

    @component.output_types(documents=list[Document])
    async def run_async(self, query: str, top_k: int | None = None,
                        filters: dict[str, Any] | None = None) -> dict[str, Any]:
        async with AsyncClient(self.url, api_key=self.api_key.resolve_value()) as client:
            answer = await client.search(query, k=top_k or self.top_k, mode=self.mode,
                                         filters=self.filters | (filters or {}))
        return {"documents": [to_document(h) for h in answer.hits]}


def to_document(hit: HitOut) -> Document:
    return Document(id=f"{hit.doc_id}#{hit.chunk_index}", content=hit.text, score=hit.score, meta=hit.metadata())
