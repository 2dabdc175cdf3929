"""Model lifecycle and store upkeep commands: reembed, rollback, gc, beat, optimize."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from entrypoints.cli.common import (
    EXIT_ERROR,
    AsJson,
    Collection,
    cli_errors,
    console,
    emit_json,
    err_console,
    fail,
    get_settings,
    settings_for,
)
from entrypoints.cli.progress import counted_bar
from services import lifecycle
from services.core.errors import ConfigError
from services.core.settings import Settings

STORE_POLL = 30.0  # seconds between the store reads of a `dpr reembed --wait` that follows workers


def reembed(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Model name under DATA_DIR/models, 'base', or a path; "
                                                   "default: the configured (ACTIVE) model.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="With a broker: follow the re-embed until it ends.")] = False,
    gate: Annotated[Path | None, typer.Option(help="Dev data (BEIR folder or SQuAD JSON): promote only if "
                                                  "`dpr eval` scores the new model at least as high.")] = None,
    collection: Collection = None,
    timeout: Annotated[float | None, typer.Option(help="With --wait: give up waiting after this many seconds.")] = None,
    show: Annotated[bool, typer.Option("--status", help="Show the latest re-embed and its progress; start nothing.")]
    = False,
    as_json: AsJson = False,
) -> None:
    """Re-embed every stored passage with the new passage tower into a new generation, verify, swap the alias.

    Resumable: run it again after an interruption and it continues. Without a broker it runs in this process."""
    settings = settings_for(ctx, collection)
    if gate is not None and not gate.exists():
        fail(f"--gate {gate}: no such file or directory", code=2)
    if show:
        with cli_errors():
            status = lifecycle.reembed_status(settings)
        if as_json:
            emit_json(status)
        elif status.get("state") is None:
            console.print("no re-embed recorded for this collection")
        else:
            st = status["state"]
            console.print(
                f"re-embed {st['source']} -> {st['target']} with {st['model_name']} ({st['model']}): {st['status']}, "
                f"{status['target_points']}/{status['source_points']} passages, started {st['started']}"
                + (f", finished {st['finished']}" if st.get("finished") else "")
                + (f", gate {st['gate']}" if st.get("gate") else "")
                + (f", error: {st['error']}" if st.get("error") else ""),
                highlight=False,
            )
        return
    with cli_errors():
        if settings.broker_url:
            result = _reembed_on_workers(settings, model, gate, wait, timeout, quiet=as_json)
        else:
            result = _reembed_in_process(settings, model, gate, quiet=as_json)
    if as_json:
        emit_json(result)
    else:
        _print_result(result)
    if result.get("outcome") in ("failed", "rejected"):
        raise typer.Exit(EXIT_ERROR)


def _reembed_in_process(settings: Settings, model: str | None, gate: Path | None, quiet: bool) -> dict[str, Any]:
    if quiet:
        return lifecycle.reembed_in_process(settings, model=model, gate=gate)
    with counted_bar("[bold]re-embed[/]", unit="passages") as bar:
        task = bar.add_task("re-embed", total=None)
        return lifecycle.reembed_in_process(
            settings, model=model, gate=gate, progress=lambda done, total: bar.update(task, completed=done, total=total)
        )


def _reembed_on_workers(
    settings: Settings, model: str | None, gate: Path | None, wait: bool, timeout: float | None, quiet: bool
) -> dict[str, Any]:
    from workers.reembed_dispatch import submit_reembed

    submitted = submit_reembed(settings, model=model, gate=str(gate) if gate else None)
    out = submitted.to_json()
    if not wait or submitted.outcome != "submitted":
        return out
    deadline = None if timeout is None else time.monotonic() + timeout
    full_at = [time.monotonic()]

    def poll() -> dict[str, Any]:
        # the broker's progress each second; the store's record (which opens the store, taking the embedded
        # shard's lease from the workers and the server) only every STORE_POLL seconds and at the end
        quick = lifecycle.reembed_progress(settings, submitted.target)
        if quick["result"] is None and time.monotonic() - full_at[0] < STORE_POLL:
            return quick
        full_at[0] = time.monotonic()
        return lifecycle.reembed_status(settings, submitted.target)

    def finished(status: dict[str, Any]) -> bool:
        return status.get("result") is not None or (status.get("state") or {}).get("status") not in (None, "building")

    status = poll()
    if quiet:
        while not finished(status):
            _check_deadline(deadline)
            time.sleep(1)
            status = poll()
    else:
        with counted_bar("[bold]re-embed[/]", unit="batches") as bar:
            task = bar.add_task("re-embed", total=None)
            while not finished(status):
                bar.update(task, completed=status.get("batches_done", 0), total=status.get("batches_sent") or None)
                _check_deadline(deadline)
                time.sleep(1)
                status = poll()
    result = status.get("result") or {"outcome": (status.get("state") or {}).get("status")}
    return {**out, **result, "status": status}


def _check_deadline(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise ConfigError("gave up waiting (--timeout); the re-embed goes on: check `dpr status`, or run "
                          "`dpr reembed --wait` again")


def _print_result(result: dict[str, Any]) -> None:
    outcome = result.get("outcome")
    if outcome == "nothing_to_do":
        console.print(f"nothing to do: the collection is already embedded by {result.get('model_name')} "
                      f"({result.get('model')})", highlight=False)
        return
    if outcome == "submitted":
        console.print(f"re-embed {'resumed' if result.get('resumed') else 'submitted'}: {result.get('source')} -> "
                      f"{result.get('target')} with {result.get('model_name')} ({result.get('model')}), "
                      f"{result.get('passages')} passages in {result.get('batches')} batches; follow with "
                      "`dpr reembed --wait` or `dpr status`", highlight=False)
        return
    line = f"re-embed {outcome}: {result.get('source')} -> {result.get('target')} ({result.get('model_name')})"
    if result.get("copied") is not None:
        line += f", {result.get('copied')} passages encoded in {result.get('seconds', 0):.1f} s"
    console.print(line, highlight=False)
    if result.get("verification"):
        console.print(f"verification: {result['verification']}", highlight=False)
    if result.get("gate"):
        g = result["gate"]
        console.print(f"gate ({g.get('metric')} on {g.get('data')}): candidate {g.get('candidate'):.4f} vs active "
                      f"{g.get('active'):.4f} -> {'promoted' if g.get('promote') else 'rejected'}", highlight=False)
    if result.get("error"):
        err_console.print(f"[red]{result['error']}[/]")


def rollback(
    ctx: typer.Context,
    collection: Collection = None,
    as_json: AsJson = False,
) -> None:
    """Swap the alias back to the previous generation (kept until `dpr gc`); its model becomes ACTIVE again."""
    settings = settings_for(ctx, collection)
    with cli_errors():
        data = lifecycle.rollback_collection(settings)
    if as_json:
        emit_json(data)
    else:
        console.print(f"rolled back: {data['from']} -> {data['to']} (model {data['model_name']}, {data['model']})",
                      highlight=False)


def gc(
    ctx: typer.Context,
    keep: Annotated[int | None, typer.Option("--keep", min=0, help="Inactive generations to keep "
                                                                  "(default: reembed.keep_generations).")] = None,
    collection: Collection = None,
    as_json: AsJson = False,
) -> None:
    """Drop all but the newest N inactive generations (never the active one, never a re-embed in progress)."""
    settings = settings_for(ctx, collection)
    with cli_errors():
        dropped, n = lifecycle.gc_collection(settings, keep)
    if as_json:
        emit_json({"dropped": dropped, "keep": n})
    else:
        console.print(f"dropped {len(dropped)} generations" + (f": {', '.join(dropped)}" if dropped else ""))


def beat(
    ctx: typer.Context,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "info",
) -> None:
    """Run the one Celery beat (re-embed check every reembed.schedule_seconds). A second beat refuses to start."""
    settings = get_settings(ctx)
    with cli_errors():
        from workers.beat import run_beat

        run_beat(settings, loglevel=loglevel)


def optimize(
    ctx: typer.Context,
    collection: Collection = None,
    as_json: AsJson = False,
) -> None:
    """Build the HNSW index of the active generation now (and vacuum deleted points); queries keep answering.

    The embedded engine does this by itself after an ingest or re-embed that adds DPR_EDGE__INDEX_THRESHOLD points;
    a Qdrant server indexes in the background and has nothing to do here."""
    settings = settings_for(ctx, collection)
    with cli_errors():
        from services.store import open_store

        with open_store(settings) as store:
            started = time.monotonic()
            changed = store.optimize()
            seconds = time.monotonic() - started
            result = {"collection": store.alias, "backend": store.backend, "changed": changed,
                      "seconds": round(seconds, 3)} | store.index_info()
    if as_json:
        emit_json(result)
        return
    what = "index rebuilt" if changed else "already optimal, nothing changed"
    if result["backend"] != "edge":
        what = "the Qdrant server indexes in the background by itself; nothing to do"
    graphs = (f", {result['hnsw_segments']} with an HNSW graph (segments under {result['index_threshold']:,} points "
              "are scanned exactly)" if "hnsw_segments" in result else "")
    console.print(f"{result['generation']}: {result['points']:,} points in {result['segments']} segments{graphs}; "
                  f"{what} in {seconds:.1f} s", highlight=False)
