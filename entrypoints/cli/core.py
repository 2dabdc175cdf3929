"""Core commands: ingest, query, status, delete."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from entrypoints.cli.common import (
    EXIT_UNAVAILABLE,
    cli_errors,
    console,
    emit_json,
    err_console,
    fail,
    settings_for,
)
from entrypoints.cli.workers import count, follow, print_failures
from entrypoints.compose import executor_for
from entrypoints.status import collection_status
from services.errors import ConfigError, TransientError
from services.ingest import IngestReport
from services.jobs import TERMINAL
from services.language import LANGUAGE_HELP, prepare_collection
from services.query import QueryOptions
from services.readers import iter_documents
from services.readers.sources import count_documents, detect_format
from services.runtime import Runtime
from services.settings import Settings
from services.sync import SeenDocuments, SyncScope, sync

COMMANDS = ("ingest", "query", "status", "delete")


def register(app: typer.Typer) -> None:
    for name in COMMANDS:
        app.command(name)(globals()[name])


def ingest(
    ctx: typer.Context,
    paths: Annotated[list[Path], typer.Argument(help="Files, folders, JSONL files or BEIR corpus folders.")],
    fmt: Annotated[str, typer.Option("--format", help="auto | files | jsonl | beir")] = "auto",
    collection: Annotated[str | None, typer.Option(help="Collection (alias) name.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="With a broker: follow the job until it ends.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    prune: Annotated[bool, typer.Option(
        "--prune", help="Remove the documents stored from these folders that are no longer there (without it they "
        "are listed as stale).")] = False,
    language: Annotated[str, typer.Option(help=LANGUAGE_HELP)] = "auto",
) -> None:
    """Ingest documents: chunk with the passage tower's tokenizer, embed, upsert into Qdrant."""
    if fmt not in ("auto", "files", "jsonl", "beir"):
        fail(f"--format {fmt!r} is not known; use auto, files, jsonl or beir", code=2)
    settings = settings_for(ctx, collection)
    with cli_errors():
        for p in paths:
            if not p.exists():
                raise ConfigError(f"{p}: no such file or directory; check the path")
        scope = _sync_scope(paths, fmt, prune)
        seen = SeenDocuments()
        first = [True]

        def source() -> Any:
            items = iter_documents(paths, fmt=fmt, max_bytes=settings.max_document_bytes)  # type: ignore[arg-type]
            if first[0]:  # the first full read decides what is stale (a re-send for a lost batch reads again)
                first[0] = False
                return seen.watch(items)
            return items

        with Runtime(settings) as runtime:
            docs = iter_documents(paths, fmt=fmt, max_bytes=settings.max_document_bytes)  # type: ignore[arg-type]
            prepare_collection(runtime.store, lambda: runtime.towers, language, docs)  # read only if --language
            total = count_documents(paths, fmt)  # type: ignore[arg-type]  # a quick look, for the ETA
            result = _ingest(runtime, source, wait=wait, as_json=as_json, total=total)
            if scope is not None and seen.complete:
                result |= sync(runtime, scope, seen, prune=prune)
            if not settings.broker_url and (seconds := runtime.prepare_queries()) > 1 and not as_json:
                err_console.print(f"question tower exported to ONNX in {seconds:.0f} s (once per model): "
                                  "`dpr query` runs without torch", highlight=False)
    _print_ingest(result, as_json)
    if result.get("failed") and result.get("state") in TERMINAL and not (
        result.get("documents") or result.get("unchanged")
    ):
        raise typer.Exit(1)  # every document failed
    if result.get("state") == "failed":
        raise typer.Exit(1)


def _sync_scope(paths: list[Path], fmt: str, prune: bool) -> SyncScope | None:
    """The folders to check for stale documents: all of them with --prune (which refuses any other input);
    without it, the folders among the paths, if any, just to report."""
    if prune:
        return SyncScope.of_paths(paths, fmt)
    folders = [p for p in paths if p.is_dir() and fmt in ("auto", "files") and detect_format(p) == "files"]
    return SyncScope.of_paths(folders, fmt) if folders else None


