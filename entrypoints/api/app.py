"""The HTTP API: ``create_app(settings)`` -> a FastAPI app served by uvicorn (``dpr serve``).

Same settings object, same code paths as the CLI:
- POST /v1/documents parses with ``services.readers`` (``parse_json_row`` for JSON batches, ``iter_documents``
  for uploads, exactly as ``dpr ingest`` reads JSONL and files) and hands the items to the job backend:
  ``workers.dispatch.submit_ingest`` with a broker, else ``services.ingest.ingest_documents`` on a background
  thread (``entrypoints.api.jobs``). Either way: 202 and a job id.
- POST /v1/search and DELETE go through ``services.runtime.run_search`` / ``run_delete``, as the CLI does.
One ``Runtime`` per process: the towers load once (in the background at start-up; /readyz waits for them).
Store calls are serialised in this process (a client that is not thread-safe, and the embedded engine's lease
that other processes take turns on, see ``services/store/edge.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import re
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError

from entrypoints.api import schemas
from entrypoints.api.errors import ApiError, install_error_handlers
from entrypoints.api.jobs import BrokerJobs, JobBackend, LocalJobs
from entrypoints.api.metrics import CONTENT_TYPE_LATEST, ApiMetrics
from entrypoints.api.middleware import BodyLimit, HttpMetrics
from services.errors import DocumentError
from services.locks import NoFence
from services.query import QueryOptions
from services.readers import Document, DocumentFailure, Item, iter_documents, parse_json_row
from services.runtime import run_delete, run_search
from services.settings import Settings

log = logging.getLogger(__name__)

UPLOAD_FORMATS = ("auto", "files", "jsonl", "beir")
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": schemas.ErrorResponse, "description": text}
    for code, text in {
        400: "Bad arguments",
        401: "Missing or wrong API key",
        404: "No such collection or document",
        409: "The towers do not match the collection",
        413: "Request too large",
        422: "Malformed request",
        503: "Store or broker unavailable",
    }.items()
}


# --- the parts one API process shares -------------------------------------------------------------------------


class SerializedStore:
    """The runtime's store behind one lock; ``upsert`` is timed into ``dpr_upsert_seconds``."""

    def __init__(self, store: Any, metrics: ApiMetrics) -> None:
        self._store = store
        self._metrics = metrics
        self._lock = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                if name != "upsert":
                    return attr(*args, **kwargs)
                t0 = time.perf_counter()
                try:
                    return attr(*args, **kwargs)
                finally:
                    self._metrics.upsert_seconds.observe(time.perf_counter() - t0)

        return call


class ApiServices:
    """A ``services.runtime.Runtime`` (or a test double with ``towers``, ``sparse``, ``store``, ``close``)
    made safe to share between request threads and the ingest thread."""

    def __init__(self, runtime: Any, metrics: ApiMetrics) -> None:
        self.runtime = runtime
        self.metrics = metrics
        self._load_lock = threading.Lock()
        self._store: SerializedStore | None = None
        self._by_fingerprint: dict[str, Any] = {}
        self.model_error: str | None = None
        self.model_ready = threading.Event()

    @property
    def towers(self) -> Any:
        with self._load_lock:
            return self.runtime.towers

    @property
    def sparse(self) -> Any:
        with self._load_lock:
            return self.runtime.sparse

    @property
    def store(self) -> Any:
        with self._load_lock:
            if self._store is None:
                self._store = SerializedStore(self.runtime.store, self.metrics)
            return self._store

    @property
    def fence(self) -> Any:
        """The collection's write fence (held shared by writes; a re-embed swap takes it exclusive)."""
        with self._load_lock:
            fence = getattr(self.runtime, "fence", None)
        return fence if fence is not None else NoFence()

    def towers_for(self, fingerprint: str) -> Any:
        """The towers that built the active generation (after a re-embed or rollback), loaded once per model."""
        with self._load_lock:
            towers = self._by_fingerprint.get(fingerprint)
            if towers is None:
                load = getattr(self.runtime, "towers_for", None)
                towers = load(fingerprint) if load is not None else self.runtime.towers
                self._by_fingerprint = {fingerprint: towers}  # keep one extra model at most
            return towers

    def warm(self) -> None:
        """Load the towers (and touch the model) once, so the first search does not pay for it."""
        try:
            towers = self.towers
            towers.encode_queries(["warm up"], batch_size=1)
            _ = self.sparse
        except Exception as e:  # reported by /readyz; searches will raise the real error
            log.exception("loading the towers failed")
            self.model_error = f"{type(e).__name__}: {e}"
        finally:
            self.model_ready.set()

    def close(self) -> None:
        try:
            self.runtime.close()
        except Exception:  # shutting down: say so and go on
            log.exception("closing the runtime failed")


