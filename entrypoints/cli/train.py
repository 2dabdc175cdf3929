"""`dpr train`, `dpr eval`, `dpr models list|show|activate`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from entrypoints.cli.common import EXIT_USAGE, cli_errors, console, emit_json, err_console, fail, get_settings
from services.settings import Settings

log = logging.getLogger(__name__)

models_app = typer.Typer(name="models", help="Trained towers: list, show, activate.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.command("train")(train)
    app.command("eval")(evaluate)
    app.add_typer(models_app, name="models")


# --- data -------------------------------------------------------------------------------------------------------


def _detect_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    if path.is_dir():
        return "beir"
    name = path.name.lower()
    if name.endswith((".json", ".json.gz")):
        return "squad"
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    fail(f"{path}: cannot tell the format; pass --format beir|squad|jsonl", code=EXIT_USAGE)


def _parse_window(window: str) -> tuple[int, int]:
    try:
        start_s, end_s = window.split(":")
        start, end = int(start_s), int(end_s)
    except ValueError:
        fail(f"--negative-window {window!r} must look like START:END (0-based BM25 ranks), e.g. 0:30", code=EXIT_USAGE)
    if not 0 <= start < end:
        fail(f"--negative-window {window!r} is empty; START must be below END", code=EXIT_USAGE)
    return start, end


def _collection_corpus(settings: Settings, collection: str) -> dict[str, Any]:
    """Passages of an ingested collection as a corpus (one entry per stored chunk)."""
    from encoders.data import CorpusDoc
    from services.store import open_store

    store = open_store(settings.model_copy(update={"collection": collection}))
    corpus: dict[str, CorpusDoc] = {}
    try:
        for batch in store.scroll():
            for p in batch:
                key = f"{p.doc_id}#{p.chunk_index}"
                corpus[key] = CorpusDoc(key, p.title, p.text)
    finally:
        store.close()
    if not corpus:
        fail(f"collection {collection!r} holds no passages; ingest documents first (`dpr ingest PATH`)")
    return corpus


# --- dpr train --------------------------------------------------------------------------------------------------


def train(
    ctx: typer.Context,
    data: Annotated[
        Path | None,
        typer.Argument(help="BEIR folder, SQuAD JSON, labelled pairs JSONL, or (self-supervised) a corpus."),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="auto | beir | squad | jsonl")] = "auto",
    split: Annotated[str, typer.Option(help="BEIR qrels split; SQuAD article split (train | test | all).")] = "train",
    corpus: Annotated[
        Path | None, typer.Option(help="Corpus for JSONL pairs that use positive_id (BEIR folder or corpus JSONL).")
    ] = None,
    self_supervised: Annotated[
        str | None, typer.Option("--self-supervised", help="No labels: build ict | title | both pairs from DATA.")
    ] = None,
    from_collection: Annotated[
        str | None, typer.Option("--from-collection", help="Self-supervised pairs from an ingested collection.")
    ] = None,
    max_pairs: Annotated[int | None, typer.Option(help="Cap on self-supervised pairs.")] = None,
    name: Annotated[str, typer.Option(help="Model name; saved as NAME-YYYYmmdd-HHMMSS.")] = "dpr",
    base: Annotated[
        str, typer.Option(help="Initial towers: 'base' (all-MiniLM-L6-v2), a model name or a model directory.")
    ] = "base",
    shared: Annotated[bool, typer.Option("--shared", help="One tower for questions and passages.")] = False,
    epochs: Annotated[float, typer.Option(min=0.01)] = 4.0,
    batch_size: Annotated[int, typer.Option(min=2, help="Questions per batch (in-batch negatives).")] = 32,
    mini_batch_size: Annotated[
        int, typer.Option(min=0, help="Below --batch-size: cached MNRL (GradCache) with this mini-batch; 0: plain.")
    ] = 0,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate (linear warm-up and decay).")] = 3e-5,
    warmup: Annotated[float, typer.Option(help="Warm-up fraction of the steps.")] = 0.1,
    hard_negatives: Annotated[int, typer.Option(min=0, help="BM25 hard negatives per pair.")] = 1,
    negative_window: Annotated[str, typer.Option(help="BM25 ranks START:END searched for negatives.")] = "0:30",
    train_passage_tokens: Annotated[int, typer.Option(help="Passage length while training (0: full).")] = 128,
    dev_queries: Annotated[
        int, typer.Option(help="Queries held out of the training data for dev metrics (0: none).")
    ] = 100,
    max_steps: Annotated[int, typer.Option(help="Stop after this many steps (overrides --epochs).")] = -1,
    seed: Annotated[int, typer.Option()] = 42,
    activate_model: Annotated[bool, typer.Option("--activate", help="Activate the model when done.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Train DPR towers (MNRL with in-batch and BM25 hard negatives) into a versioned model directory."""
    from services.readers import DataError

    settings = get_settings(ctx)
    window = _parse_window(negative_window)
    if self_supervised is not None and self_supervised not in ("ict", "title", "both"):
        fail(f"--self-supervised {self_supervised!r} is not known; use ict, title or both", code=EXIT_USAGE)
    if data is None and from_collection is None:
        fail("give DATA (a dataset or corpus) or --from-collection NAME", code=EXIT_USAGE)
    if from_collection is not None and self_supervised is None:
        self_supervised = "both"
    with cli_errors():
        try:
            result = _run_training(
                settings,
                TrainRequest(
                    data=data,
                    fmt=fmt,
                    split=split,
                    corpus=corpus,
                    self_supervised=self_supervised,
                    from_collection=from_collection,
                    max_pairs=max_pairs,
                    hard_negatives=hard_negatives,
                    window=window,
                    dev_queries=dev_queries,
                    seed=seed,
                    quiet=as_json,
                    base=base,
                ),
                dict(
                    name=name,
                    shared=shared,
                    epochs=epochs,
                    batch_size=batch_size,
                    mini_batch_size=mini_batch_size,
                    learning_rate=lr,
                    warmup_ratio=warmup,
                    seed=seed,
                    max_steps=max_steps,
                    train_passage_tokens=train_passage_tokens or None,
                    threads=settings.encoder.threads,
                ),
            )
        except (DataError, ValueError) as e:
            fail(str(e))
        if activate_model:
            from encoders.registry import activate

            activate(settings.models_dir, result.name)
    card = result.card
    if as_json:
        emit_json({"model": result.name, "path": str(result.model_dir), "activated": activate_model, "card": card})
        return
    console.print(f"saved [bold]{result.name}[/] at {result.model_dir} (fingerprint {result.fingerprint})")
    dev = (card.get("dev_metrics") or {}).get("after")
    if dev:
        console.print("dev: " + ", ".join(f"{k} {v:.3f}" for k, v in dev.items()))
    if activate_model:
        console.print(f"activated {result.name}")
    else:
        console.print(f"activate it with: dpr models activate {result.name}")


