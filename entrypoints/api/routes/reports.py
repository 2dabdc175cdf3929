"""GET /v1/eval/report: the latest evaluation report of the data dir (``dpr eval --report`` keeps a copy under
``DATA_DIR/reports/latest``), and GET /v1/eval/report/plots/{name}: its PNG plots. Read-only."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse

from dpr_client.wire import EvalReport
from entrypoints.api.auth import requires
from entrypoints.api.errors import ApiError
from entrypoints.api.state import ApiState, api_state
from services.latest_report import LatestReport, latest_dir, read_latest

router = APIRouter(prefix="/v1")  # the prefix on the router itself: route templates (metrics labels) carry it


async def _latest(state: ApiState) -> LatestReport:
    report = await run_in_threadpool(read_latest, state.settings)
    if report is None:
        raise ApiError(
            404, "not_found",
            f"no evaluation report in {latest_dir(state.settings)}; run `dpr eval DATA --report DIR` with this "
            "data dir (it keeps a copy of the newest report there)",
        )
    return report


@router.get("/eval/report", response_model=EvalReport,
            summary="The latest `dpr eval --report` of this data dir: metrics per system, plots")
@requires("read")
async def get_report(state: ApiState = Depends(api_state)) -> dict[str, Any]:  # noqa: B008
    report = await _latest(state)
    body = report.to_json()
    for plot in body["plots"]:
        plot["url"] = f"/v1/eval/report/plots/{plot['name']}"
    return body


@router.get(
    "/eval/report/plots/{name}", summary="One plot of the latest evaluation report (PNG)", response_class=FileResponse,
    responses={200: {"content": {"image/png": {}}}},
)
@requires("read")
async def get_plot(name: str, state: ApiState = Depends(api_state)) -> FileResponse:  # noqa: B008
    report = await _latest(state)
    path = report.plot(name)
    if path is None:
        raise ApiError(404, "not_found", f"the latest report has no plot {name!r}; its plots: "
                       f"{', '.join(report.plots) or 'none'}")
    return FileResponse(path, media_type="image/png", headers={"Cache-Control": "no-cache"})
