"""Core commands: query, status, delete (`dpr ingest` is ``entrypoints.cli.ingest``). `dpr query` is the thin
client: this module imports no reader, chunker, job executor or torch."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from entrypoints.cli.common import cli_errors, console, emit_json, fail, settings_for
from services.core.errors import ConfigError
from services.core.settings import Settings
from services.query import QueryOptions
from services.runtime import Runtime
from services.store.common import serving_mode


def _parse_filters(filters: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in filters:
        key, sep, value = f.partition("=")
        if not sep or not key:
            raise ConfigError(f"--filter {f!r} is not KEY=VALUE; e.g. --filter doc_id=intro.md")
        parsed: Any = value
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        if key in out:
            prev = out[key] if isinstance(out[key], list) else [out[key]]
            parsed = prev + (parsed if isinstance(parsed, list) else [parsed])
        out[key] = parsed
    return out


def query(
    ctx: typer.Context,
    text: Annotated[str, typer.Argument(help="The question.")],
    k: Annotated[int, typer.Option("-k", "--k", help="How many passages.")] = 10,
    collection: Annotated[str | None, typer.Option(help="Collection (alias) name.")] = None,
    mode: Annotated[str | None, typer.Option(help="dense | sparse | hybrid (default: the collection's)")] = None,
    fusion: Annotated[str | None, typer.Option(help="Hybrid fusion: rrf | linear")] = None,
    weight: Annotated[float | None, typer.Option(help="Linear fusion: weight of the dense score, 0..1")] = None,
    rrf_k: Annotated[int | None, typer.Option(help="RRF constant k")] = None,
    filters: Annotated[list[str] | None, typer.Option("--filter", help="KEY=VALUE payload filter (repeat)")] = None,
    rerank: Annotated[
        int | None, typer.Option(min=0, help="Rerank the first stage's top N with the reranker; 0: off "
                                 "(default: the collection's, on where its dev split gained)")
    ] = None,
    rerank_weight: Annotated[
        float | None, typer.Option(min=0.0, max=1.0, help="The reranker's share of the order, fused with the first "
                                   "stage's; 1: the reranker alone (default: the collection's, chosen on dev)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Answer a question: question tower -> ANN search over the passages [-> the reranker over the top N]."""
    if mode is not None and mode not in ("dense", "sparse", "hybrid"):
        fail(f"--mode {mode!r} is not known; use dense, sparse or hybrid", code=2)
    if fusion is not None and fusion not in ("rrf", "linear"):
        fail(f"--fusion {fusion!r} is not known; use rrf or linear", code=2)
    settings = settings_for(ctx, collection)
    with cli_errors():
        options = QueryOptions(
            k=k,
            mode=mode,  # type: ignore[arg-type]
            filters=_parse_filters(filters or []),
            fusion=fusion,  # type: ignore[arg-type]
            rrf_k=rrf_k,
            linear_weight=weight,
            rerank=rerank,
            rerank_weight=rerank_weight,
        )
        mode_used = mode or "the server's default mode"
        if settings.api_url:  # a plain HTTP client of `dpr serve`: no model, no store in this process
            from entrypoints.cli.client import ApiClient

            _refuse_collection_over_api(settings, collection)
            with ApiClient(settings) as client:
                hits = client.search(text, options)
        else:
            with Runtime(settings) as runtime:
                hits = [h.to_json() for h in runtime.search(text, options)]
                active = runtime.store.active()
                mode_used = mode or (serving_mode(active.spec).mode if active else "dense")
    if as_json:
        emit_json(hits)
        return
    if not hits:
        console.print("no passages matched")
        return
    table = Table("#", "score", "document", "passage", show_lines=True)
    for i, h in enumerate(hits, start=1):
        snippet = " ".join(h["text"].split())
        reranked = f"\n[dim]rerank {h['rerank_score']:.3f}[/]" if h.get("rerank_score") is not None else ""
        # where it came from: manual.pdf p. 112 / guide.docx › Installing › On Windows, then the id it is stored as
        where = (f"{escape(h['place'])}\n[dim]{escape(h['doc_id'])} chunk {h['chunk_index']}[/]" if h.get("place")
                 else f"{h['doc_id']}\n[dim]chunk {h['chunk_index']}[/]")
        table.add_row(
            str(i), f"{h['score']:.4f}{reranked}", f"{where}\n{h['title']}",
            snippet[:400] + ("..." if len(snippet) > 400 else ""),
        )
    console.print(table)
    reranked = "; reranked" if hits[0].get("rerank_score") is not None else ""
    console.print(f"[dim]{len(hits)} passages; mode {mode_used}{reranked}; model {hits[0].get('model', '?')}[/]",
                  highlight=False)


def _refuse_collection_over_api(settings: Settings, collection: str | None) -> None:
    if collection is not None:
        raise ConfigError(
            f"--collection cannot be chosen over DPR_API_URL: the server at {settings.api_url} answers for its own "
            "collection (DPR_COLLECTION of `dpr serve`); unset DPR_API_URL to use another collection locally"
        )


