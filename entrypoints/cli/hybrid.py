"""`dpr tune-hybrid`: choose the hybrid fusion on a dev split and store it in a collection's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from entrypoints.cli.common import EXIT_USAGE, AsJson, cli_errors, console, emit_json, err_console, fail, settings_for
from entrypoints.cli.progress import counted_bar


def tune_hybrid_command(
    ctx: typer.Context,
    data: Annotated[Path, typer.Argument(help="BEIR folder or SQuAD JSON with training questions.")],
    fmt: Annotated[str, typer.Option("--format", help="auto | beir | squad")] = "auto",
    split: Annotated[
        str, typer.Option(help="Split the dev questions are carved from (BEIR qrels split; SQuAD: train). Never test.")
    ] = "train",
    dev_queries: Annotated[int, typer.Option(min=1, help="Held-out questions to tune on (seeded subset).")] = 100,
    model: Annotated[
        str | None, typer.Option(help="Towers to tune with (default: the model that built the collection).")
    ] = None,
    collection: Annotated[str | None, typer.Option(help="Collection that receives the tuned choice.")] = None,
    as_json: AsJson = False,
    language: Annotated[
        str, typer.Option(help="BM25 tokenisation: auto (the collection's) | en | ko; must match the collection.")
    ] = "auto",
) -> None:
    """Pick RRF or linear fusion and its parameters on a DEV split; store the choice in the collection's settings.

    The dev corpus is ingested once (dense + BM25) into a temporary collection, or the collection itself is used
    when it already holds that corpus. Afterwards `dpr query` on the collection runs hybrid with the choice.
    """
    from entrypoints.cli.evaluate import detect_dataset_format
    from services.lab.hybrid.tuning import check_target, tune_hybrid, tuning_metrics
    from services.readers import DataError, load_dev_split
    from services.runtime import Runtime

    settings = settings_for(ctx, collection)
    kind = detect_dataset_format(data, fmt)
    if kind not in ("beir", "squad"):
        fail(f"--format {kind!r} cannot be tuned on; use a BEIR folder or SQuAD JSON", code=EXIT_USAGE)
    with cli_errors():
        try:
            dev = load_dev_split(data, split, kind, dev_queries)
        except DataError as e:
            fail(str(e))
        with Runtime(settings) as runtime:
            store = runtime.store
            check_target(store)
            towers = _tuning_towers(runtime, model)
            metric, _ = tuning_metrics(dev)
            with counted_bar("[bold]ingesting the dev corpus", disable=as_json, transient=True) as bar:
                task = bar.add_task("ingest", total=len(dev.corpus))

                def on_ingest(done: int, total: int) -> None:
                    bar.update(task, completed=done, total=total)

                def on_point(label: str, metrics: dict[str, float]) -> None:
                    if not as_json:
                        bar.update(task, visible=False)
                        err_console.print(f"  {label}: {metric} {metrics[metric]:.3f}", highlight=False)

                result = tune_hybrid(
                    dev, towers=towers, settings=settings, target=store, progress=on_ingest, on_point=on_point,
                    language=language,
                )
    out = result.to_json()
    out["collection"] = settings.collection
    if as_json:
        emit_json(out)
        return
    _print_result(out, settings.collection)


def _tuning_towers(runtime: Any, model: str | None) -> Any:
    """The towers that built the collection, or ``--model`` if it is that same model (fusion weights tuned for
    other towers do not transfer)."""
    from encoders.registry import load_towers
    from services.core.errors import ModelMismatch

    settings = runtime.settings
    spec = runtime.store.active().spec  # check_target: the collection exists
    if model is None:
        return runtime.towers_for(spec.model)
    towers = load_towers(model, settings.models_dir, device=settings.encoder.device)
    if towers.fingerprint != spec.model:
        raise ModelMismatch(
            f"--model {model} is model {towers.fingerprint}, but collection {runtime.store.alias!r} was embedded "
            f"by {spec.model}: fusion weights tuned for other towers do not transfer; omit --model"
        )
    return towers


def _print_result(out: dict[str, Any], collection: str) -> None:
    hybrid = out["hybrid"]
    tuned = hybrid["tuned_on"]
    metric = hybrid["metric"]
    table = Table(title=f"{tuned['dataset']}: {tuned['queries']} dev questions, {tuned['documents']} documents")
    table.add_column("system")
    table.add_column(metric, justify="right")
    table.add_row("dense", f"{hybrid['dense_score']:.3f}")
    table.add_row("bm25 (sparse)", f"{hybrid['sparse_score']:.3f}")
    for row in out["grid"]:
        head = f"rrf k={row['rrf_k']}" if row["fusion"] == "rrf" else f"linear w={row['linear_weight']:g}"
        chosen = all(row[k] == hybrid[k] for k in ("fusion", "rrf_k", "linear_weight", "candidates"))
        table.add_row(("* " if chosen else "") + head, f"{row[metric]:.3f}")
    console.print(table)
    what = (
        f"rrf k={hybrid['rrf_k']}" if hybrid["fusion"] == "rrf" else f"linear, dense weight {hybrid['linear_weight']:g}"
    )
    console.print(
        f"chosen: {what}, {hybrid['candidates']} candidates per branch ({metric} {hybrid['dev_score']:.3f} on dev); "
        f"stored in collection {collection!r}: `dpr query` now defaults to --mode hybrid there"
    )
