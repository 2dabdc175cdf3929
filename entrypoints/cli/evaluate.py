"""`dpr eval`: BM25, the base model and trained towers on one BEIR or SQuAD dataset, through the real store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from entrypoints.cli.common import EXIT_USAGE, AsJson, cli_errors, console, emit_json, fail, get_settings
from services.core.errors import ConfigError
from services.core.settings import Settings
from services.ingest.language import check_choice
from services.readers import DatasetFormat, dataset_format, load_dataset, load_dev_split


def evaluate(
    ctx: typer.Context,
    data: Annotated[Path, typer.Argument(help="BEIR folder or SQuAD JSON.")],
    fmt: Annotated[str, typer.Option("--format", help="auto | beir | squad")] = "auto",
    split: Annotated[
        str | None,
        typer.Option(help="BEIR qrels split, or SQuAD article split (test | train | all); default test, or train "
                     "with --dev-queries."),
    ] = None,
    dev_queries: Annotated[
        int | None,
        typer.Option(min=1, help="Evaluate on the N questions `dpr train` and `dpr tune-hybrid` hold out of the "
                     "training split (its dev split: compare models, blends and soups there, never on test)."),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Trained model to compare (name, path or 'active'); default: active.")
    ] = None,
    bm25_only: Annotated[bool, typer.Option("--bm25", help="Only the BM25 baseline.")] = False,
    no_base: Annotated[bool, typer.Option("--no-base", help="Skip the untrained base model.")] = False,
    in_memory: Annotated[
        bool, typer.Option("--in-memory", help="Exact scan in memory instead of the real store (faster, no chunks).")
    ] = False,
    max_queries: Annotated[int | None, typer.Option(help="Evaluate on the first N queries (by id).")] = None,
    k: Annotated[int, typer.Option(min=1, max=1000, help="Depth of each ranking.")] = 100,
    report: Annotated[Path | None, typer.Option(help="Write report.md, results.json and PNG plots here.")] = None,
    as_json: AsJson = False,
    mode: Annotated[
        str, typer.Option(help="Store modes: dense | sparse | hybrid | all (sparse/hybrid ingest BM25 vectors too).")
    ] = "dense",
    tuned_from: Annotated[
        str | None, typer.Option("--tuned-from", help="Hybrid fusion from this collection's settings (tune-hybrid).")
    ] = None,
    fusion: Annotated[str | None, typer.Option(help="Hybrid fusion: rrf | linear (overrides --tuned-from).")] = None,
    weight: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="Linear fusion: dense weight.")] = None,
    rrf_k: Annotated[int | None, typer.Option(min=1, help="RRF constant k.")] = None,
    language: Annotated[str, typer.Option(help="BM25 tokenisation: auto (detected on the corpus) | en | ko.")] = "auto",
) -> None:
    """Compare BM25, the base model and the trained model on one dataset (nDCG@10, MRR@10, recall@k, answer@k)."""
    settings = get_settings(ctx)
    kind = detect_dataset_format(data, fmt)
    if kind not in ("beir", "squad"):
        fail(f"--format {kind!r} cannot be evaluated; use a BEIR folder or SQuAD JSON", code=EXIT_USAGE)
    if mode not in ("dense", "sparse", "hybrid", "all"):
        fail(f"--mode {mode!r} is not known; use dense, sparse, hybrid or all", code=EXIT_USAGE)
    if fusion is not None and fusion not in ("rrf", "linear"):
        fail(f"--fusion {fusion!r} is not known; use rrf or linear", code=EXIT_USAGE)
    with cli_errors():
        hybrid = _hybrid_options(settings, tuned_from, fusion, weight, rrf_k)
        modes = ("dense", "sparse", "hybrid") if mode == "all" else (mode,)
        try:
            result = run_evaluation(
                settings, data, kind, split or ("train" if dev_queries else "test"), model, bm25_only, no_base,
                in_memory, max_queries, k, modes=modes, hybrid=hybrid, language=check_choice(language),
                dev_queries=dev_queries,
            )  # fmt: skip
        except ValueError as e:  # DataError, and the encoders' argument checks
            fail(str(e))
        md = None
        if report is not None:
            from services.lab.evaluation.retrieval import write_report
            from services.latest_report import keep_latest

            md = write_report(result, report)
            keep_latest(settings, report)  # the copy `dpr serve`'s console shows
    _print_report(result, md, as_json)


def _print_report(result: Any, md: Path | None, as_json: bool) -> None:
    if as_json:
        out = result.to_json()
        if md is not None:
            out["report"] = str(md)
        emit_json(out)
        return
    table = Table(title=f"{result.dataset}: {result.queries} queries, {result.documents} documents")
    table.add_column("system")
    names = result.metric_names()
    for n in names:
        table.add_column(n, justify="right")
    table.add_column("s", justify="right")
    refs = result.significance_references()
    for ref in refs:
        table.add_column(f"vs {ref}", justify="right")
    for r in result.results:
        table.add_row(r.system, *[f"{r.metrics.get(n, float('nan')):.3f}" for n in names], f"{r.seconds:.0f}",
                      *[result.significance_cell(r.system, ref) for ref in refs])
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")
    if md is not None:
        console.print(f"report: {md}")


def detect_dataset_format(path: Path, fmt: str) -> DatasetFormat:
    """``services.readers.dataset_format``; a path it cannot place is a usage error (exit 2)."""
    try:
        return dataset_format(path, fmt)
    except ConfigError as e:
        fail(str(e), code=EXIT_USAGE)


def run_evaluation(
    settings: Settings,
    data: Path,
    kind: str,
    split: str,
    model: str | None,
    bm25_only: bool,
    no_base: bool,
    in_memory: bool,
    max_queries: int | None,
    k: int,
    modes: tuple[str, ...] = ("dense",),
    hybrid: tuple[Any, str] | None = None,
    language: str | None = None,
    dev_queries: int | None = None,
) -> Any:
    """BM25, base and trained towers on one dataset, in one run; dense systems go through the real store. With
    ``dev_queries``, on the dev split `dpr train` holds out of ``split`` instead of the whole split."""
    from encoders.towers import resolve_model_path
    from services.lab.evaluation.store_retriever import compare_systems

    dataset = (load_dataset(data, split, kind) if dev_queries is None
               else load_dev_split(data, split, kind, dev_queries))
    if max_queries is not None:
        dataset = dataset.subset(sorted(dataset.queries)[:max_queries])
    models: list[str] = []
    if not bm25_only:
        if not no_base:
            models.append("base")
        _, trained_name = resolve_model_path(model or "active", settings.models_dir)
        if trained_name != "base":
            models.append(model or trained_name)
    options, note = hybrid if hybrid is not None else (None, "")
    return compare_systems(
        dataset, settings=settings, models=models, in_memory=in_memory, k=k, modes=modes, hybrid=options,
        hybrid_note=note, language=language,
    )  # fmt: skip


def _hybrid_options(
    settings: Settings, tuned_from: str | None, fusion: str | None, weight: float | None, rrf_k: int | None
) -> tuple[Any, str]:
    """Hybrid fusion for `dpr eval`: explicit flags over ``--tuned-from`` settings over the defaults; and a note."""
    from services.lab.evaluation.store_retriever import describe_fusion
    from services.query import QueryOptions

    tuned: dict[str, Any] = {}
    source = "defaults"
    if tuned_from is not None:
        from services.query import active_spec
        from services.store import open_store

        with open_store(settings.for_collection(tuned_from)) as store:
            tuned = dict(active_spec(store).settings.get("hybrid") or {})
        if not tuned:
            fail(f"collection {tuned_from!r} has no tuned hybrid settings; run `dpr tune-hybrid DATA --collection "
                 f"{tuned_from}` first, or pass --fusion/--weight/--rrf-k")  # fmt: skip
        on = tuned.get("tuned_on") or {}
        source = (
            f"tuned in collection {tuned_from!r} on {on.get('dataset', '?')} ({on.get('queries', '?')} dev queries)"
        )
    options = QueryOptions(
        mode="hybrid",
        fusion=fusion or tuned.get("fusion", "rrf"),  # type: ignore[arg-type]
        rrf_k=rrf_k or tuned.get("rrf_k", 60),
        linear_weight=weight if weight is not None else tuned.get("linear_weight", 0.5),
        candidates=tuned.get("candidates"),
    )
    if fusion is not None or weight is not None or rrf_k is not None:
        source = "given on the command line" + (f" (rest {source})" if tuned else "")
    return options, f"{describe_fusion(options)} ({source})"