# --- request helpers ------------------------------------------------------------------------------------------


def _parse_batch(body: schemas.DocumentsIn, max_bytes: int) -> list[Item]:
    """The JSON batch, row by row, through the JSONL row parser ``dpr ingest`` uses."""
    items: list[Item] = []
    for i, doc in enumerate(body.documents):
        row: dict[str, Any] = {"id": doc.id, "text": doc.text, "title": doc.title, "metadata": doc.metadata}
        source = f"request.documents[{i}]"
        try:
            items.append(parse_json_row(json.dumps(row, ensure_ascii=False), source, max_bytes, source_name="api"))
        except DocumentError as e:
            items.append(DocumentFailure.from_error(e))
    return items


_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _safe_filename(name: str | None) -> str:
    base = Path(name or "").name
    base = _SAFE_NAME.sub("_", base).strip("._") or "upload.txt"
    return base[:200]


def _parse_upload(data: bytes, filename: str, fmt: str, max_bytes: int) -> list[Item]:
    """An uploaded file, read by ``iter_documents`` as ``dpr ingest FILE --format FMT`` would read it."""
    with tempfile.TemporaryDirectory(prefix="dpr-upload-") as tmp:
        path = Path(tmp) / filename
        path.write_bytes(data)
        prefix = tmp + "/"
        out: list[Item] = []
        for item in iter_documents([path], fmt=fmt, max_bytes=max_bytes):  # type: ignore[arg-type]
            if isinstance(item, Document):
                out.append(dataclasses.replace(item, source=f"upload:{filename}"))
            else:
                out.append(
                    dataclasses.replace(item, source=item.source.replace(prefix, "upload:"))  # type: ignore[arg-type]
                )
                if isinstance(item, DocumentFailure):
                    out[-1] = dataclasses.replace(out[-1], error=item.error.replace(prefix, "upload:"))  # type: ignore
        return out


def _hits_json(hits: list[Any]) -> list[dict[str, Any]]:
    return [h.to_json() for h in hits]


# --- the app ------------------------------------------------------------------------------------------------


