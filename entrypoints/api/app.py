"""The HTTP API: ``create_app(settings)`` -> a FastAPI app served by uvicorn (``dpr serve``).

Same settings object, same code paths as the CLI: one ``services.runtime.Runtime`` per process (store calls
serialised; the towers load once, in the background at start-up, and /readyz waits for them; concurrent questions
share question-tower calls through the process's ``services.serving.QuestionBatcher``) and the executor
``entrypoints.compose.executor_for`` picks (in-process on a background thread, or Celery workers), so
POST /v1/documents, GET /v1/jobs, POST /v1/search and DELETE run what ``dpr ingest``, ``dpr jobs``, ``dpr query``
and ``dpr delete`` run. Routes live in ``entrypoints.api.routes``, one module per resource. The embedded
engine's lease that other processes take turns on is ``services/store/edge/lease.py``.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.utils import get_openapi

from entrypoints.api import schemas
from entrypoints.api.admission import Admission
from entrypoints.api.auth import access_of, flat_routes, security_schemes
from entrypoints.api.errors import install_error_handlers
from entrypoints.api.methods import HttpMethods
from entrypoints.api.metrics import ApiMetrics
from entrypoints.api.middleware import AccessControl, BodyLimit, HttpMetrics
from entrypoints.api.routes import (
    access,
    console,
    documents,
    feedback,
    health,
    jobs,
    reports,
    search,
    snapshots,
    sources,
    status,
)
from entrypoints.api.state import ApiState
from entrypoints.compose import executor_for
from services.access import AccessGate
from services.core.settings import Settings
from services.runtime import Runtime
from services.serving import QuestionBatcher


def _error(text: str, **headers: str) -> dict[str, Any]:
    response: dict[str, Any] = {"model": schemas.ErrorResponse, "description": text}
    if headers:
        response["headers"] = {name: {"description": about, "schema": {"type": "string"}}
                               for name, about in headers.items()}
    return response


# Every status a /v1 route may answer beside its own, each with the one error shape (and the headers it always has).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _error("Bad arguments the schema cannot state (the message names the field and the fix)"),
    401: _error("Missing, wrong or revoked API key",
                **{"WWW-Authenticate": "How to send a key: Bearer (or the X-API-Key header)"}),
    403: _error("The key's role or collections do not allow this route (the message names the role it needs)"),
    404: _error("No such collection, document, job, key or report"),
    409: _error("The towers do not match the collection (model_mismatch), or the collection as it is cannot serve a "
                 "well-formed request (conflict: a mode without its vectors, no reranker, another language)"),
    413: _error("Request body over DPR_API__MAX_REQUEST_BYTES, or an upload with too many documents"),
    415: _error("A Content-Type the route does not take"),
    422: _error("The request does not match its schema (the message names the field and the fix)"),
    429: _error("Over the key's rate limit", **{"Retry-After": "Seconds to wait"}),
    503: _error("Store or broker unavailable, or the server at capacity", **{"Retry-After": "Seconds to wait"}),
}


def create_app(
    settings: Settings,
    runtime: Runtime | None = None,
    warm_model: bool = True,
) -> FastAPI:
    """The API over one ``Settings``. ``runtime`` defaults to the real one (tests pass a ``Runtime`` over fake towers
    and an in-process store)."""
    runtime = runtime or Runtime(settings, serialize_store=True)
    metrics = ApiMetrics()
    runtime.use_batcher(QuestionBatcher.from_settings(settings.serving, on_batch=metrics.observe_question_batch,
                                                      on_cache=metrics.observe_question_cache))
    executor = executor_for(runtime, background=True, on_batch=metrics.observe_ingest)
    metrics.set_queue_depth_source(executor.pending)
    gate = AccessGate.from_settings(settings)
    state = ApiState(settings=settings, runtime=runtime, executor=executor, metrics=metrics, gate=gate)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.own_store()
        if warm_model:
            threading.Thread(target=state.warm, name="dpr-warm", daemon=True).start()
        else:
            state.model_ready.set()
        try:
            yield
        finally:
            await run_in_threadpool(state.close)

    app = FastAPI(
        title="dpr-ingest",
        version="0.1.0",
        summary="Dense passage retrieval: ingest documents with a DPR passage tower, search with the question tower.",
        lifespan=lifespan,
        responses={},
    )
    app.state.api = state
    install_error_handlers(app)
    # Added innermost first: metrics see every response (401/403/429 from access control, 413 from the body
    # limit); access control answers before the body is read.
    app.add_middleware(BodyLimit, max_bytes=settings.api.max_request_bytes)
    app.add_middleware(Admission, max_in_flight=settings.api.max_in_flight, max_queue=settings.api.max_queue,
                       queue_timeout=settings.api.queue_timeout)  # after access control: 503 + Retry-After
    app.add_middleware(AccessControl, routes=app.router.routes, gate=gate, collection=settings.collection,
                       public_paths=public_paths(app))
    app.add_middleware(HttpMethods, routes=app.router.routes)  # 405 + Allow, OPTIONS, HEAD: before access control
    app.add_middleware(HttpMetrics, metrics=metrics)
    # Every route declares its role with @requires (entrypoints.api.auth); an undeclared one is admin-only.
    for module in (documents, jobs, search, status, reports, access, feedback, snapshots, sources):
        app.include_router(module.router, responses=ERROR_RESPONSES)
    app.include_router(health.router)
    app.include_router(console.router)  # the page and its assets hold no data: public (the routes it calls are not)
    served: dict[bool, dict[str, Any]] = {}
    app.openapi = lambda: openapi_document(app, gate.locked, served)  # type: ignore[method-assign]
    return app


def openapi_document(app: FastAPI, locked: bool, cache: dict[bool, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The schema this server serves at /openapi.json: the contract it enforces. It says this server's limits
    (``DPR_API__MAX_DOCUMENTS`` as ``maxItems``) and whether it asks for keys: with keys (``locked``) every
    non-public operation names the two ways to send one; without, none does (the server serves everyone, and
    refuses to make the first key over HTTP). Built once per state (``cache``): a key made with `dpr keys create`
    while the server runs locks it, and the schema follows."""
    if cache is not None and locked in cache:
        return cache[locked]
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    extra = schemas.DocumentsIn.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in extra.pop("$defs", {}).items():
        components.setdefault(name, definition)
    extra["properties"]["documents"]["maxItems"] = api_state_of(app).settings.api.max_documents
    components["DocumentsIn"] = extra
    _document_access(app, schema, locked)
    if cache is not None:
        cache[locked] = schema
    return schema