@dataclass
class TrainRequest:
    """What to train on (the hyper-parameters go to ``encoders.train.TrainConfig``)."""

    data: Path | None
    fmt: str = "auto"
    split: str = "train"
    corpus: Path | None = None
    self_supervised: str | None = None
    from_collection: str | None = None
    max_pairs: int | None = None
    hard_negatives: int = 1
    window: tuple[int, int] = (0, 30)
    dev_queries: int = 100
    seed: int = 42
    quiet: bool = False
    base: str = "base"


def _run_training(settings: Settings, req: TrainRequest, hyper: dict[str, Any]) -> Any:
    from encoders import data as d
    from encoders.mining import BM25Index, MiningConfig, mine_hard_negatives
    from encoders.pairs import self_supervised_pairs
    from encoders.towers import resolve_model_path
    from encoders.train import TrainConfig
    from encoders.train import train as run_train
    from services import readers

    base_path, _ = resolve_model_path(req.base, settings.models_dir)

    dev = None
    info: dict[str, Any] = {}
    if req.self_supervised is not None:
        if req.from_collection is not None:
            corpus = _collection_corpus(settings, req.from_collection)
            info["dataset"] = f"collection:{req.from_collection}"
        elif req.data is not None:
            corpus = readers.load_corpus(req.data)
            info["dataset"] = str(req.data)
        else:
            raise ValueError("self-supervised training needs DATA (a corpus) or --from-collection")
        pairs = self_supervised_pairs(
            list(corpus.values()),
            req.self_supervised,  # type: ignore[arg-type]
            seed=req.seed,
            max_pairs=req.max_pairs,
        )
        info["self_supervised"] = req.self_supervised
    elif req.data is None:
        raise ValueError("give DATA: a BEIR folder, SQuAD JSON or labelled pairs JSONL")
    else:
        data = req.data
        kind = _detect_format(data, req.fmt)
        info["format"] = kind
        if kind == "jsonl":
            corpus = readers.load_corpus(req.corpus) if req.corpus else {}
            pairs = readers.load_pairs_jsonl(data, corpus or None)
            info["dataset"] = str(data)
        else:
            split = req.split
            full = readers.load_beir(data, split) if kind == "beir" else readers.load_squad(data, split)  # type: ignore[arg-type]
            train_ids, dev_ids = d.split_dev_queries(sorted(full.queries), req.dev_queries, seed=13)
            if dev_ids:
                dev = full.subset(dev_ids, name=f"{full.name}-dev{len(dev_ids)}")
            train_ds = full.subset(train_ids)
            pairs = d.labelled_pairs(train_ds)
            corpus = full.corpus
            info.update(
                dataset=full.name,
                split=split,
                train_queries=len(train_ids),
                dev_queries=len(dev_ids),
                data_fingerprint=train_ds.fingerprint(),
            )
    mining = MiningConfig(num_negatives=req.hard_negatives, rank_start=req.window[0], rank_end=req.window[1])
    if req.hard_negatives and corpus:
        pairs = mine_hard_negatives(pairs, BM25Index(list(corpus.values())), corpus, mining)
    info["mining"] = {"bm25": "bm25s", **mining.__dict__}
    config = TrainConfig(**hyper)
    with Progress(
        TextColumn("[bold]training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        disable=req.quiet,
        transient=False,
    ) as bar:
        task = bar.add_task("train", total=None, loss="-")

        def on_step(step: int, total: int, loss: float | None) -> None:
            bar.update(task, completed=step, total=total, loss=f"{loss:.4f}" if loss is not None else "-")

        return run_train(
            pairs,
            settings.models_dir,
            config,
            base=base_path,
            corpus=corpus or None,
            dev=dev,
            data_info=info,
            progress=on_step,
        )


# --- dpr eval ---------------------------------------------------------------------------------------------------


def evaluate(
    ctx: typer.Context,
    data: Annotated[Path, typer.Argument(help="BEIR folder or SQuAD JSON.")],
    fmt: Annotated[str, typer.Option("--format", help="auto | beir | squad")] = "auto",
    split: Annotated[str, typer.Option(help="BEIR qrels split, or SQuAD article split (test | train | all).")] = "test",
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
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    mode: Annotated[
        str, typer.Option(help="Store modes: dense | sparse | hybrid | all (sparse/hybrid ingest BM25 vectors too).")
    ] = "dense",
    tuned_from: Annotated[
        str | None, typer.Option("--tuned-from", help="Hybrid fusion from this collection's settings (tune-hybrid).")
    ] = None,
    fusion: Annotated[str | None, typer.Option(help="Hybrid fusion: rrf | linear (overrides --tuned-from).")] = None,
    weight: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="Linear fusion: dense weight.")] = None,
    rrf_k: Annotated[int | None, typer.Option(min=1, help="RRF constant k.")] = None,
) -> None:
    """Compare BM25, the base model and the trained model on one dataset (nDCG@10, MRR@10, recall@k, answer@k)."""
    from services.readers import DataError

    settings = get_settings(ctx)
    kind = _detect_format(data, fmt)
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
                settings, data, kind, split, model, bm25_only, no_base, in_memory, max_queries, k,
                modes=modes, hybrid=hybrid,
            )  # fmt: skip
        except (DataError, ValueError) as e:
            fail(str(e))
        md = None
        if report is not None:
            from encoders.evaluate import write_report

            md = write_report(result, report)
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
    for r in result.results:
        table.add_row(r.system, *[f"{r.metrics.get(n, float('nan')):.3f}" for n in names], f"{r.seconds:.0f}")
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")
    if md is not None:
        console.print(f"report: {md}")


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
) -> Any:
    """BM25, base and trained towers on one dataset, in one run; dense systems go through the real store."""
    from encoders.towers import resolve_model_path
    from services import readers
    from services.evaluation import compare_systems

    dataset = readers.load_beir(data, split) if kind == "beir" else readers.load_squad(data, split)  # type: ignore[arg-type]
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
        hybrid_note=note,
    )  # fmt: skip


