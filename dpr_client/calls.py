"""What the clients send and how they read the answer: a ``Call`` per request, built by ``routes`` (one per route
of the HTTP API, docs/api.md) or by a client method; ``dpr_client.client`` sends them with its retry policy."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypedDict, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from dpr_client import wire, wire_sources

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class SearchOptions(TypedDict, total=False):
    """The rarer search knobs (docs/hybrid.md, docs/training.md#reranker); absent: the collection's defaults."""

    fusion: Literal["rrf", "linear"]
    rrf_k: int
    linear_weight: float
    candidates: int
    rerank: int
    rerank_weight: float


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    read: Callable[[httpx.Response], T]
    send: dict[str, Any] = field(default_factory=dict)  # json / params / files / data for httpx
    accept: tuple[int, ...] = ()  # refusals that are answers (503 from /readyz)


def read_model(cls: type[M]) -> Callable[[httpx.Response], M]:
    return lambda r: cls.model_validate_json(r.content)


class routes:  # noqa: N801 - a namespace: one Call per route
    @staticmethod
    def search(question: str, k: int, mode: wire.Mode | None, filters: Mapping[str, Any] | None,
               options: SearchOptions) -> Call[wire.SearchOut]:
        body = wire.SearchIn(question=question, k=k, mode=mode, filters=dict(filters or {}), **options)
        return Call("POST", "/v1/search", read_model(wire.SearchOut), {"json": body.model_dump(exclude_none=True)})

    @staticmethod
    def ingest(documents: Iterable[wire.DocumentIn | Mapping[str, Any]], language: wire.Language,
               sync_prefix: str | None, prune: bool) -> Call[wire.JobAccepted]:
        docs = [d if isinstance(d, wire.DocumentIn) else wire.DocumentIn.model_validate(d) for d in documents]
        body = wire.DocumentsIn(documents=docs, language=language).model_dump(mode="json")
        return Call("POST", "/v1/documents", read_model(wire.JobAccepted),
                    {"json": body, "params": sync_params(sync_prefix, prune)})

    @staticmethod
    def upload(file: str | Path, content: bytes | None, format: str, language: wire.Language,
               sync_prefix: str | None, prune: bool) -> Call[wire.JobAccepted]:
        data = Path(file).read_bytes() if content is None else content  # in memory: a retry sends it again
        return Call("POST", "/v1/documents", read_model(wire.JobAccepted), {
            "files": {"file": (Path(file).name, data)}, "data": {"format": format, "language": language},
            "params": sync_params(sync_prefix, prune)})

    @staticmethod
    def job(job_id: str) -> Call[wire.JobStatus]:
        return Call("GET", f"/v1/jobs/{quote(job_id, safe='')}", read_model(wire.JobStatus))

    @staticmethod
    def delete(doc_id: str) -> Call[wire.DeleteOut]:
        return Call("DELETE", f"/v1/documents/{quote(doc_id, safe='/')}", read_model(wire.DeleteOut))

    @staticmethod
    def feedback(question: str, relevant: bool, doc_id: str | None, chunk: int | None,
                 point_id: str | None) -> Call[wire.FeedbackOut]:
        body = present(question=question, relevant=relevant, doc_id=doc_id, chunk=chunk, point_id=point_id)
        wire.FeedbackIn.model_validate(body)  # refused here, before a round trip, as the server would refuse it
        return Call("POST", "/v1/feedback", read_model(wire.FeedbackOut), {"json": body})

    @staticmethod
    def create_key(role: str, collections: list[str] | None, name: str, rate: float | None) -> Call[wire.KeyCreated]:
        body = present(role=role, collections=collections, name=name, rate=rate)
        wire.KeyIn.model_validate(body)
        return Call("POST", "/v1/keys", read_model(wire.KeyCreated), {"json": body})

    @staticmethod
    def get(path: str, model: type[M]) -> Call[M]:
        return Call("GET", path, read_model(model))

    @staticmethod
    def revoke_key(key_id: str) -> Call[wire.KeyInfo]:
        return Call("DELETE", f"/v1/keys/{quote(key_id, safe='')}", read_model(wire.KeyInfo))

    @staticmethod
    def add_source(name: str, uri: str, options: dict[str, Any]) -> Call[wire_sources.SourceOut]:
        body = present(name=name, uri=uri, **options)
        wire_sources.SourceIn.model_validate(body)
        return Call("POST", "/v1/sources", read_model(wire_sources.SourceOut), {"json": body})

    @staticmethod
    def source(name: str, action: str = "") -> str:
        return f"/v1/sources/{quote(name, safe='')}{action}"


def present(**fields: Any) -> dict[str, Any]:
    """A body's fields less those left out (None): the schema lets them be absent, never null."""
    return {name: value for name, value in fields.items() if value is not None}


def sync_params(sync_prefix: str | None, prune: bool) -> dict[str, Any]:
    return {} if sync_prefix is None else {"sync_prefix": sync_prefix, "prune": str(prune).lower()}
