"""`dpr mcp`: the MCP server for agents (``dpr_client.mcp``) over stdio or streamable HTTP, on a running `dpr serve`
(DPR_API_URL). Needs the mcp extra: ``pip install 'dpr-ingest[mcp]'``."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from entrypoints.cli.common import EXIT_USAGE, fail


def mcp(
    ctx: typer.Context,
    transport: Annotated[str, typer.Option(help="stdio (an agent starts this process) or http (streamable HTTP).")]
    = "stdio",
    url: Annotated[str | None, typer.Option(help="The dpr API (default DPR_API_URL, else http://127.0.0.1:8000).")]
    = None,
    host: Annotated[str, typer.Option(help="HTTP: the address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP: the port (the MCP endpoint is /mcp).")] = 8765,
    insecure: Annotated[bool, typer.Option(help="HTTP: listen beyond loopback for an API without keys.")] = False,
) -> None:
    """Serve the collection to agents over MCP: search with citations, a document's passages, status, ingest."""
    if transport not in ("stdio", "http"):
        fail(f"--transport {transport!r} is not known; use stdio or http", code=EXIT_USAGE)
    try:
        from dpr_client import Client, Unauthorized
        from dpr_client.mcp import build, refuse_open_http
    except ModuleNotFoundError as e:
        fail(f"dpr mcp needs the mcp package ({e.name} is missing); install the extra: pip install 'dpr-ingest[mcp]'",
             code=EXIT_USAGE)
    settings = ctx.obj
    key = settings.api.api_key.get_secret_value() if settings.api.api_key is not None else None
    url = url or settings.api_url
    server = build(url, key)
    if transport == "stdio":
        server.run("stdio")
        return
    with Client(url, api_key=key) as probe:  # does the API ask for keys? (a 401: it does)
        try:
            locked = probe.whoami().locked
        except Unauthorized:
            locked = True
    refused = refuse_open_http(host, locked, insecure)
    if refused:
        fail(refused, code=EXIT_USAGE)
    mode: Literal["streamable-http"] = "streamable-http"
    server.run(mode, host=host, port=port)