def _ingest(runtime: Runtime, source: Any, *, wait: bool, as_json: bool, total: int | None = None
            ) -> dict[str, Any]:
    """Submit through the executor the settings choose; in-process runs end before ``submit`` returns, broker
    jobs are followed only with ``--wait`` (the job id is printed first, whatever happens next)."""
    collection = runtime.settings.collection
    show_progress = not as_json
    items = source()
    if runtime.settings.broker_url:
        executor = executor_for(runtime)
        submitted = executor.submit(items, collection=collection)
        if not wait:
            return submitted.to_json()
        err_console.print(f"job {submitted.job}: {submitted.batches} batches submitted; following it "
                          f"(`dpr jobs {submitted.job}` shows it later)", highlight=False)
        try:
            return follow(executor, submitted.job, show_progress=show_progress, submitted=submitted, source=source)
        except TransientError as e:
            if as_json:  # the caller still gets the job id to follow later
                emit_json(submitted.to_json() | {"state": "unknown", "error": str(e)})
                raise typer.Exit(EXIT_UNAVAILABLE) from e
            raise
    if not show_progress:
        return runtime.jobs.status(executor_for(runtime).submit(items, collection=collection).job)
    columns = (
        TextColumn("[bold]ingest[/]"),
        BarColumn(),
        TextColumn("{task.completed:,} of {task.fields[of]} documents, {task.fields[chunks]:,} passages "
                   "({task.fields[rate]:.1f}/s), {task.fields[failed]:,} failed"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err_console, transient=False) as progress:
        of = f"~{total:,}" if total else "?"
        task = progress.add_task("ingest", total=total, of=of, chunks=0, failed=0, rate=0.0)
        seen = {"read": 0, "done": 0, "chunks": 0, "failed": 0}
        started = time.monotonic()

        def counted(stream: Any) -> Any:  # the input streams: nothing is held to know its length
            for item in stream:
                seen["read"] += 1
                if total is None or seen["read"] > total:  # no estimate, or it fell short: documents read so far
                    progress.update(task, of=f"{seen['read']:,}+")
                yield item

        def on_batch(part: IngestReport) -> None:
            seen["done"] += part.items
            seen["chunks"] += part.chunks
            seen["failed"] += len(part.failed)
            progress.update(task, completed=seen["done"], chunks=seen["chunks"], failed=seen["failed"],
                            rate=seen["chunks"] / max(time.monotonic() - started, 1e-6))

        submitted = executor_for(runtime, on_batch=on_batch).submit(counted(items), collection=collection)
        progress.update(task, total=seen["read"], completed=seen["read"], of=f"{seen['read']:,}")
    return runtime.jobs.status(submitted.job)


def _print_ingest(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(result)
        return
    state = result.get("state")
    head = f"job {result.get('job')}" + (f" ({state})" if state else "")
    if state == "queued":  # submitted to the workers, nothing written yet
        console.print(
            f"{head}: {result.get('documents', 0)} documents in {result.get('batches', 0)} batches, "
            f"{count(result, 'skipped')} skipped, {count(result, 'failed')} failed; "
            f"follow it with `dpr jobs {result.get('job')} --wait`",
            highlight=False,
        )
    else:
        console.print(
            f"{head}: {result.get('documents', 0)} documents written, {result.get('unchanged', 0)} unchanged, "
            f"{result.get('chunks', 0)} passages, {count(result, 'skipped')} skipped, "
            f"{count(result, 'failed')} failed",
            highlight=False,
        )
    if result.get("title_truncated"):
        console.print(f"{result['title_truncated']} titles were shortened to fit the passage budget")
    print_failures(result)
    if result.get("skipped"):
        console.print(f"skipped: {count(result, 'skipped')} files, e.g. "
                      f"{result['skipped'][0].get('source')}", highlight=False)
    if result.get("stale_total"):
        n = result["stale_total"]
        shown = ", ".join(result["stale"][:5]) + (", ..." if n > 5 else "")
        if result.get("pruned"):
            console.print(f"pruned: {n:,} documents no longer in the folder removed "
                          f"({result.get('points_pruned', 0):,} passages): {shown}", highlight=False)
        else:
            console.print(f"stale: {n:,} documents stored from these folders are no longer there: {shown}; "
                          "`--prune` removes them", highlight=False)


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
                mode_used = mode or (active.spec.settings.get("mode") if active else None) or "dense"
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
        table.add_row(
            str(i), f"{h['score']:.4f}{reranked}", f"{h['doc_id']}\n[dim]chunk {h['chunk_index']}[/]\n{h['title']}",
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
            with Runtime(settings) as runtime:
                data = collection_status(settings, runtime.store.info())
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
    table.add_row("vectors", "-" if data["dim"] is None else
                  f"dense {data['dim']}-dim" + (" + BM25 sparse" if data["sparse"] else " only (no sparse)"))
    table.add_row("search", _describe_search(data["search_settings"], data["sparse"]))
    others = [g for g in data["generations"] if not g["active"]]
    table.add_row("other generations", ", ".join(f"{g['name']} ({g['points']:,})" for g in others) or "none")
    if "queue_depth" in data:
        table.add_row("queue depth", str(data["queue_depth"]))
    console.print(table)


def _describe_search(search: dict[str, Any], sparse: bool | None) -> str:
    """The default query mode of the collection and, if `dpr tune-hybrid` ran, what it chose and on what."""
    if sparse is None:
        return "-"
    if not sparse:
        return "dense only: no BM25 vectors, so --mode sparse|hybrid are refused"
    hybrid = search.get("hybrid") or {}
    mode = search.get("mode") or "dense"
    if not hybrid:
        return f"default mode {mode}; hybrid untuned (rrf k=60); tune with `dpr tune-hybrid DATA`"
    if hybrid.get("fusion") == "rrf":
        fusion = f"rrf k={hybrid.get('rrf_k')}"
    else:
        fusion = f"linear, dense weight {hybrid.get('linear_weight')}"
    on = hybrid.get("tuned_on") or {}
    metric = hybrid.get("metric", "score")
    return (
        f"default mode {mode}; {fusion}, {hybrid.get('candidates')} candidates per branch; tuned on "
        f"{on.get('dataset', '?')} ({on.get('queries', '?')} dev questions): {metric} {hybrid.get('dev_score')} "
        f"(dense {hybrid.get('dense_score')}, bm25 {hybrid.get('sparse_score')})"
    )


def delete(
    ctx: typer.Context,
    doc_ids: Annotated[list[str], typer.Argument(help="Document ids to remove with all their passages.")],
    collection: Annotated[str | None, typer.Option(help="Collection (alias) name.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Delete documents (every passage of each)."""
    settings = settings_for(ctx, collection)
    with cli_errors():
        with Runtime(settings) as runtime:
            removed = runtime.delete(doc_ids)
    if as_json:
        emit_json({"documents": doc_ids, "points_deleted": removed})
    else:
        console.print(f"deleted {removed} passages of {len(doc_ids)} documents")