def _hybrid_options(
    settings: Settings, tuned_from: str | None, fusion: str | None, weight: float | None, rrf_k: int | None
) -> tuple[Any, str]:
    """Hybrid fusion for `dpr eval`: explicit flags over ``--tuned-from`` settings over the defaults; and a note."""
    from services.evaluation import describe_fusion
    from services.query import QueryOptions

    tuned: dict[str, Any] = {}
    source = "defaults"
    if tuned_from is not None:
        from services.query import active_spec
        from services.store import open_store

        store = open_store(settings.model_copy(update={"collection": tuned_from}))
        try:
            tuned = dict(active_spec(store).settings.get("hybrid") or {})
        finally:
            store.close()
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


# --- dpr models ---------------------------------------------------------------------------------------------------


@models_app.command("list")
def models_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Trained models under DATA_DIR/models, newest first."""
    from encoders.registry import active_name, list_models

    settings = get_settings(ctx)
    entries = list_models(settings.models_dir)
    active = active_name(settings.models_dir)
    if as_json:
        emit_json({"active": active, "models": [e.summary() for e in entries]})
        return
    table = Table(title=f"models in {settings.models_dir} (active: {active})")
    for col in ("", "name", "towers", "data", "dev nDCG@10", "fingerprint", "trained"):
        table.add_column(col)
    for e in entries:
        s = e.summary()
        dev = s["dev_ndcg@10"]
        table.add_row(
            "*" if e.active else "",
            e.name,
            str(s["towers"] or ""),
            str(s["data"] or ""),
            f"{dev:.3f}" if isinstance(dev, float) else "",
            str(s["fingerprint"] or ""),
            str(s["trained_at"] or ""),
        )
    console.print(table)
    if not entries:
        console.print("no trained models yet; train one with `dpr train DATA`")


@models_app.command("show")
def models_show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name, or 'base'.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """A model's card: base, training data, hyper-parameters, dev metrics, fingerprint."""
    import json

    from encoders.registry import ModelNotFound, show_model

    settings = get_settings(ctx)
    try:
        entry = show_model(settings.models_dir, name)
    except ModelNotFound as e:
        fail(str(e))
    if as_json:
        emit_json({"name": entry.name, "path": str(entry.path), "active": entry.active, "card": entry.card})
        return
    console.print(f"[bold]{entry.name}[/]{' (active)' if entry.active else ''}  {entry.path}")
    console.print_json(json.dumps(entry.card, default=str))


@models_app.command("activate")
def models_activate(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Model name, or 'base'.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Make NAME the active model (DPR_ENCODER__MODEL=active resolves to it). Re-embed collections afterwards."""
    from encoders.registry import ModelNotFound, activate

    settings = get_settings(ctx)
    try:
        entry = activate(settings.models_dir, name)
    except ModelNotFound as e:
        fail(str(e))
    if as_json:
        emit_json({"active": entry.name, "fingerprint": entry.card.get("fingerprint"), "path": str(entry.path)})
        return
    console.print(f"active model: [bold]{entry.name}[/] (fingerprint {entry.card.get('fingerprint')})")
    console.print("collections embedded by another model must be re-embedded: `dpr reembed`")
