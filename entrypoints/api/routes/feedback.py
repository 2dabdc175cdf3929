"""POST /v1/feedback (one judgement of a search hit: relevant or not) and GET /v1/feedback (every judgement of
this server's collection, with counts: the admin's export). The judgements live in the data dir
(``services.learn.feedback``); docs/feedback.md."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from entrypoints.api.auth import requires
from entrypoints.api.state import ApiState, api_state
from services.learn import feedback

router = APIRouter(prefix="/v1")


class FeedbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=feedback.MAX_QUESTION_CHARS,
                          description="The question the hit answered, as asked.")
    point_id: str | None = Field(default=None, max_length=64, description="The hit's point id; or doc_id (+ chunk).")
    doc_id: str | None = Field(default=None, min_length=1, max_length=feedback.MAX_ID_CHARS,
                               description="The hit's doc_id; with chunk (its chunk_index) it names one passage.")
    chunk: int | None = Field(default=None, ge=0, description="The hit's chunk_index; absent: the whole document.")
    relevant: bool = Field(description="true: the passage answers the question; false: it does not.")


class FeedbackOut(BaseModel):
    collection: str
    question: str
    doc_id: str
    chunk: int | None
    relevant: bool
    judged_at: str = Field(description="When it was judged (UTC, ISO 8601); a repeat keeps the first time.")
    judged_by: str = Field(description="The name of the API key that judged it (empty without keys).")
    outcome: str = Field(description="new, replaced (the same pair was judged the other way) or unchanged (a repeat)")
    judgements: int = Field(description="Judgements of this collection now.")


def _who(request: Request) -> str:
    principal = request.scope.get("state", {}).get("principal")
    return str(getattr(principal, "name", "") or "")


@router.post("/feedback", response_model=FeedbackOut,
             summary="Judge a search hit relevant or not relevant to a question (kept with the collection)")
@requires("write")
async def post_feedback(body: FeedbackIn, request: Request,
                        state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    store = state.runtime.store
    doc_id, chunk = await run_in_threadpool(feedback.resolve, store, point=body.point_id, doc_id=body.doc_id,
                                            chunk=body.chunk)

    def record() -> tuple[feedback.Recorded, int]:
        with feedback.FeedbackStore.in_data_dir(state.settings.data_dir) as judgements:
            done = judgements.record(store.alias, body.question, doc_id, chunk, body.relevant, _who(request))
            return done, judgements.counts(store.alias)["judgements"]

    done, total = await run_in_threadpool(record)
    return done.judgement.to_json() | {"outcome": done.outcome, "judgements": total}


@router.get("/feedback", summary="Every judgement of this collection, with counts (export)")
@requires("admin")
async def get_feedback(state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    alias = state.runtime.store.alias

    def read() -> dict[str, Any]:
        with feedback.FeedbackStore.in_data_dir(state.settings.data_dir) as judgements:
            return {"collection": alias, "counts": judgements.counts(alias),
                    "judgements": [j.to_json() for j in judgements.judgements(alias)]}

    return await run_in_threadpool(read)
