"""`dpr snapshot create|list|restore` (a consistent, checksummed copy of a collection) and `dpr migrate` (bring a
data dir to this release's format). See docs/data-safety.md."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from entrypoints.cli.common import AsJson, Collection, cli_errors, console, emit_json, get_settings, settings_for

snapshot_app = typer.Typer(name="snapshot", help="Snapshots of a collection: create, list, restore.",
                           no_args_is_help=True)


@snapshot_app.command("create")
def create(
    ctx: typer.Context,
    collection: Collection = None,
    out: Annotated[Path | None, typer.Option("--out", help="Folder for the archive (default DATA_DIR/snapshots).")
                   ] = None,
    include_model: Annotated[bool, typer.Option(
        "--include-model", help="Put the model's files in the archive too (default: a reference by fingerprint)")
    ] = False,
    as_json: AsJson = False,
) -> None:
    """Snapshot the collection's active generation (safe while `dpr serve` or an ingest runs)."""
    from services.ops.snapshots import create_snapshot
    from services.store import open_store

    settings = settings_for(ctx, collection)
    with cli_errors(), open_store(settings) as store:
        result = create_snapshot(settings, store.engine, out, include_model=include_model)  # type: ignore[attr-defined]
    if as_json:
        emit_json(result)
        return
    console.print(f"snapshot {result['snapshot']}: {result['points']:,} points of {result['collection']} "
                  f"({result['generation']}), {result['bytes'] / 1e6:.1f} MB, sha256 {result['sha256'][:16]}..., "
                  f"{result['seconds']:.1f} s", highlight=False)


@snapshot_app.command("list")
def list_(
    ctx: typer.Context,
    where: Annotated[Path | None, typer.Option("--dir", help="Folder to list (default DATA_DIR/snapshots).")] = None,
    as_json: AsJson = False,
) -> None:
    """The snapshots kept, newest last, with what each holds."""
    from services.ops.snapshots import list_snapshots

    settings = get_settings(ctx)
    with cli_errors():
        rows = list_snapshots(settings, where)
    if as_json:
        emit_json({"snapshots": rows})
        return
    if not rows:
        console.print("no snapshots yet: `dpr snapshot create`")
        return
    table = Table("snapshot", "collection", "generation", "points", "MB", "created")
    for r in rows:
        if not r["ok"]:
            table.add_row(Path(r["snapshot"]).name, f"[red]{r['error']}[/]", "", "", f"{r['bytes'] / 1e6:.1f}", "")
            continue
        table.add_row(Path(r["snapshot"]).name, str(r["collection"]), str(r["generation"]), f"{r['points']:,}",
                      f"{r['bytes'] / 1e6:.1f}", str(r["created_at"]))
    console.print(table)


@snapshot_app.command("restore")
def restore(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="The snapshot archive (.dpr-snapshot.tar.gz).")],
    data_dir: Annotated[Path | None, typer.Option(
        "--data-dir", help="Data dir to restore into (a new one, or one without this collection); default DPR_DATA_DIR")
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Check the snapshot's checksums and restore its collection into a data dir."""
    from services.ops.snapshots import restore_snapshot

    settings = get_settings(ctx)
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    with cli_errors():
        result = restore_snapshot(file, settings)
    _print_restore(result, as_json)


def _print_restore(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(result)
        return
    console.print(f"restored {result['points']:,} points of {result['collection']} ({result['generation']}) into "
                  f"{result['data_dir']} in {result['seconds']:.1f} s", highlight=False)
    for warning in result["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False)


def migrate(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Bring the data dir to this release's format (records it; a no-op on a current dir)."""
    from services.core.datadir import migrate as run_migration

    settings = get_settings(ctx)
    with cli_errors():
        result = run_migration(settings.data_dir)
    if as_json:
        emit_json(result)
        return
    done = ", ".join(result["steps"]) or "nothing to do"
    console.print(f"data dir {result['data_dir']}: format {result['from']} -> {result['to']} ({done})",
                  highlight=False)
