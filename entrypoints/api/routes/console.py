"""The search console: ``GET /`` (one HTML page) and its assets under ``/console/``, shipped in the package
(``entrypoints/api/console/``), no build step, nothing fetched from elsewhere.

The page and its assets hold no data, so they load without the API key; the page then calls the same public
JSON routes any client calls (/v1/status, /v1/search, /v1/documents, /v1/jobs, /v1/eval/report), which stay
behind the key. The Content-Security-Policy allows this origin only: a page that tried to load a font or a
script from elsewhere would be refused by the browser.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from entrypoints.api.auth import requires
from entrypoints.api.errors import ApiError

ASSET_DIR = Path(__file__).resolve().parent.parent / "console"
ASSETS = {
    "api.js": "text/javascript; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "sources.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob: data:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'; form-action 'none'",
}

router = APIRouter(include_in_schema=False)


@router.get("/", summary="The search console (HTML)")
@requires("public")
def console_page() -> FileResponse:
    return FileResponse(ASSET_DIR / "index.html", media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/console/{name}", summary="The console's script and style sheet")
@requires("public")
def console_asset(name: str) -> FileResponse:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise ApiError(404, "not_found", f"no console asset {name!r}; the console is at /")
    return FileResponse(ASSET_DIR / name, media_type=media_type, headers=HEADERS)
