"""POST /v1/documents (a JSON batch or one uploaded file) and DELETE /v1/documents/{doc_id}.

Parsing goes through ``services.documents`` exactly as ``dpr ingest`` reads JSONL rows and files; the items go
to the executor the settings chose (in-process on a background thread, or Celery workers): 202 and a job id.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from entrypoints.api import schemas
from entrypoints.api.errors import ApiError
from entrypoints.api.state import ApiState, api_state
from services.documents import Document, DocumentFailure, Item, iter_documents, parse_json_row
from services.errors import DocumentError
from services.settings import Settings

UPLOAD_FORMATS = ("auto", "files", "jsonl", "beir")

router = APIRouter(prefix="/v1")  # the prefix on the router itself: route templates (metrics labels) carry it


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




@router.post(
    "/documents",
    status_code=202,
    response_model=schemas.JobAccepted,
    summary="Ingest a batch of documents (JSON) or one uploaded file (multipart); returns a job id",
    openapi_extra={"requestBody": _documents_request_body()},
)
async def post_documents(request: Request) -> JSONResponse:
    state = api_state(request)
    settings, limits = state.settings, state.settings.api
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
    accepted = await run_in_threadpool(
        lambda: state.executor.submit(items, collection=settings.collection).to_json()
    )
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
def delete_document(doc_id: str, state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    if not doc_id or len(doc_id) > 512:
        raise ApiError(404, "not_found", "no such document; ids are 1-512 characters")
    removed = state.runtime.delete([doc_id])
    if removed == 0:
        raise ApiError(404, "not_found", f"document {doc_id!r} has no passages in collection "
                       f"{state.settings.collection!r}; check the id (GET a search hit's doc_id)")
    return {"doc_id": doc_id, "points_deleted": removed}
