"""POST /v1/documents (a JSON batch or one uploaded file) and DELETE /v1/documents/{doc_id}.

Parsing goes through ``services.readers`` exactly as ``dpr ingest`` reads JSONL rows and files; the items go
to the executor the settings chose (in-process on a background thread, or Celery workers): 202 and a job id.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from entrypoints.api import schemas
from entrypoints.api.auth import requires
from entrypoints.api.errors import ApiError
from entrypoints.api.state import ApiState, api_state
from entrypoints.api.uploads import UPLOAD_FORMATS, read_upload, split_too_deep, too_deep_failure, too_many
from services.core.errors import DocumentError
from services.ingest.job import IngestJob
from services.ingest.language import LANGUAGE_CHOICES
from services.ingest.sync import SyncScope
from services.readers import MAX_ID_CHARS, DocumentFailure, IdLedger, Item, parse_json_row
from services.readers.records import duplicate

router = APIRouter(prefix="/v1")  # the prefix on the router itself: route templates (metrics labels) carry it


def _parse_batch(body: schemas.DocumentsIn, max_bytes: int) -> list[Item]:
    """The JSON batch, row by row, through the JSONL row parser ``dpr ingest`` uses."""
    items: list[Item] = []
    ledger = IdLedger()  # one id per request, as one input file: the first document under an id wins
    for i, doc in enumerate(body.documents):
        row: dict[str, Any] = {"id": doc.id, "text": doc.text, "title": doc.title, "metadata": doc.metadata}
        source = f"request.documents[{i}]"
        try:
            parsed = parse_json_row(json.dumps(row, ensure_ascii=False), source, max_bytes, source_name="api")
        except DocumentError as e:
            items.append(DocumentFailure.from_error(e))
            continue
        first = ledger.claim(parsed.doc_id, source)
        items.append(parsed if first is None else duplicate(parsed.doc_id, source, first))
    return items


def _validate_batch(raw: bytes) -> tuple[schemas.DocumentsIn, list[int]]:
    """The JSON batch, validated, and the indices of the documents cut out because they nest too deep to parse
    (``uploads.split_too_deep``: they fail on their own, the others are written). JSON may escape lone surrogates
    (``"\\ud800"``), which the fast JSON parser only calls "invalid JSON"; such a body is parsed again with
    ``json`` so the error names the field."""
    try:
        return schemas.DocumentsIn.model_validate_json(raw), []
    except ValidationError as e:
        error = e
    too_deep: list[int] = []
    if any("recursion limit" in str(err.get("msg", "")) for err in error.errors()):
        reduced, too_deep, kept = split_too_deep(raw)
        if too_deep and not kept:
            raise ApiError(422, "validation", f"{too_deep_failure(too_deep[0]).error}; no other document in the "
                           "request") from None
        if too_deep:
            raw = reduced
            try:
                return schemas.DocumentsIn.model_validate_json(raw), too_deep
            except ValidationError as e:
                error = e
    if any(err.get("type") == "json_invalid" for err in error.errors()):
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None
        if data is not None:
            try:
                return schemas.DocumentsIn.model_validate(data), too_deep
            except ValidationError as again:
                error = again
    raise RequestValidationError(
        [dict(err, loc=("body", *err.get("loc", ()))) for err in error.errors(include_context=False)]
    ) from None


def _documents_request_body() -> dict[str, Any]:
    return {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/DocumentsIn"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "additionalProperties": False,  # another field is refused (422): it would be ignored
                    "properties": {
                        "file": {"type": "string", "format": "binary",
                                 "description": "A .jsonl file (one {id, text, title?} per line) or one text file "
                                 "(.txt .md .rst .html)."},
                        "format": {"type": "string", "enum": list(UPLOAD_FORMATS), "default": "auto"},
                        "language": {"type": "string", "enum": list(LANGUAGE_CHOICES), "default": "auto"},
                    },
                }
            },
        },
    }


def _sync_parameter() -> dict[str, Any]:
    """The query as one form-exploded object (``?sync_prefix=docs/&prune=true``), so that its schema can say what
    the server enforces across the two: ``prune`` only with ``sync_prefix`` (``dependentRequired``)."""
    schema = schemas.SyncQuery.model_json_schema()
    schema.pop("additionalProperties", None)  # like every route's query: other parameters are ignored
    schema.pop("title", None)
    return {"name": "sync", "in": "query", "required": False, "style": "form", "explode": True, "schema": schema,
            "description": schema.pop("description", "")}


def sync_query(request: Request) -> schemas.SyncQuery:
    """``?sync_prefix=&prune=`` read as the schema says: ``prune`` is ``true`` or ``false``, nothing else."""
    raw: dict[str, Any] = {}
    for name in ("sync_prefix", "prune"):
        values = request.query_params.getlist(name)
        if values:
            raw[name] = values[-1]
    if "prune" in raw:
        raw["prune"] = {"true": True, "false": False}.get(raw["prune"], raw["prune"])
    try:
        return schemas.SyncQuery.model_validate(raw)
    except ValidationError as e:
        raise RequestValidationError(
            [dict(err, loc=("query", *err.get("loc", ()))) for err in e.errors(include_url=False)]
        ) from None


@router.post(
    "/documents",
    status_code=202,
    response_model=schemas.JobAccepted,
    summary="Ingest a batch of documents (JSON) or one uploaded file (multipart); returns a job id",
    openapi_extra={"requestBody": _documents_request_body(), "parameters": [_sync_parameter()]},
    responses={202: {"headers": {"Location": {"description": "The job's status URL", "schema": {"type": "string"}}}}},
)
@requires("write")
async def post_documents(request: Request) -> JSONResponse:
    state = api_state(request)
    query = sync_query(request)
    sync_prefix, prune = query.sync_prefix, bool(query.prune)
    settings, limits = state.settings, state.settings.api
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        batch, too_deep = _validate_batch(await request.body())
        if len(batch.documents) + len(too_deep) > limits.max_documents:  # the schema's maxItems: 422
            raise ApiError(422, "validation", too_many(limits.max_documents).message)
        items = await run_in_threadpool(_parse_batch, batch, settings.max_document_bytes)
        for index in too_deep:  # each in its place: request.documents[i] names it
            items.insert(index, too_deep_failure(index))
        language: str = batch.language
    elif content_type == "multipart/form-data":
        items = await read_upload(request, settings, to_workers=state.executor.name == "broker")  # workers parse
        language = str((await request.form()).get("language") or "auto")  # the parsed form, cached by starlette
    else:
        raise ApiError(
            415, "unsupported_media_type",
            f"Content-Type {content_type or '(none)'!r} is not accepted; send application/json "
            "({\"documents\": [...]}) or multipart/form-data with a 'file' field",
        )
    job = IngestJob(state.runtime, lambda: items, language=language, prune=prune,
                    scope=SyncScope.of_prefix(sync_prefix) if sync_prefix else None)
    accepted = await run_in_threadpool(job.run, state.executor)
    state.metrics.jobs.labels(state.executor.name).inc()
    job_id = str(accepted.get("job"))
    body = dict(accepted) | {
        "job": job_id,
        "state": str(accepted.get("state") or "queued"),
        "documents_received": len(items),
        "status_url": f"/v1/jobs/{job_id}",
    }
    return JSONResponse(body, status_code=202, headers={"Location": f"/v1/jobs/{job_id}"})


@router.delete(
    "/documents/{doc_id:path}", response_model=schemas.DeleteOut, summary="Delete a document and its passages"
)
@requires("write")
def delete_document(doc_id: str, state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    if not doc_id or len(doc_id) > MAX_ID_CHARS:
        raise ApiError(404, "not_found", f"no such document; ids are 1-{MAX_ID_CHARS} characters")
    removed = state.runtime.delete([doc_id])
    if removed == 0:
        raise ApiError(404, "not_found", f"document {doc_id!r} has no passages in collection "
                       f"{state.settings.collection!r}; check the id (GET a search hit's doc_id)")
    return {"doc_id": doc_id, "points_deleted": removed}
