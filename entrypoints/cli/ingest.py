"""`dpr ingest`: documents into the collection, in-process or through the broker's workers, with a progress bar.

Its own module so that the other core commands (`dpr query` above all) import neither the readers, the chunker,
the job executors nor the progress bar."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from entrypoints.cli.common import EXIT_UNAVAILABLE, cli_errors, console, emit_json, err_console, fail, settings_for
from entrypoints.cli.workers import count, follow, print_failures
from entrypoints.compose import executor_for
from services.core.errors import TransientError
from services.ingest.batches import Submitted
from services.ingest.executor import Executor
from services.ingest.job import IngestJob, Outcome, Tally
from services.ingest.language import LANGUAGE_HELP
from services.jobs import TERMINAL
from services.runtime import Runtime


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
    with cli_errors(), Runtime(settings) as runtime:
        with _Bar() if not as_json and not settings.broker_url else nullcontext() as bar:
            job = IngestJob.of_paths(runtime, paths, fmt, language=language, prune=prune, on_progress=bar)
            executor = executor_for(runtime, on_batch=job.on_batch)
            result = job.run(executor, _outcome(runtime, executor, job, wait=wait, as_json=as_json))
        if not settings.broker_url and (seconds := runtime.prepare_queries()) > 1 and not as_json:
            err_console.print(f"question tower exported to ONNX in {seconds:.0f} s (once per model): "
                              "`dpr query` runs without torch", highlight=False)
    _print_ingest(result, as_json)
    ended, written = result.get("state") in TERMINAL, result.get("documents") or result.get("unchanged")
    if ended and not (written or result.get("failed")):  # every file was skipped (or there were none): not a success
        example = (result.get("skipped") or [{}])[0]
        why = f", e.g. {example.get('source')}: {example.get('reason')}" if example else ""
        err_console.print(f"nothing was read: {count(result, 'skipped')} files skipped, 0 documents{why}",
                          highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    if (ended and result.get("failed") and not written) or result.get("state") == "failed":
        raise typer.Exit(1)  # every document failed, or the job ended failed


def _outcome(runtime: Runtime, executor: Executor, job: IngestJob, *, wait: bool, as_json: bool) -> Outcome | None:
    """What the command reports once the job is handed over: an in-process run has ended (its status); a broker
    job is followed only with ``--wait`` (the job id is printed first, whatever happens next), else it is the
    submission itself."""
    if not runtime.settings.broker_url:
        return lambda submitted: runtime.jobs.status(submitted.job)
    if not wait:
        return None

    def followed(submitted: Submitted) -> dict[str, Any]:
        err_console.print(f"job {submitted.job}: {submitted.batches} batches submitted; following it "
                          f"(`dpr jobs {submitted.job}` shows it later)", highlight=False)
        try:
            return follow(executor, submitted.job, show_progress=not as_json, submitted=submitted, source=job.source)
        except TransientError as e:
            if as_json:  # the caller still gets the job id to follow later
                emit_json(submitted.to_json() | {"state": "unknown", "error": str(e)})
                raise typer.Exit(EXIT_UNAVAILABLE) from e
            raise

    return followed


class _Bar:
    """The progress of an in-process run on stderr: documents done of the job's quick count of the input,
    passages/s and an ETA."""

    COLUMNS = (
        TextColumn("[bold]ingest[/]"),
        BarColumn(),
        TextColumn("{task.completed:,} of {task.fields[of]} documents, {task.fields[chunks]:,} passages "
                   "({task.fields[rate]:.1f}/s), {task.fields[failed]:,} failed"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )

    def __init__(self) -> None:
        self.progress = Progress(*self.COLUMNS, console=err_console, transient=False)
        self.task: TaskID | None = None
        self.read, self.started = 0, 0.0

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, error: object, *exc: object) -> None:
        if self.task is not None and error is None:  # the whole input was read: its length is known
            self.progress.update(self.task, total=self.read, completed=self.read, of=f"{self.read:,}")
        self.progress.stop()

    def __call__(self, tally: Tally) -> None:
        self.read = tally.read
        if self.task is None:  # the job's first count, before it hands its input over: the bar starts with the estimate
            self.progress.start()
            self.started = time.monotonic()
            of = f"~{tally.total:,}" if tally.total else "?"
            self.task = self.progress.add_task("ingest", total=tally.total, of=of, chunks=0, failed=0, rate=0.0)
        if tally.read and (tally.total is None or tally.read > tally.total):  # no estimate, or it fell short
            self.progress.update(self.task, of=f"{tally.read:,}+")
        self.progress.update(self.task, completed=tally.done, chunks=tally.chunks, failed=tally.failed,
                             rate=tally.chunks / max(time.monotonic() - self.started, 1e-6))


def _print_ingest(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(result)
        return
    state = result.get("state")
    head = f"job {result.get('job')}" + (f" ({state})" if state else "")
    refused = f"{count(result, 'skipped')} skipped, {count(result, 'failed')} failed"
    if state == "queued":  # submitted to the workers, nothing written yet
        line = (f"{result.get('documents', 0)} documents in {result.get('batches', 0)} batches, {refused}; "
                f"follow it with `dpr jobs {result.get('job')} --wait`")
    else:
        line = (f"{result.get('documents', 0)} documents written, {result.get('unchanged', 0)} unchanged, "
                f"{result.get('chunks', 0)} passages, {refused}")
    console.print(f"{head}: {line}", highlight=False)
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