def status(
    ctx: typer.Context,
    collection: Annotated[str | None, typer.Option(help="Collection (alias) name.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Collection, generation, point count, model fingerprint, queue depth when a broker is configured."""
    settings = settings_for(ctx, collection)
    with cli_errors():
        if settings.api_url:  # the running server's view (its collection, model and queue)
            from entrypoints.cli.client import ApiClient

            _refuse_collection_over_api(settings, collection)
            with ApiClient(settings) as client:
                data = client.status()
        else:
            from entrypoints.status import collection_status  # `dpr query` never needs it

            with Runtime(settings) as runtime:
                data = collection_status(settings, runtime.store.info(wait=False), runtime.store)
    if as_json:
        emit_json(data)
        return
    table = Table(show_header=False, title=f"collection {data['collection']} ({data['backend']})")
    table.add_row("generation", str(data["generation"] or "(none: ingest something first)"))
    table.add_row("points", f"{data['points']:,}")
    table.add_row("model", f"{data['model']}")
    configured = data["configured_model"]
    table.add_row("configured model", f"{configured['name']} ({configured['fingerprint']})"
                  + ("" if data["model_matches"] else "  [red]differs: run `dpr reembed`[/]"))
    for side, tower in (data.get("towers") or {}).items():  # the runtime chosen from the CPU, and why
        measured = tower.get("measured") or {}
        cosine = (measured.get("cosine_to_fp32") or {}).get("mean")
        table.add_row(f"{side} tower", f"{tower['backend']} ({tower['reason']})"
                      + (f"; cosine to fp32 {cosine:.5f}" if cosine is not None else ""))
    table.add_row("vectors", "-" if data["dim"] is None else
                  f"dense {data['dim']}-dim" + (" + BM25 sparse" if data["sparse"] else " only (no sparse)"))
    table.add_row("search", _describe_search(data.get("serving"), data["sparse"]))
    if data.get("search_ef"):
        table.add_row("search ef", _describe_ef(data["search_ef"]))
    if data.get("memory"):  # the memory budget's choice (or the levers set) and why
        table.add_row("memory", f"{data['memory']['choice']} ({data['memory']['reason']})")
    others = [g for g in data["generations"] if not g["active"]]
    table.add_row("other generations", ", ".join(f"{g['name']} ({_points(g['points'])})" for g in others) or "none")
    for u in data.get("unfinished", []):  # a re-embed's target: never answered from until verified and swapped
        owner = u["owner"]
        alive = {True: "alive", False: "dead", None: "unknown"}[owner["alive"]]
        who = (f"pid {owner['pid']} on {owner['host']}" if owner["pid"] else
               f"workers, job {owner['job']}" if owner.get("job") else "workers") + f": {alive}"
        table.add_row("unfinished", f"{u['name']} ({_points(u['points'])}, {u['status']} by {who}): {u['next']}")
    if "queue_depth" in data:
        table.add_row("queue depth", str(data["queue_depth"]))
    if data.get("broker_warning"):
        table.add_row("broker", f"[red]{escape(data['broker_warning'])}[/]")
    if "disk" in data:
        disk = data["disk"]
        table.add_row("disk", f"{disk['free_mb']:,.0f} MB free of {disk['total_mb']:,.0f} MB on {disk['path']}"
                      + ("  [red]writes refused: under DPR_MIN_FREE_MB[/]" if disk["writes_refused"] else
                         "  [yellow]low[/]" if disk["low"] else ""))
    if data.get("feedback"):  # judgements of search hits (`dpr feedback list`)
        fb = data["feedback"]
        table.add_row("feedback", f"{fb['judgements']:,} judgements ({fb['relevant']:,} relevant) of "
                      f"{fb['questions']:,} questions")
    for source in data.get("sources") or []:  # `dpr sources`: last sync, outcome, counts, next run
        last = source.get("last") or {}
        done = (f"{'running' if source.get('running') else last.get('outcome', '-')} at {last.get('finished', '-')}: "
                + ", ".join(f"{last.get(k, 0)} {k}" for k in ("added", "changed", "removed", "failed"))
                ) if last else "never synced"
        table.add_row(f"source {source['name']}", f"{done}; next run {source.get('next_run') or 'when asked'}")
    console.print(table)


def _points(count: int | None) -> str:
    """A generation's point count; None when another process held it (a re-embed's workers): not waited for."""
    return "count not read: another process holds it" if count is None else f"{count:,}"


def _describe_search(serving: dict[str, Any] | None, sparse: bool | None) -> str:
    """The mode a query without --mode gets, and why: tuned by `dpr tune-hybrid`, the label-free default, or dense
    for want of BM25 vectors (``services.store.common.serving_mode``)."""
    if sparse is None or not serving:
        return "-"
    return f"default mode {serving['mode']}; {serving['reason']}"


def _describe_ef(ef: dict[str, Any]) -> str:
    """The HNSW ef dense and hybrid queries use, and why (``services.store.calibrate.describe``)."""
    if "search" in ef:
        return f"{ef['search']}: {ef['reason']}"
    graphs = ef.get("graphs", 1)
    side_by_side = f"; {graphs} graphs searched side by side" if graphs > 1 else ""
    return "; ".join(f"{kind} ef {ef[f'{kind}_ef'] or 'default'} ({ef[f'{kind}_reason']})"
                     for kind in ("dense", "hybrid")) + side_by_side


def delete(
    ctx: typer.Context,
    doc_ids: Annotated[list[str], typer.Argument(help="Document ids to remove with all their passages.")],
    collection: Annotated[str | None, typer.Option(help="Collection (alias) name.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Delete documents (every passage of each)."""
    settings = settings_for(ctx, collection)
    with cli_errors(), Runtime(settings) as runtime:
        removed = runtime.delete(doc_ids)
    if as_json:
        emit_json({"documents": doc_ids, "points_deleted": removed})
    else:
        console.print(f"deleted {removed} passages of {len(doc_ids)} documents")
