"""`dpr serve`: the HTTP API under uvicorn, configured by the same Settings object as every other command."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from entrypoints.cli.common import cli_errors, console, fail, get_settings
from services.settings import Settings


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Bind address (default DPR_API__HOST, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default DPR_API__PORT, 8000).")] = None,
    workers: Annotated[
        int | None, typer.Option(help="uvicorn worker processes; each loads the model (default DPR_API__WORKERS).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve the HTTP API: POST /v1/documents, GET /v1/jobs/{id}, POST /v1/search, /healthz, /readyz, /metrics."""
    settings = get_settings(ctx)
    api = settings.api.model_copy(
        update={k: v for k, v in {"host": host, "port": port, "workers": workers}.items() if v is not None}
    )
    if not 1 <= api.port <= 65535:
        fail(f"--port {api.port} is out of range; use 1..65535", code=2)
    if api.workers < 1:
        fail(f"--workers {api.workers} must be at least 1", code=2)
    from entrypoints.api.app import serving_settings

    settings = serving_settings(settings.model_copy(update={"api": api}))
    if api.workers > 1 and settings.store_backend == "edge" and not settings.broker_url:
        console.print(
            "[yellow]note:[/] several API workers share the embedded store by taking turns on its lock; "
            "for real concurrency use a Qdrant server (DPR_QDRANT_URL)", highlight=False,
        )
    import uvicorn

    with cli_errors():
        if api.workers == 1:
            from entrypoints.api.app import create_app

            uvicorn.run(create_app(settings), host=api.host, port=api.port, log_level=log_level)
            return
        # Several processes: uvicorn imports the app factory in each one; settings travel as DPR_* variables.
        os.environ.update(_settings_env(settings))
        uvicorn.run(
            "entrypoints.api.app:app_from_env", factory=True, host=api.host, port=api.port, workers=api.workers,
            log_level=log_level,
        )


def _settings_env(settings: Settings) -> dict[str, str]:
    """What the command line may have set (``--data-dir``), as environment variables for worker processes."""
    return {"DPR_DATA_DIR": str(settings.data_dir), "DPR_COLLECTION": settings.collection}
