"""A LlamaIndex retriever over a dpr API (``pip install 'dpr-ingest[llamaindex]'``): a thin ``BaseRetriever`` on
``dpr_client``; each hit becomes a ``NodeWithScore`` (a ``TextNode`` with the passage and the hit's metadata: doc
id, title, page / page_end, heading path, format, model fingerprint, citation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from dpr_client.client import AsyncClient, Client
from dpr_client.wire import HitOut, Mode


class DprRetriever(BaseRetriever):
    """``DprRetriever(url=..., k=4, mode=None, filters=None, api_key=None)``; ``retrieve`` / ``aretrieve``."""

    def __init__(self, url: str | None = None, *, api_key: str | None = None, k: int = 4, mode: Mode | None = None,
                 filters: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.url, self.api_key, self.k, self.mode, self.filters = url, api_key, k, mode, dict(filters or {})

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        with Client(self.url, api_key=self.api_key) as client:
            answer = client.search(query_bundle.query_str, k=self.k, mode=self.mode, filters=self.filters)
        return [to_node(h) for h in answer.hits]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        async with AsyncClient(self.url, api_key=self.api_key) as client:
            answer = await client.search(query_bundle.query_str, k=self.k, mode=self.mode, filters=self.filters)
        return [to_node(h) for h in answer.hits]


def to_node(hit: HitOut) -> NodeWithScore:
    node = TextNode(id_=f"{hit.doc_id}#{hit.chunk_index}", text=hit.text, metadata=hit.metadata())
    return NodeWithScore(node=node, score=hit.score)
