"""POST /v1/feedback (one judgement of a search hit: relevant or not) and GET /v1/feedback (every judgement of
this server's collection, with counts: the admin's export). The judgements live in the data dir
(``services.feedback``); docs/feedback.md."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool

from dpr_client.wire import FeedbackExport, FeedbackIn, FeedbackOut
from entrypoints.api.auth import requires
from entrypoints.api.state import ApiState, api_state
from services import feedback

router = APIRouter(prefix="/v1")


def _who(request: Request) -> str:
    principal = request.scope.get("state", {}).get("principal")
    return str(getattr(principal, "name", "") or "")


@router.post("/feedback", response_model=FeedbackOut,
             summary="Judge a search hit relevant or not relevant to a question (kept with the collection)")
@requires("write")
async def post_feedback(body: FeedbackIn, request: Request,
                        state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    store = state.runtime.store
    point = str(uuid.UUID(body.point_id)) if body.point_id is not None else None  # the store's form: lower case
    doc_id, chunk = await run_in_threadpool(feedback.resolve, store, point=point, doc_id=body.doc_id,
                                            chunk=body.chunk)

    def record() -> tuple[feedback.Recorded, int]:
        with feedback.FeedbackStore.in_data_dir(state.settings.data_dir) as judgements:
            done = judgements.record(store.alias, body.question, doc_id, chunk, body.relevant, _who(request))
            return done, judgements.counts(store.alias)["judgements"]

    done, total = await run_in_threadpool(record)
    return done.judgement.to_json() | {"outcome": done.outcome, "judgements": total}


@router.get("/feedback", response_model=FeedbackExport,
            summary="Every judgement of this collection, with counts (export)")
@requires("admin")
async def get_feedback(state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    alias = state.runtime.store.alias

    def read() -> dict[str, Any]:
        with feedback.FeedbackStore.in_data_dir(state.settings.data_dir) as judgements:
            return {"collection": alias, "counts": judgements.counts(alias),
                    "judgements": [j.to_json() for j in judgements.judgements(alias)]}

    return await run_in_threadpool(read)
