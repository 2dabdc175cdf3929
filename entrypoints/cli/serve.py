"""`dpr serve`: the HTTP API under uvicorn, configured by the same Settings object as every other command.

Locked by default (as Redis' protected mode): on an address other than loopback it refuses to start unless API
keys are configured (DPR_API__API_KEY or `dpr keys create`), or the user says ``--insecure`` in so many words.
Slow clients are cut (``entrypoints.api.protocol``): headers within DPR_API__HEADER_TIMEOUT, body chunks within
DPR_API__BODY_TIMEOUT, idle keep-alive DPR_API__KEEP_ALIVE_TIMEOUT, headers at most DPR_API__MAX_HEADER_BYTES.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterator
from typing import Annotated, Any

import typer

from entrypoints.cli.common import cli_errors, console, fail, get_settings
from services.core.settings import Settings


def serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Bind address (default DPR_API__HOST, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default DPR_API__PORT, 8000).")] = None,
    workers: Annotated[
        int | None, typer.Option(help="uvicorn worker processes; each loads the model (default DPR_API__WORKERS).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    insecure: Annotated[bool, typer.Option(
        "--insecure", help="Serve on a non-loopback address without any API key: anyone who can reach the port "
        "may read, write and administer. Without it, `dpr serve` refuses.")] = False,
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
    from services.access import AccessGate

    locked = AccessGate.from_settings(settings).locked
    if not locked and not is_loopback(api.host):
        if not insecure:
            fail(f"refusing to serve on {api.host} without an API key: anyone reaching the port could ingest, delete "
                 "and administer. Set DPR_API__API_KEY (an admin key) or create keys with `dpr keys create --role "
                 "admin`, bind 127.0.0.1, or pass --insecure to serve without keys anyway", code=2)
        console.print(f"[bold yellow]warning:[/] --insecure: serving on {api.host} with no API key; anyone who can "
                      "reach this port may read, write and administer", highlight=False)
    from entrypoints.api.app import serving_settings

    settings = serving_settings(settings.model_copy(update={"api": api}))
    if api.workers > 1 and settings.store_backend == "edge" and not settings.broker_url:
        console.print(
            "[yellow]note:[/] several API workers share the embedded store by taking turns on its lock; "
            "for real concurrency use a Qdrant server (DPR_QDRANT_URL)", highlight=False,
        )
    with cli_errors():
        if api.workers == 1:
            from entrypoints.api.app import create_app

            app = create_app(settings)
            with source_scheduler(app, settings):
                _run(app, settings, log_level)
            return
        # Several processes: uvicorn imports the app factory in each one; what the command line set (--data-dir)
        # travels to them as DPR_* variables.
        os.environ.update({"DPR_DATA_DIR": str(settings.data_dir), "DPR_COLLECTION": settings.collection})
        _run("entrypoints.api.app:app_from_env", settings, log_level, factory=True)


@contextlib.contextmanager
def source_scheduler(app: Any, settings: Settings) -> Iterator[None]:
    """The sources on /metrics; and in the embedded default their schedule, run here beside the API through the
    API's own runtime and ingest executor (services/sources/schedule.py); with a broker the beat does (`dpr beat`)."""
    from entrypoints.api.sources_metrics import SourcesCollector

    app.state.api.metrics.registry.register(SourcesCollector(settings.data_dir))
    if settings.broker_url or not settings.sources.tick_seconds:
        yield
        return
    from services.sources.schedule import SourceScheduler

    state = app.state.api
    scheduler = SourceScheduler(state.runtime, lambda: state.executor, settings.sources.tick_seconds)
    with contextlib.closing(scheduler.start()):
        yield


def is_loopback(host: str) -> bool:
    """Whether ``host`` binds only this machine: 127.0.0.0/8, ::1 or 'localhost' (a name or '' / '0.0.0.0' / '::'
    binds more)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def uvicorn_config(app: Any, settings: Settings, log_level: str = "info", factory: bool = False) -> Any:
    """uvicorn's Config for ``dpr serve``: the guarded h11 protocol and the API group's connection limits."""
    import uvicorn

    from entrypoints.api.protocol import GuardedH11Protocol

    api = settings.api
    config = uvicorn.Config(
        app, host=api.host, port=api.port, workers=api.workers, log_level=log_level, factory=factory,
        http=GuardedH11Protocol, timeout_keep_alive=api.keep_alive_timeout,
        h11_max_incomplete_event_size=api.max_header_bytes,
    )
    config.dpr_header_timeout = api.header_timeout  # type: ignore[attr-defined]  # read by GuardedH11Protocol
    config.dpr_body_timeout = api.body_timeout  # type: ignore[attr-defined]
    return config


def _run(app: Any, settings: Settings, log_level: str, factory: bool = False) -> None:
    """``uvicorn.run`` with our Config (uvicorn.run builds its own and cannot carry the read deadlines)."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    config = uvicorn_config(app, settings, log_level, factory)
    server = uvicorn.Server(config=config)
    with contextlib.suppress(KeyboardInterrupt):
        if config.workers > 1:
            Multiprocess(config, sockets=[config.bind_socket()]).run()
        else:
            server.run()
    if config.workers == 1 and not server.started:
        raise typer.Exit(3)  # as uvicorn.run: the server did not start (its log says why)
