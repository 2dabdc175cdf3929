"""``Client`` and ``AsyncClient``: one method per route of the HTTP API (docs/api.md), the same names and
arguments in both, over one httpx connection pool each.

Each method builds a ``Call`` (what to send, how to read the answer: ``dpr_client.calls``); ``_send`` sends it with the
retry policy: 429 and 503 are retried after the Retry-After the server names (else a doubling backoff), and so is
a connection that failed before an answer (refused, reset); at most ``Retry.attempts`` more tries, and never a wait
longer than ``Retry.max_wait`` (a longer Retry-After is raised at once, with its value). Read timeouts are not
retried: the server may still be working on the request.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel
from typing_extensions import Unpack

from dpr_client import wire, wire_sources
from dpr_client.calls import Call, SearchOptions, present, read_model, routes
from dpr_client.errors import ApiError, RateLimited, Unavailable, Unreachable, error_for

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)  # a cold server loads its model on the first search


@dataclass(frozen=True)
class Retry:
    """How refused or failed calls are tried again."""

    attempts: int = 3  # tries after the first
    backoff: float = 0.5  # the first wait (s) when the server names none; doubled each time
    max_wait: float = 30.0  # the longest single wait honoured

    def wait(self, attempt: int, error: ApiError) -> float | None:
        """Seconds to wait before try ``attempt + 2``; None: raise ``error``."""
        if attempt >= self.attempts or not isinstance(error, RateLimited | Unavailable):
            return None
        delay = error.retry_after if error.retry_after is not None else self.backoff * 2**attempt
        return delay if delay <= self.max_wait else None


class _Base:
    def __init__(self, url: str | None, api_key: str | None, timeout: httpx.Timeout | float | None,
                 retry: Retry) -> None:
        self.url = (url or os.environ.get("DPR_API_URL") or DEFAULT_URL).rstrip("/")
        key = api_key if api_key is not None else os.environ.get("DPR_API__API_KEY")
        self.headers = {"X-API-Key": key} if key else {}
        self.timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self.retry = retry

    def _answer(self, call: Call[T], response: httpx.Response) -> T | ApiError:
        if response.is_success or response.status_code in call.accept:
            return call.read(response)
        return error_for(response)

    def _failed(self, call: Call[Any], e: httpx.TransportError) -> Unreachable:
        """A call that got no answer; a timeout after the request was sent is not retried (``_retried``)."""
        what = "is unreachable" if _retried(e) else "did not answer in time"
        error = Unreachable(f"the dpr API at {self.url} {what} ({call.method} {call.path}: {type(e).__name__}: {e}); "
                            "start it with `dpr serve` or check the URL (DPR_API_URL)",
                            url=self.url, type="unreachable" if _retried(e) else "timeout")
        error.__cause__ = e
        return error

    def _delay(self, attempt: int, error: ApiError) -> float:
        """The wait before the next try; raises ``error`` when there is none."""
        delay = None if isinstance(error, Unreachable) and error.type == "timeout" else self.retry.wait(attempt, error)
        if delay is None:
            raise error
        return delay

    def _followed(self, follow: _Follow, status: wire.JobStatus) -> wire.JobStatus | None:
        """One poll of ``wait``: the final status, or None to poll again."""
        if follow.progress is not None and status != follow.seen:
            follow.progress(status)
        if status.finished:
            return status
        if time.monotonic() > follow.deadline:
            raise TimeoutError(f"job {status.job} still {status.state} after {follow.timeout:g} s")
        follow.seen = status
        return None


@dataclass
class _Follow:
    timeout: float
    progress: Callable[[wire.JobStatus], None] | None
    deadline: float = 0.0
    seen: wire.JobStatus | None = None

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout


def _job_id(job: str | wire.JobAccepted) -> str:
    return job if isinstance(job, str) else job.job


def _retried(e: httpx.TransportError) -> bool:
    return isinstance(e, httpx.ConnectTimeout) or not isinstance(e, httpx.TimeoutException)


class Client(_Base):
    """The HTTP API, synchronously. ``url``: the argument, else DPR_API_URL, else http://127.0.0.1:8000;
    ``api_key``: the argument, else DPR_API__API_KEY (sent as X-API-Key). ``transport``: httpx's, for tests."""

    def __init__(self, url: str | None = None, *, api_key: str | None = None,
                 timeout: httpx.Timeout | float | None = None, retry: Retry = Retry(),  # noqa: B008 - frozen
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(url, api_key, timeout, retry)
        self._http = httpx.Client(base_url=self.url, headers=self.headers, timeout=self.timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call[T]) -> T:
        for attempt in itertools.count():
            try:
                answer = self._answer(call, self._http.request(call.method, call.path, **call.send))
            except httpx.TransportError as e:
                answer = self._failed(call, e)
            if not isinstance(answer, ApiError):
                return answer
            time.sleep(self._delay(attempt, answer))
        raise AssertionError("unreachable")  # pragma: no cover

    def search(self, question: str, *, k: int = 10, mode: wire.Mode | None = None,
               filters: Mapping[str, Any] | None = None, **options: Unpack[SearchOptions]) -> wire.SearchOut:
        """``POST /v1/search``: the top ``k`` passages; ``filters``: payload key -> value or [values] (any of)."""
        return self._send(routes.search(question, k, mode, filters, options))

    def ingest(self, documents: Iterable[wire.DocumentIn | Mapping[str, Any]], *, language: wire.Language = "auto",
               sync_prefix: str | None = None, prune: bool = False) -> wire.JobAccepted:
        """``POST /v1/documents`` (JSON): a batch of ``{id, text, title?, metadata?}``; one job."""
        return self._send(routes.ingest(documents, language, sync_prefix, prune))

    def upload(self, file: str | Path, *, content: bytes | None = None, format: str = "auto",
               language: wire.Language = "auto", sync_prefix: str | None = None,
               prune: bool = False) -> wire.JobAccepted:
        """``POST /v1/documents`` (multipart): one file (read from ``file``, or ``content`` named ``file``)."""
        return self._send(routes.upload(file, content, format, language, sync_prefix, prune))

    def job(self, job_id: str) -> wire.JobStatus:
        """``GET /v1/jobs/{job_id}``."""
        return self._send(routes.job(job_id))

    def wait(self, job: str | wire.JobAccepted, *, timeout: float = 600.0, poll: float = 0.2,
             progress: Callable[[wire.JobStatus], None] | None = None) -> wire.JobStatus:
        """Follow a job until done or failed, calling ``progress`` with each new state; TimeoutError after
        ``timeout`` seconds."""
        follow = _Follow(timeout, progress)
        while (done := self._followed(follow, self.job(_job_id(job)))) is None:
            time.sleep(poll)
        return done

    def delete(self, doc_id: str) -> wire.DeleteOut:
        """``DELETE /v1/documents/{doc_id}``: the document and its passages."""
        return self._send(routes.delete(doc_id))

    def status(self) -> wire.Status:
        """``GET /v1/status``: what `dpr status --json` prints (``model_dump()`` gives all of it)."""
        return self._send(routes.get("/v1/status", wire.Status))

    def whoami(self) -> wire.WhoAmI:
        """``GET /v1/whoami``: this key's id, role and collections, and what it may do."""
        return self._send(routes.get("/v1/whoami", wire.WhoAmI))

    def feedback(self, question: str, *, relevant: bool, doc_id: str | None = None, chunk: int | None = None,
                 point_id: str | None = None) -> wire.FeedbackOut:
        """``POST /v1/feedback``: judge a hit (``doc_id`` + ``chunk``, or ``point_id``) relevant or not."""
        return self._send(routes.feedback(question, relevant, doc_id, chunk, point_id))

    def judgements(self) -> wire.FeedbackExport:
        """``GET /v1/feedback`` (admin): every judgement of the collection, with counts."""
        return self._send(routes.get("/v1/feedback", wire.FeedbackExport))

    def snapshot(self) -> wire.Snapshot:
        """``POST /v1/snapshots`` (admin): snapshot the collection."""
        return self._send(Call("POST", "/v1/snapshots", read_model(wire.Snapshot)))

    def snapshots(self) -> wire.SnapshotList:
        """``GET /v1/snapshots`` (admin)."""
        return self._send(routes.get("/v1/snapshots", wire.SnapshotList))

    def keys(self) -> wire.KeyList:
        """``GET /v1/keys`` (admin): the keys, never their tokens."""
        return self._send(routes.get("/v1/keys", wire.KeyList))

    def create_key(self, role: Literal["read", "write", "admin"], *, name: str,
                   collections: list[str] | None = None, rate: float | None = None) -> wire.KeyCreated:
        """``POST /v1/keys`` (admin, on a server that has keys): a new key named ``name``; its ``token`` is shown
        this once. ``rate``: requests per second, 0.1-100,000 (absent: the server's DPR_API__RATE_LIMIT)."""
        return self._send(routes.create_key(role, collections, name, rate))

    def revoke_key(self, key_id: str) -> wire.KeyInfo:
        """``DELETE /v1/keys/{key_id}`` (admin)."""
        return self._send(routes.revoke_key(key_id))

    def sources(self) -> wire_sources.SourceList:
        """``GET /v1/sources`` (read): each source with its last sync, outcome, counts and next run."""
        return self._send(routes.get("/v1/sources", wire_sources.SourceList))

    def source(self, name: str) -> wire_sources.SourceStatus:
        """``GET /v1/sources/{name}`` (read)."""
        return self._send(routes.get(routes.source(name), wire_sources.SourceStatus))

    def add_source(self, name: str, uri: str, *, every: str | None = None, include: list[str] | None = None,
                   exclude: list[str] | None = None, collection: str | None = None, endpoint: str | None = None,
                   key_env: str | None = None, secret_env: str | None = None,
                   branch: str | None = None) -> wire_sources.SourceOut:
        """``POST /v1/sources`` (admin): add a source (docs/sources.md); credentials by variable NAME only."""
        return self._send(routes.add_source(name, uri, present(
            every=every, include=include, exclude=exclude, collection=collection, endpoint=endpoint,
            key_env=key_env, secret_env=secret_env, branch=branch)))

    def sync_source(self, name: str) -> wire_sources.SyncAccepted:
        """``POST /v1/sources/{name}/sync`` (write): start a sync; ``source(name)`` shows how it ended."""
        return self._send(Call("POST", routes.source(name, "/sync"), read_model(wire_sources.SyncAccepted)))

    def remove_source(self, name: str, *, purge: bool = False) -> wire_sources.SourceRemoved:
        """``DELETE /v1/sources/{name}`` (admin); ``purge``: its documents too."""
        return self._send(Call("DELETE", routes.source(name), read_model(wire_sources.SourceRemoved),
                               {"params": {"purge": str(purge).lower()}}))

    def eval_report(self) -> wire.EvalReport:
        """``GET /v1/eval/report``: the latest `dpr eval --report` of the server's data dir."""
        return self._send(routes.get("/v1/eval/report", wire.EvalReport))

    def eval_plot(self, name: str) -> bytes:
        """``GET /v1/eval/report/plots/{name}``: one PNG."""
        return self._send(Call("GET", f"/v1/eval/report/plots/{quote(name, safe='')}", lambda r: r.content))

    def health(self) -> wire.Health:
        """``GET /healthz``."""
        return self._send(Call("GET", "/healthz", read_model(wire.Health)))

    def ready(self) -> wire.Readiness:
        """``GET /readyz``: ready or not (with each check); not retried."""
        return self._send(Call("GET", "/readyz", read_model(wire.Readiness), accept=(503,)))


class AsyncClient(_Base):
    """``Client``'s methods, awaited (the same names and arguments)."""

    def __init__(self, url: str | None = None, *, api_key: str | None = None,
                 timeout: httpx.Timeout | float | None = None, retry: Retry = Retry(),  # noqa: B008 - frozen
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(url, api_key, timeout, retry)
        self._http = httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=self.timeout,
                                       transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call[T]) -> T:
        import asyncio  # here: a sync caller's import skips it (a fifth of the client's import time)

        for attempt in itertools.count():
            try:
                answer = self._answer(call, await self._http.request(call.method, call.path, **call.send))
            except httpx.TransportError as e:
                answer = self._failed(call, e)
            if not isinstance(answer, ApiError):
                return answer
            await asyncio.sleep(self._delay(attempt, answer))
        raise AssertionError("unreachable")  # pragma: no cover

    async def search(self, question: str, *, k: int = 10, mode: wire.Mode | None = None,
                     filters: Mapping[str, Any] | None = None, **options: Unpack[SearchOptions]) -> wire.SearchOut:
        return await self._send(routes.search(question, k, mode, filters, options))

    async def ingest(self, documents: Iterable[wire.DocumentIn | Mapping[str, Any]], *,
                     language: wire.Language = "auto", sync_prefix: str | None = None,
                     prune: bool = False) -> wire.JobAccepted:
        return await self._send(routes.ingest(documents, language, sync_prefix, prune))

    async def upload(self, file: str | Path, *, content: bytes | None = None, format: str = "auto",
                     language: wire.Language = "auto", sync_prefix: str | None = None,
                     prune: bool = False) -> wire.JobAccepted:
        return await self._send(routes.upload(file, content, format, language, sync_prefix, prune))

    async def job(self, job_id: str) -> wire.JobStatus:
        return await self._send(routes.job(job_id))

    async def wait(self, job: str | wire.JobAccepted, *, timeout: float = 600.0, poll: float = 0.2,
                   progress: Callable[[wire.JobStatus], None] | None = None) -> wire.JobStatus:
        import asyncio

        follow = _Follow(timeout, progress)
        while (done := self._followed(follow, await self.job(_job_id(job)))) is None:
            await asyncio.sleep(poll)
        return done

    async def delete(self, doc_id: str) -> wire.DeleteOut:
        return await self._send(routes.delete(doc_id))

    async def status(self) -> wire.Status:
        return await self._send(routes.get("/v1/status", wire.Status))

    async def whoami(self) -> wire.WhoAmI:
        return await self._send(routes.get("/v1/whoami", wire.WhoAmI))

    async def feedback(self, question: str, *, relevant: bool, doc_id: str | None = None, chunk: int | None = None,
                       point_id: str | None = None) -> wire.FeedbackOut:
        return await self._send(routes.feedback(question, relevant, doc_id, chunk, point_id))

    async def judgements(self) -> wire.FeedbackExport:
        return await self._send(routes.get("/v1/feedback", wire.FeedbackExport))

    async def snapshot(self) -> wire.Snapshot:
        return await self._send(Call("POST", "/v1/snapshots", read_model(wire.Snapshot)))

    async def snapshots(self) -> wire.SnapshotList:
        return await self._send(routes.get("/v1/snapshots", wire.SnapshotList))

    async def keys(self) -> wire.KeyList:
        return await self._send(routes.get("/v1/keys", wire.KeyList))

    async def create_key(self, role: Literal["read", "write", "admin"], *, name: str,
                         collections: list[str] | None = None, rate: float | None = None) -> wire.KeyCreated:
        return await self._send(routes.create_key(role, collections, name, rate))

    async def revoke_key(self, key_id: str) -> wire.KeyInfo:
        return await self._send(routes.revoke_key(key_id))

    async def sources(self) -> wire_sources.SourceList:
        return await self._send(routes.get("/v1/sources", wire_sources.SourceList))

    async def source(self, name: str) -> wire_sources.SourceStatus:
        return await self._send(routes.get(routes.source(name), wire_sources.SourceStatus))

    async def add_source(self, name: str, uri: str, *, every: str | None = None, include: list[str] | None = None,
                         exclude: list[str] | None = None, collection: str | None = None,
                         endpoint: str | None = None, key_env: str | None = None, secret_env: str | None = None,
                         branch: str | None = None) -> wire_sources.SourceOut:
        return await self._send(routes.add_source(name, uri, present(
            every=every, include=include, exclude=exclude, collection=collection, endpoint=endpoint,
            key_env=key_env, secret_env=secret_env, branch=branch)))

    async def sync_source(self, name: str) -> wire_sources.SyncAccepted:
        return await self._send(Call("POST", routes.source(name, "/sync"), read_model(wire_sources.SyncAccepted)))

    async def remove_source(self, name: str, *, purge: bool = False) -> wire_sources.SourceRemoved:
        return await self._send(Call("DELETE", routes.source(name), read_model(wire_sources.SourceRemoved),
                                     {"params": {"purge": str(purge).lower()}}))

    async def eval_report(self) -> wire.EvalReport:
        return await self._send(routes.get("/v1/eval/report", wire.EvalReport))

    async def eval_plot(self, name: str) -> bytes:
        return await self._send(Call("GET", f"/v1/eval/report/plots/{quote(name, safe='')}", lambda r: r.content))

    async def health(self) -> wire.Health:
        return await self._send(Call("GET", "/healthz", read_model(wire.Health)))

    async def ready(self) -> wire.Readiness:
        return await self._send(Call("GET", "/readyz", read_model(wire.Readiness), accept=(503,)))
