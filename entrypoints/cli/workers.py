"""Worker commands: `dpr worker` (a Celery worker in the foreground) and `dpr jobs` (one ingest job's state,
in-process or on workers).

Celery is imported only inside the commands (``workers`` package), so the rest of the CLI starts without it.
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from rich.table import Table

from entrypoints.cli.common import EXIT_USAGE, AsJson, cli_errors, console, emit_json, err_console, fail, get_settings
from entrypoints.cli.progress import counted_bar
from services.core.threads import available_cores
from services.ingest.batches import Submitted
from services.ingest.executor import Executor
from services.ingest.follow import Source, follow_job

BROKER_HINT = "set DPR_BROKER_URL=redis://host:6379/0 (the Redis that carries the ingest queue)"


def worker(
    ctx: typer.Context,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-c", min=1, help="Pool processes (default: the usable cores).")
    ] = None,
    queues: Annotated[
        str, typer.Option("--queues", "-Q", help="Queues to consume, comma-separated.")
    ] = "ingest,reembed",
    loglevel: Annotated[str, typer.Option("--loglevel", "-l", help="debug | info | warning | error")] = "info",
    name: Annotated[str | None, typer.Option("--name", "-n", help="Node name (default: dpr-<pid>@<host>).")] = None,
) -> None:
    """Run a Celery worker (prefork pool) in the foreground; each pool process loads the model as it starts."""
    settings = get_settings(ctx)
    if not settings.broker_url:
        fail(f"DPR_BROKER_URL is not set; {BROKER_HINT}", code=EXIT_USAGE)
    processes = concurrency or available_cores()
    with cli_errors():
        from workers.app import create_app, worker_settings

        app = create_app(worker_settings(settings, processes))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app.worker_main(
        [
            "worker",
            "--pool=prefork",
            f"--concurrency={processes}",
            f"--queues={queues}",
            f"--loglevel={loglevel}",
            f"--hostname={name or f'dpr-{os.getpid()}@%h'}",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    )


def jobs(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="The job id printed by `dpr ingest`.")],
    wait: Annotated[bool, typer.Option("--wait", help="Follow the job until it ends.")] = False,
    timeout: Annotated[float | None, typer.Option(help="With --wait: give up after this many seconds.")] = None,
    as_json: AsJson = False,
) -> None:
    """Show an ingest job (in-process or on workers): state, batches, documents, passages, failures."""
    settings = get_settings(ctx)
    with cli_errors():
        from services.runtime import Runtime

        with Runtime(settings) as runtime:
            if wait:
                from entrypoints.compose import executor_for

                status = follow(executor_for(runtime), job_id, show_progress=not as_json, timeout=timeout)
            else:
                status = runtime.jobs.status(job_id)
    if as_json:
        emit_json(status)
    else:
        _print_job(status)
    if status["state"] == "failed":
        raise typer.Exit(1)


def follow(
    executor: Executor,
    job_id: str,
    *,
    show_progress: bool,
    timeout: float | None = None,
    submitted: Submitted | None = None,
    source: Source | None = None,
) -> dict[str, Any]:
    """Wait for the job to end (``services.ingest.follow.follow_job``: rides out a broker outage, re-sends or fails
    batches that can no longer arrive); a progress bar on stderr when ``show_progress``."""
    kwargs: dict[str, Any] = {"timeout": timeout, "submitted": submitted, "source": source}
    if not show_progress:
        return follow_job(executor, job_id, **kwargs)
    with counted_bar("[bold]job {task.fields[job]}[/] {task.fields[state]}",
                     unit="batches  {task.fields[chunks]} passages  {task.fields[failed]} failed") as progress:
        task = progress.add_task("job", total=None, job=job_id, state="", chunks=0, failed=0)

        def show(status: dict[str, Any]) -> None:
            progress.update(task, total=status["batches_total"], completed=status["batches_done"],
                            state=status["state"], chunks=status["chunks"], failed=len(status["failed"]))

        return follow_job(executor, job_id, on_status=show, **kwargs)


def _print_job(status: dict[str, Any]) -> None:
    total = status["batches_total"]
    console.print(
        f"job {status['job']} ({status['state']}): {status['batches_done']}/{'?' if total is None else total} "
        f"batches, {status['documents']} documents written, {status['unchanged']} unchanged, "
        f"{status['chunks']} passages, {count(status, 'skipped')} skipped, {count(status, 'failed')} failed, "
        f"{status['seconds']:.1f} s",
        highlight=False,
    )
    for err in status.get("errors", []):
        err_console.print(f"[red]batch {err['batch']}:[/] {err['error']}", highlight=False)
    print_failures(status)


def count(result: dict[str, Any], what: str) -> int:
    """How many documents were ``what`` (skipped / failed): the total, of which the list keeps the first ones."""
    return int(result.get(f"{what}_total") or len(result.get(what) or []))


def print_failures(result: dict[str, Any], shown: int = 50) -> None:
    """The failed documents with their reasons (the first ``shown``; ``--json`` has every one that was kept)."""
    failed = result.get("failed") or []
    if not failed:
        return
    table = Table("source", "reason", "error", title="failed documents")
    for f in failed[:shown]:
        table.add_row(f.get("source", ""), f.get("reason", ""), f.get("error", ""))
    err_console.print(table)
    more = count(result, "failed") - min(shown, len(failed))
    if more > 0:
        err_console.print(f"... and {more:,} more (`--json` lists up to {len(failed):,})")
