"""A LangChain retriever over a dpr API (``pip install 'dpr-ingest[langchain]'``): a thin ``BaseRetriever`` on
``dpr_client``; each hit becomes a ``Document`` with the passage as ``page_content`` and ``metadata`` holding the
score, doc id, title, page / page_end, heading path, format, model fingerprint and citation."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import Field, SecretStr

from dpr_client.client import AsyncClient, Client
from dpr_client.wire import HitOut, Mode


class DprRetriever(BaseRetriever):
    """``DprRetriever(url="http://127.0.0.1:8000", k=4, mode="hybrid", filters={"lang": "en"})``; ``invoke(q, k=2)``
    overrides k (and mode, filters) for one call. The key: ``api_key`` or DPR_API__API_KEY."""

    url: str | None = None
    api_key: SecretStr | None = None
    k: int = Field(default=4, ge=1, le=1000)
    mode: Mode | None = None
    filters: dict[str, Any] = Field(default_factory=dict)

    def _key(self) -> str | None:
        return None if self.api_key is None else self.api_key.get_secret_value()

    def _search_args(self, overrides: dict[str, Any]) -> dict[str, Any]:
        return {"k": overrides.get("k", self.k), "mode": overrides.get("mode", self.mode),
                "filters": overrides.get("filters", self.filters)}

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        with Client(self.url, api_key=self._key()) as client:
            answer = client.search(query, **self._search_args(kwargs))
        return [to_document(h) for h in answer.hits]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **kwargs: Any) -> list[Document]:
        async with AsyncClient(self.url, api_key=self._key()) as client:
            answer = await client.search(query, **self._search_args(kwargs))
        return [to_document(h) for h in answer.hits]


def to_document(hit: HitOut) -> Document:
    return Document(page_content=hit.text, metadata=hit.metadata() | {"score": hit.score},
                    id=f"{hit.doc_id}#{hit.chunk_index}")
