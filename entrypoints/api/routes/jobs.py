"""GET /v1/jobs/{job_id}: an ingest job's state, from the one job model (in-process or on workers)."""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Depends

from entrypoints.api import schemas
from entrypoints.api.auth import requires
from entrypoints.api.errors import ApiError
from entrypoints.api.state import ApiState, api_state
from services.jobs import JobNotFound

router = APIRouter(prefix="/v1")  # the prefix on the router itself: route templates (metrics labels) carry it


@router.get("/jobs/{job_id}", response_model=schemas.JobStatus, summary="Progress and per-document failures")
@requires("read")
def get_job(job_id: str, state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", job_id):
        raise ApiError(404, "not_found", f"no job {job_id!r}; job ids are the 'job' field of POST /v1/documents")
    try:
        return state.runtime.jobs.status(job_id)
    except JobNotFound as e:
        raise ApiError(404, "not_found", str(e)) from None
