"""`dpr ingest`: documents into the collection, in-process or through the broker's workers, with a progress bar.

Its own module so that the other core commands (`dpr query` above all) import neither the readers, the chunker,
the job executors nor the progress bar."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from entrypoints.cli.common import EXIT_UNAVAILABLE, cli_errors, console, emit_json, err_console, fail, settings_for
from entrypoints.cli.workers import count, follow, print_failures
from entrypoints.compose import executor_for
from services.core.errors import ConfigError, TransientError
from services.ingest.language import LANGUAGE_HELP, prepare_collection
from services.ingest.pipeline import IngestReport
from services.ingest.sync import SeenDocuments, SyncScope, sync
from services.jobs import TERMINAL
from services.readers import iter_documents
from services.readers.sources import count_documents, detect_format
from services.runtime import Runtime

COMMANDS = ("ingest",)


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest)


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

        def source() -> Any:  # binary files go unparsed: the batch's runner (a worker, or this process) parses them
            items = iter_documents(paths, fmt=fmt, max_bytes=settings.max_document_bytes,  # type: ignore[arg-type]
                                   limits=settings.documents, defer_binary=True)
            if first[0]:  # the first full read decides what is stale (a re-send for a lost batch reads again)
                first[0] = False
                return seen.watch(items)
            return items

        with Runtime(settings) as runtime:
            docs = iter_documents(paths, fmt=fmt, max_bytes=settings.max_document_bytes,  # type: ignore[arg-type]
                                  limits=settings.documents, defer_binary=True)  # only "is there a document?"
            prepare_collection(runtime.store, lambda: runtime.towers, language, docs)  # read only if --language
            total = count_documents(paths, fmt)  # type: ignore[arg-type]  # a quick look, for the ETA
            result = _ingest(runtime, source, wait=wait, as_json=as_json, total=total)
            if scope is not None and seen.complete:
                result |= sync(runtime, scope, seen, prune=prune)
            if not settings.broker_url and (seconds := runtime.prepare_queries()) > 1 and not as_json:
                err_console.print(f"question tower exported to ONNX in {seconds:.0f} s (once per model): "
                                  "`dpr query` runs without torch", highlight=False)
    _print_ingest(result, as_json)
    if result.get("state") in TERMINAL and not (
        result.get("documents") or result.get("unchanged") or result.get("failed")
    ):  # every file was skipped (or there were none): not a success
        example = (result.get("skipped") or [{}])[0]
        why = f", e.g. {example.get('source')}: {example.get('reason')}" if example else ""
        err_console.print(f"nothing was read: {count(result, 'skipped')} files skipped, 0 documents{why}",
                          highlight=False, soft_wrap=True)
        raise typer.Exit(1)
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
    if result.get("parsed"):  # PDF, DOCX, PPTX, ODT, EPUB: parsed where their batches ran
        by = result.get("parsed_by") or []
        console.print(f"{result['parsed']} files parsed in {result.get('parse_seconds', 0):.1f} s"
                      + (f" by {', '.join(by[:3])}{' ...' if len(by) > 3 else ''}" if by else ""), highlight=False)
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