def create_app(
    settings: Settings,
    runtime: Any | None = None,
    jobs: JobBackend | None = None,
    warm_model: bool = True,
) -> FastAPI:
    """The API over one ``Settings``. ``runtime`` and ``jobs`` default to the real ones (tests pass doubles)."""
    if runtime is None:
        from services.runtime import Runtime

        runtime = Runtime(settings)
    metrics = ApiMetrics()
    services = ApiServices(runtime, metrics)
    if jobs is None:
        jobs = BrokerJobs(settings) if settings.broker_url else LocalJobs(
            settings, services, on_batch=metrics.observe_ingest
        )
    metrics.set_queue_depth_source(jobs.pending)
    probe_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dpr-probe")
    limits = settings.api

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if warm_model:
            threading.Thread(target=services.warm, name="dpr-warm", daemon=True).start()
        else:
            services.model_ready.set()
        try:
            yield
        finally:
            await run_in_threadpool(jobs.close)
            probe_pool.shutdown(wait=False, cancel_futures=True)
            await run_in_threadpool(services.close)

    app = FastAPI(
        title="dpr-ingest",
        version="0.1.0",
        summary="Dense passage retrieval: ingest documents with a DPR passage tower, search with the question tower.",
        lifespan=lifespan,
        responses={},
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.services = services
    app.state.jobs = jobs
    install_error_handlers(app)
    # Outermost first: metrics see every response, including 413s from the body limit.
    app.add_middleware(BodyLimit, max_bytes=limits.max_request_bytes)
    app.add_middleware(HttpMetrics, metrics=metrics)

    router = APIRouter(prefix="/v1", dependencies=_auth_dependencies(settings), responses=ERROR_RESPONSES)

    @router.post(
        "/documents",
        status_code=202,
        response_model=schemas.JobAccepted,
        summary="Ingest a batch of documents (JSON) or one uploaded file (multipart); returns a job id",
        openapi_extra={"requestBody": _documents_request_body()},
    )
    async def post_documents(request: Request) -> JSONResponse:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type == "application/json":
            raw = await request.body()
            try:
                batch = schemas.DocumentsIn.model_validate_json(raw)
            except ValidationError as e:
                from fastapi.exceptions import RequestValidationError

                raise RequestValidationError(
                    [dict(err, loc=("body", *err.get("loc", ()))) for err in e.errors(include_context=False)]
                ) from None
            if len(batch.documents) > limits.max_documents:
                raise _too_many(len(batch.documents), limits.max_documents)
            items = await run_in_threadpool(_parse_batch, batch, settings.max_document_bytes)
        elif content_type == "multipart/form-data":
            items = await _read_upload(request, settings)
        else:
            raise ApiError(
                415, "unsupported_media_type",
                f"Content-Type {content_type or '(none)'!r} is not accepted; send application/json "
                "({\"documents\": [...]}) or multipart/form-data with a 'file' field",
            )
        if len(items) > limits.max_documents:
            raise _too_many(len(items), limits.max_documents)
        accepted = await run_in_threadpool(jobs.submit, items)
        metrics.jobs.labels(jobs.executor).inc()
        job_id = str(accepted.get("job"))
        body = dict(accepted) | {
            "job": job_id,
            "state": str(accepted.get("state") or "queued"),
            "documents_received": len(items),
            "status_url": f"/v1/jobs/{job_id}",
        }
        return JSONResponse(body, status_code=202, headers={"Location": f"/v1/jobs/{job_id}"})

    @router.get("/jobs/{job_id}", response_model=schemas.JobStatus, summary="Progress and per-document failures")
    def get_job(job_id: str) -> dict[str, Any]:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", job_id):
            raise ApiError(404, "not_found", f"no job {job_id!r}; job ids are the 'job' field of POST /v1/documents")
        record = jobs.get(job_id)
        if record is None:
            raise ApiError(
                404, "not_found",
                f"no job {job_id!r}; it never existed here or has expired (job state is kept for recent jobs only)",
            )
        return record

    @router.post("/search", response_model=schemas.SearchOut, summary="Question tower -> passages")
    def post_search(body: schemas.SearchIn) -> dict[str, Any]:
        options = QueryOptions(
            k=body.k,
            mode=body.mode,
            filters=dict(body.filters),
            fusion=body.fusion,
            rrf_k=body.rrf_k,
            linear_weight=body.linear_weight,
            candidates=body.candidates,
        )
        t0 = time.perf_counter()
        with metrics.time_query(body.mode or "default"):
            hits = run_search(services, body.question, options)
        return {"hits": _hits_json(hits), "took_ms": round((time.perf_counter() - t0) * 1000, 3)}

    @router.delete(
        "/documents/{doc_id:path}", response_model=schemas.DeleteOut, summary="Delete a document and its passages"
    )
    def delete_document(doc_id: str) -> dict[str, Any]:
        if not doc_id or len(doc_id) > 512:
            raise ApiError(404, "not_found", "no such document; ids are 1-512 characters")
        removed = run_delete(services, [doc_id])
        if removed == 0:
            raise ApiError(404, "not_found", f"document {doc_id!r} has no passages in collection "
                           f"{settings.collection!r}; check the id (GET a search hit's doc_id)")
        return {"doc_id": doc_id, "points_deleted": removed}

    app.include_router(router)

    @app.get("/healthz", response_model=schemas.Health, summary="Liveness: the process answers")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz", response_model=schemas.Readiness, summary="Readiness: model loaded, broker and store reachable",
        responses={503: {"model": schemas.Readiness, "description": "Not ready"}},
    )
    async def readyz() -> JSONResponse:
        checks: dict[str, dict[str, Any]] = {}
        timeout = limits.ready_timeout
        if services.model_error:
            checks["model"] = {"ok": False, "error": services.model_error}
        else:
            checks["model"] = {"ok": services.model_ready.is_set()} | (
                {} if services.model_ready.is_set() else {"error": "the towers are still loading"}
            )
        checks["store"] = await _probe(probe_pool, lambda: _store_check(services), timeout, "store")
        if settings.broker_url:
            checks["broker"] = await _probe(probe_pool, lambda: _broker_check(settings, timeout), timeout, "broker")
        ok = all(c["ok"] for c in checks.values())
        body = {"status": "ready" if ok else "not_ready", "checks": checks}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    def metrics_route() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _too_many(n: int, limit: int) -> ApiError:
    return ApiError(
        413, "too_large", f"{n:,} documents in one request is over the limit of {limit:,}; split the batch or raise "
        "DPR_API__MAX_DOCUMENTS",
    )


async def _read_upload(request: Request, settings: Settings) -> list[Item]:
    try:
        form = await request.form(max_files=1, max_fields=8, max_part_size=settings.api.max_request_bytes)
    except Exception as e:  # malformed multipart: starlette raises its own errors
        raise ApiError(400, "bad_request", f"cannot read the multipart body ({e}); send a 'file' field") from None
    try:
        upload = form.get("file")
        fmt = form.get("format") or "auto"
        if upload is None or isinstance(upload, str):
            raise ApiError(422, "validation", "multipart body has no 'file' field with a file in it; add one")
        if not isinstance(fmt, str) or fmt not in UPLOAD_FORMATS:
            raise ApiError(422, "validation", f"format {fmt!r} is not known; use one of {', '.join(UPLOAD_FORMATS)}")
        data = await upload.read()
        filename = _safe_filename(upload.filename)
    finally:
        await form.close()
    if not data:
        raise ApiError(422, "validation", f"uploaded file {filename!r} is empty; send a file with content")
    if fmt == "auto" and not filename.lower().endswith((".jsonl", ".jsonl.gz", ".ndjson", ".txt", ".md", ".markdown",
                                                        ".rst", ".html", ".htm")):
        raise ApiError(
            422, "validation",
            f"cannot tell the type of {filename!r}; name it .jsonl (one JSON document per line) or .txt/.md/.rst/"
            ".html, or pass format=jsonl|files",
        )
    try:
        return await run_in_threadpool(_parse_upload, data, filename, fmt, settings.max_document_bytes)
    except DocumentError:
        raise
    except (ValueError, OSError) as e:
        raise ApiError(422, "validation", f"cannot read the uploaded file {filename!r}: {e}") from None


