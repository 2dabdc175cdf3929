"""`dpr feedback list|export`: the judgements users gave search hits (console, POST /v1/feedback), kept in the
data dir with the collection; export writes them as labelled training pairs (docs/feedback.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from entrypoints.cli.common import AsJson, Collection, cli_errors, console, emit_json, err_console, settings_for
from services import feedback
from services.runtime import Runtime

feedback_app = typer.Typer(name="feedback", no_args_is_help=True,
                           help="Judgements of search hits (relevant / not relevant): list, export as training pairs.")


@feedback_app.command("list")
def feedback_list(ctx: typer.Context, collection: Collection = None, as_json: AsJson = False) -> None:
    """Every judgement of the collection: question, document#chunk, relevant or not, when and by whom."""
    settings = settings_for(ctx, collection)
    with cli_errors(), feedback.FeedbackStore.in_data_dir(settings.data_dir) as store:
        judgements = store.judgements(settings.collection)
        counts = store.counts(settings.collection)
    if as_json:
        emit_json({"collection": settings.collection, "counts": counts,
                   "judgements": [j.to_json() for j in judgements]})
        return
    table = Table(title=f"{counts['judgements']:,} judgements of {counts['questions']:,} questions in "
                  f"{settings.collection} ({counts['relevant']:,} relevant)")
    for column in ("question", "passage", "judgement", "when", "by"):
        table.add_column(column)
    for j in judgements:
        where = j.doc_id if j.chunk is None else f"{j.doc_id}#{j.chunk}"
        table.add_row(j.question, where, "relevant" if j.relevant else "not relevant", j.judged_at, j.judged_by)
    console.print(table)


@feedback_app.command("export")
def feedback_export(
    ctx: typer.Context,
    collection: Collection = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write the JSON lines here (default: stdout).")] = None,
    as_json: AsJson = False,
) -> None:
    """Labelled pairs as JSON lines, one per question: {"question", "positives": [{id, text}], "negatives": [...]}
    (texts read from the collection; judgements of documents deleted since are left out)."""
    settings = settings_for(ctx, collection)
    with cli_errors():
        with feedback.FeedbackStore.in_data_dir(settings.data_dir) as store:
            judgements = store.judgements(settings.collection)
        with Runtime(settings) as runtime:
            rows = list(feedback.export_rows(runtime.store, judgements)) if judgements else []
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if out is None:
        if as_json:
            emit_json({"collection": settings.collection, "questions": len(rows), "rows": rows})
        else:
            typer.echo(lines, nl=False)
        return
    with cli_errors():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(lines, encoding="utf-8")
    summary = {"collection": settings.collection, "questions": len(rows), "judgements": len(judgements),
               "positives": sum(len(r["positives"]) for r in rows), "negatives": sum(len(r["negatives"]) for r in rows),
               "out": str(out)}
    if as_json:
        emit_json(summary)
    else:
        err_console.print(f"{summary['questions']:,} questions ({summary['positives']:,} positive, "
                          f"{summary['negatives']:,} negative passages) written to {out}", highlight=False)
