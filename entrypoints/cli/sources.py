"""`dpr sources add|list|sync|remove`: folders, S3-compatible buckets and git repositories kept in sync with a
collection (services/sources/, docs/sources.md). A sync lists the source, reads only what changed since the last
one into one ingest job (in this process, or on the workers with a broker) and removes what the source no longer
has; a listing that fails deletes nothing and exits 3."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from entrypoints.cli.common import AsJson, Collection, cli_errors, console, emit_json, get_settings
from services.sources.registry import Registry, format_interval, new_spec, parse_interval

sources_app = typer.Typer(name="sources", no_args_is_help=True,
                          help="Sources kept in sync: folders, s3://bucket/prefix, web sites, git repositories.")
WAIT_S = 3600.0  # --wait: how long a sync waits for another sync of the same source to end


@sources_app.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The source's name: its documents' ids start with NAME/.")],
    uri: Annotated[str, typer.Argument(help="A folder, s3://bucket/prefix, https://site/path/, or git+URL / a .git "
                                            "URL or path.")],
    every: Annotated[str | None, typer.Option(help="Sync interval (15m, 1h, 1d); unset: only when asked.")] = None,
    include: Annotated[list[str] | None, typer.Option(help="Only keys matching this glob (repeatable).")] = None,
    exclude: Annotated[list[str] | None, typer.Option(help="Leave out keys matching this glob (repeatable).")] = None,
    collection: Collection = None,
    endpoint: Annotated[str | None, typer.Option(help="s3: the store's URL (else DPR_SOURCES__S3_ENDPOINT, "
                                                      "AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL).")] = None,
    key_env: Annotated[str | None, typer.Option(help="s3: NAME of the variable holding the access key id.")] = None,
    secret_env: Annotated[str | None, typer.Option(help="s3: NAME of the variable holding the secret key.")] = None,
    branch: Annotated[str | None, typer.Option(help="git: the branch to follow (default: HEAD).")] = None,
    as_json: AsJson = False,
) -> None:
    """Add a source (nothing is read until it syncs: `dpr sources sync NAME`)."""
    from entrypoints.cli.keys import _audit

    settings = get_settings(ctx)
    with cli_errors():
        if collection:
            settings.for_collection(collection)  # a bad name is refused here, not at the first sync
        spec = new_spec(name, uri, every_s=parse_interval(every), include=tuple(include or ()),
                        exclude=tuple(exclude or ()), collection=collection, endpoint=endpoint, key_env=key_env,
                        secret_env=secret_env, branch=branch)
        Registry(settings.data_dir).add(spec)
        _audit(settings.data_dir, "dpr sources add", {"source": spec.name, "kind": spec.kind, "uri": spec.uri})
    if as_json:
        emit_json(spec.to_json())
        return
    console.print(f"source {spec.name} ({spec.kind}, {spec.uri}) added; every {format_interval(spec.every_s)}; "
                  f"sync it now with `dpr sources sync {spec.name}`", highlight=False)


@sources_app.command("list")
def list_sources(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Every source with its last sync: outcome, counts, and the next run."""
    from services.sources.schedule import sources_status

    with cli_errors():
        rows = sources_status(get_settings(ctx).data_dir)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        console.print("no sources; add one with `dpr sources add NAME URI`")
        return
    table = Table("name", "kind", "uri", "every", "last sync", "outcome", "added/changed/removed/failed", "next run")
    for row in rows:
        last = row["last"]
        counts = "/".join(str(last.get(k, 0)) for k in ("added", "changed", "removed", "failed")) if last else "-"
        outcome = "running" if row["running"] else (last.get("outcome", "-") if last else "never synced")
        table.add_row(row["name"], row["kind"], row["uri"], format_interval(row["every_s"]),
                      str(last.get("finished", "-")) if last else "-", outcome, counts, row["next_run"] or "-")
    console.print(table)


@sources_app.command("sync")
def sync(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The source to sync.")],
    wait: Annotated[bool, typer.Option("--wait", help="If a sync of it is running, wait for it to end and sync "
                                                      "after (else refused, exit 3).")] = False,
    as_json: AsJson = False,
) -> None:
    """Sync a source now: read what changed since the last sync, remove what it no longer has. Exit 3 when the
    source cannot be reached (nothing is removed then); 1 when its ingest job ended failed."""
    from entrypoints.compose import executor_for
    from services.runtime import Runtime
    from services.sources.sync import sync_source

    settings = get_settings(ctx)
    registry = Registry(settings.data_dir)
    with cli_errors(), Runtime(settings) as runtime:
        report = sync_source(runtime, registry, name, executor_for(runtime), wait_s=WAIT_S if wait else 0.0)
    result = report.to_json()
    if as_json:
        emit_json(result)
    else:
        console.print(
            f"source {name}: {report.outcome} in {report.seconds:.1f} s; {report.listed} items, {report.added} added, "
            f"{report.changed} changed, {report.unchanged} unchanged, {report.removed} documents removed, "
            f"{report.failed} failed; {report.documents} documents ({report.passages} passages) written"
            + (f" by job {report.job}" if report.job else ""), highlight=False)
        for failure in report.failures[:5]:
            console.print(f"  failed: {failure.get('error') or failure.get('source')}", highlight=False)
    if report.outcome != "ok":
        raise typer.Exit(1)


@sources_app.command("remove")
def remove(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The source to remove.")],
    purge: Annotated[bool, typer.Option("--purge", help="Also remove its documents from the collection.")] = False,
    as_json: AsJson = False,
) -> None:
    """Remove a source; its documents stay searchable unless --purge."""
    from entrypoints.cli.keys import _audit

    settings = get_settings(ctx)
    registry = Registry(settings.data_dir)
    documents = points = 0
    with cli_errors():
        spec = registry.get(name)
        if purge:
            from services.runtime import Runtime
            from services.sources.sync import purge_source

            with Runtime(settings) as runtime:
                documents, points = purge_source(runtime, registry, name)
        registry.remove(name)
        _audit(settings.data_dir, "dpr sources remove", {"source": name, "purge": purge, "documents": documents})
    result = {"source": name, "removed": True, "purged": purge, "documents": documents, "points": points,
              "collection": spec.collection or settings.collection}
    if as_json:
        emit_json(result)
    elif purge:
        console.print(f"source {name} removed with its {documents:,} documents ({points:,} passages)", highlight=False)
    else:
        console.print(f"source {name} removed; its documents stay (`--purge` removes them)", highlight=False)