def _auth_dependencies(settings: Settings) -> list[Any]:
    secret = settings.api.api_key
    if secret is None:
        return []
    expected = secret.get_secret_value().encode()
    header = APIKeyHeader(name="X-API-Key", auto_error=False, description="The API key (DPR_API__API_KEY).")
    bearer = HTTPBearer(auto_error=False, description="The API key as a bearer token.")

    # Defaults, not Annotated: with postponed annotations FastAPI could not see these local schemes.
    def require_key(
        key: str | None = Security(header),  # noqa: B008
        credentials: HTTPAuthorizationCredentials | None = Security(bearer),  # noqa: B008
    ) -> None:
        given = key or (credentials.credentials if credentials is not None else None)
        if given is None or not hmac.compare_digest(given.encode(), expected):
            raise ApiError(
                401, "unauthorized",
                "missing or wrong API key; send it as header 'X-API-Key: KEY' or 'Authorization: Bearer KEY'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return [Security(require_key)]


async def _probe(pool: ThreadPoolExecutor, check: Callable[[], dict[str, Any]], timeout: float,
                 what: str) -> dict[str, Any]:
    try:
        return await asyncio.wait_for(asyncio.wrap_future(pool.submit(check)), timeout)
    except TimeoutError:
        return {"ok": False, "error": f"{what} did not answer within {timeout:g} s"}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def _store_check(services: ApiServices) -> dict[str, Any]:
    info = services.store.info()
    return {"ok": True, "backend": info.backend, "collection": info.alias, "exists": info.active is not None,
            "points": info.active.count if info.active else 0}


def _broker_check(settings: Settings, timeout: float) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(str(settings.broker_url), socket_connect_timeout=timeout, socket_timeout=timeout)
    try:
        client.ping()
    finally:
        client.close()
    return {"ok": True}


def _documents_request_body() -> dict[str, Any]:
    return {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/DocumentsIn"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary",
                                 "description": "A .jsonl file (one {id, text, title?} per line) or one text file "
                                 "(.txt .md .rst .html)."},
                        "format": {"type": "string", "enum": list(UPLOAD_FORMATS), "default": "auto"},
                    },
                }
            },
        },
    }


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    extra = schemas.DocumentsIn.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in extra.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components["DocumentsIn"] = extra
    app.openapi_schema = schema
    return schema


# --- serving ----------------------------------------------------------------------------------------------------

SERVE_IDLE_RELEASE = 5.0
SERVE_TORCH_THREADS = 1


def serving_settings(settings: Settings) -> Settings:
    """Settings for a long-running API process; an explicitly set value (DPR_...) always wins.

    - ``encoder.threads`` 1: a server gets its parallelism from concurrent requests; torch's intra-op threads on
      a one-question batch only add barrier waits, and on a busy machine they make a question encode ~10x
      slower (measured: p50 24 ms with 1 thread vs 170-280 ms with 2, load average 15 on 2 cores).
    - ``edge.idle_release`` 5 s: the embedded store's lease closes the shard after ``idle_release`` idle seconds
      (default 0.5, right for short commands), and reopening a 50k-passage shard costs 0.4-0.7 s, which a
      server with requests more than 0.5 s apart would pay on most searches. Other processes still get their
      turn (the lease yields to a waiter after a fair share, or when the API is idle for 5 s).
    """
    updates: dict[str, Any] = {}
    if "threads" not in settings.encoder.model_fields_set:
        updates["encoder"] = settings.encoder.model_copy(update={"threads": SERVE_TORCH_THREADS})
    if settings.store_backend == "edge" and "idle_release" not in settings.edge.model_fields_set:
        updates["edge"] = settings.edge.model_copy(update={"idle_release": SERVE_IDLE_RELEASE})
    return settings.model_copy(update=updates) if updates else settings


def app_from_env() -> FastAPI:
    """``uvicorn --factory entrypoints.api.app:app_from_env``: settings from the environment (DPR_*), as the CLI."""
    return create_app(serving_settings(Settings()))