def api_state_of(app: FastAPI) -> ApiState:
    """The ``ApiState`` ``create_app`` put on ``app`` (its settings say the server's limits)."""
    state = app.state.api
    assert isinstance(state, ApiState)
    return state


def public_paths(app: FastAPI) -> frozenset[str]:
    """FastAPI's own schema and docs pages: public (they describe the API, they hold no data)."""
    paths = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url}
    return frozenset(p for p in paths if p)


def _document_access(app: FastAPI, schema: dict[str, Any], locked: bool) -> None:
    """Each operation says the role it needs (``x-dpr-role``) and, unless public or the server has no keys, how
    to send a key."""
    schema["components"]["securitySchemes"] = security_schemes()
    public = public_paths(app)
    for route in flat_routes(app.routes):
        path = getattr(route, "path_format", None) or getattr(route, "path", None)  # {doc_id}, not {doc_id:path}
        methods = getattr(route, "methods", None) or ()
        for method in methods:
            operation = schema.get("paths", {}).get(path, {}).get(method.lower())
            if operation is None:
                continue
            needs = access_of(route, public)
            operation["x-dpr-role"] = needs.role
            if not needs.public and locked:
                operation["security"] = [{"APIKeyHeader": []}, {"HTTPBearer": []}]


# --- serving ----------------------------------------------------------------------------------------------------

SERVE_TORCH_THREADS = 1
SERVE_IDLE_RELEASE = 3600.0  # seconds dpr serve keeps its shard open after the last question (serving_settings)


def serving_settings(settings: Settings) -> Settings:
    """Settings for a long-running API process; an explicitly set value (DPR_...) always wins.

    - ``encoder.threads`` 1: a server gets its parallelism from concurrent requests; torch's intra-op threads on
      a one-question batch only add barrier waits, and on a busy machine they make a question encode ~10x
      slower (measured: p50 24 ms with 1 thread vs 170-280 ms with 2, load average 15 on 2 cores).

    - ``edge.idle_release`` an hour (``SERVE_IDLE_RELEASE``): the first question after a quiet spell would wait for
      the shard's load (0.4-0.7 s at 50k passages, 7-8 s at 1M). Keeping it open costs the others nothing: the
      lease hands ``G.lock`` to a waiting process ~10 ms after the last request, and the shard is closed as soon as
      another process waits to load it (``G.open``, services/store/edge/lease.py).
    """
    update: dict[str, Any] = {}
    if "threads" not in settings.encoder.model_fields_set:
        update["encoder"] = settings.encoder.model_copy(update={"threads": SERVE_TORCH_THREADS})
    if not settings.qdrant_url and "idle_release" not in settings.edge.model_fields_set:
        update["edge"] = settings.edge.model_copy(update={"idle_release": SERVE_IDLE_RELEASE})
    return settings.model_copy(update=update) if update else settings


def app_from_env() -> FastAPI:
    """``uvicorn --factory entrypoints.api.app:app_from_env``: settings from the environment (DPR_*), as the CLI."""
    return create_app(serving_settings(Settings()))

