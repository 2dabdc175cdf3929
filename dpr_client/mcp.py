"""`dpr mcp`: an MCP server (the ``mcp`` SDK; ``pip install 'dpr-ingest[mcp]'``) for agents, on ``dpr_client``.

It sits on the client: every tool is a call to a running `dpr serve` (``url``: ``--url`` or DPR_API_URL), so it
holds no model and no store, and the API's keys and roles decide what each caller may do. Over stdio the key is the
server's own (``--api-key`` or DPR_API__API_KEY); over streamable HTTP each request's own ``X-API-Key`` or
``Authorization: Bearer`` is forwarded, so a read key searches and only a write key ingests. A refusal (401, 403,
404, 429 after retries...) is a tool error with the API's message, never a traceback.

Tools: ``search`` (passages with the citation a person can check: document, page, heading), ``passages`` (one
document's passages in order), ``status``, and ``ingest`` (a file or folder on this machine, uploaded file by file:
needs a write key).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from dpr_client.client import AsyncClient
from dpr_client.errors import ApiError
from dpr_client.wire import FilterValue, HitOut

Question = Annotated[str, Field(min_length=1, max_length=4000, description="What to find, in plain words.")]
INSTRUCTIONS = ("Search a collection of documents by meaning. Quote the citation of each passage you use "
                "(document, page, heading), so a person can check it.")


def _found(hit: HitOut) -> dict[str, Any]:
    return hit.model_dump(include={"doc_id", "title", "page", "page_end", "heading", "chunk_index"},
                          exclude_none=True) | {"citation": hit.citation(), "score": round(hit.score, 4),
                                                "text": hit.text}


def build(url: str | None = None, api_key: str | None = None) -> MCPServer:
    """The MCP server over the dpr API at ``url``; ``api_key``: the key when a request brings none (stdio)."""
    server = MCPServer("dpr", instructions=INSTRUCTIONS)

    def client(ctx: Context) -> AsyncClient:
        headers = ctx.headers or {}
        bearer = headers.get("authorization", "")
        key = headers.get("x-api-key") or (bearer[7:] if bearer.lower().startswith("bearer ") else None)
        return AsyncClient(url, api_key=key if ctx.headers is not None else api_key)

    async def call(ctx: Context, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            async with client(ctx) as dpr:
                return await getattr(dpr, method)(*args, **kwargs)
        except (ApiError, TimeoutError, OSError) as e:  # a refusal, a job still running, a file it cannot read
            raise ToolError(str(e)) from None

    @server.tool(description="Search the collection: the passages that answer a question, best first, each with "
                 "its citation (document, page, heading) and score.")
    async def search(ctx: Context, question: Question, k: Annotated[int, Field(ge=1, le=50)] = 5,
                     mode: Literal["dense", "sparse", "hybrid"] | None = None,
                     filters: dict[str, FilterValue] | None = None) -> dict[str, Any]:
        answer = await call(ctx, "search", question, k=k, mode=mode, filters=filters)
        return {"results": [_found(h) for h in answer.hits]}

    @server.tool(description="One document's passages in order (its doc_id as a search result gives it).")
    async def passages(ctx: Context, doc_id: Annotated[str, Field(min_length=1, max_length=512)],
                       limit: Annotated[int, Field(ge=1, le=1000)] = 200) -> dict[str, Any]:
        answer = await call(ctx, "search", doc_id, k=limit, mode="dense", filters={"doc_id": doc_id})
        hits = sorted(answer.hits, key=lambda h: h.chunk_index)
        if not hits:
            raise ToolError(f"no passages of document {doc_id!r}; take a doc_id from a search result")
        return {"doc_id": doc_id, "title": hits[0].title,
                "passages": [{"chunk_index": h.chunk_index, "citation": h.citation(), "text": h.text} for h in hits]}

    @server.tool(description="The collection: passages, model, generations, default search mode.")
    async def status(ctx: Context) -> dict[str, Any]:
        return dict((await call(ctx, "status")).model_dump())

    @server.tool(description="Ingest a file or a folder (every file under it) from the machine this MCP server runs "
                 "on; needs a write key. Waits for the jobs and reports documents, passages and failures.")
    async def ingest(ctx: Context, path: Annotated[str, Field(min_length=1, max_length=4096)],
                     wait: bool = True) -> dict[str, Any]:
        root = Path(path).expanduser()
        if not root.exists():
            raise ToolError(f"{path} does not exist on the machine `dpr mcp` runs on; give an absolute path there")
        if not (await call(ctx, "whoami")).may["write"]:
            raise ToolError("ingesting needs a key with the write role; this key may only read")
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.parts))
        jobs = []
        for file in files:
            accepted = await call(ctx, "upload", file)
            done = (await call(ctx, "wait", accepted)) if wait else accepted
            jobs.append({"file": str(file)} | done.model_dump(include={"job", "state", "documents", "chunks",
                                                                          "failed"}, exclude_none=True))
        return {"files": len(files), "jobs": jobs}

    return server


def refuse_open_http(host: str, locked: bool, insecure: bool) -> str | None:
    """Why streamable HTTP must not listen on ``host`` (as `dpr serve`: not beyond loopback without keys)."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback or locked or insecure:
        return None
    return (f"refusing to serve MCP on {host} for a dpr API without keys (anyone could write to it); set keys on "
            "`dpr serve` (DPR_API__API_KEY or `dpr keys create`), listen on 127.0.0.1, or pass --insecure")
