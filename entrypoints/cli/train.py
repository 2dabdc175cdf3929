"""`dpr train`: parse the flags, call ``services.lab.towers.rounds.train_recipe`` (the fine-tune, then mining rounds
chosen on the dev split), print the new model and its stages."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from entrypoints.cli.common import (
    EXIT_USAGE,
    cli_errors,
    console,
    emit_json,
    err_console,
    fail,
    get_settings,
    settings_for,
)
from entrypoints.cli.progress import stage_bars
from services.core.threads import threads_per_process

if TYPE_CHECKING:
    from services.lab.shared.training_run import TrainResult

DATA, RECIPE, OUTPUT = "Data", "Recipe", "Output"


def train(
    ctx: typer.Context,
    data: Annotated[
        Path | None,
        typer.Argument(help="BEIR folder, SQuAD JSON, labelled pairs JSONL, or (self-supervised) a corpus."),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="auto | beir | squad | jsonl", rich_help_panel=DATA)] = "auto",
    split: Annotated[str, typer.Option(
        help="BEIR qrels split; SQuAD article split (train | test | all).", rich_help_panel=DATA)] = "train",
    corpus: Annotated[Path | None, typer.Option(
        help="Corpus for JSONL pairs that use positive_id (BEIR folder or corpus JSONL).", rich_help_panel=DATA)
    ] = None,
    self_supervised: Annotated[str | None, typer.Option(
        "--self-supervised", help="No labels: build ict | title | both pairs from DATA.", rich_help_panel=DATA)
    ] = None,
    from_collection: Annotated[str | None, typer.Option(
        "--from-collection", help="Self-supervised pairs from an ingested collection.", rich_help_panel=DATA)
    ] = None,
    feedback: Annotated[bool, typer.Option(
        "--feedback", help="Learn from the judgements stored with the collection (DPR_COLLECTION; `dpr feedback "
        "list`): passages judged relevant are positives, those judged not relevant their negatives. Alone, or "
        "beside DATA's pairs.", rich_help_panel=DATA)] = False,
    language: Annotated[str, typer.Option(
        help="BM25 tokenisation for hard negatives: auto (detected on the corpus) | en | ko.", rich_help_panel=DATA)
    ] = "auto",
    base: Annotated[str | None, typer.Option(
        help="Initial towers: 'base' (all-MiniLM-L6-v2), 'active', a model name or a model directory (default: "
        "base; with --question-only, the active model).", rich_help_panel=RECIPE)] = None,
    question_only: Annotated[bool, typer.Option(
        "--question-only", help="Train the question tower only: the passage tower stays --base's, so the new model "
        "serves the points that model embedded (activate it: no re-embed). Every corpus passage is a negative.",
        rich_help_panel=RECIPE)] = False,
    recipe: Annotated[Path | None, typer.Option(
        "--recipe", help="A TOML recipe file (epochs, lr, negatives, rounds, ...): its keys over the default recipe "
        "(services/lab/towers/recipe.toml; docs/training.md).", rich_help_panel=RECIPE)] = None,
    name: Annotated[str, typer.Option(
        help="Model name; saved as NAME-YYYYmmdd-HHMMSS.", rich_help_panel=OUTPUT)] = "dpr",
    dev_baseline: Annotated[bool, typer.Option(
        "--dev-baseline", help="Also measure the dev queries before training (both in the card); --activate then "
        "skips a model that scores below the one it started from.", rich_help_panel=OUTPUT)] = False,
    activate_model: Annotated[bool, typer.Option(
        "--activate", help="Activate the model when done.", rich_help_panel=OUTPUT)] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="One JSON document on stdout.", rich_help_panel=OUTPUT)] = False,
) -> None:
    """Train DPR towers into a versioned model directory: by default the best recipe measured (a fine-tune with
    MNRL and a BM25 hard negative, then up to 3 mining rounds of dense negatives, each kept only on a dev gain)."""
    from services.ingest.language import check_choice
    from services.lab.towers.recipe_file import load_recipe
    from services.lab.towers.rounds import train_recipe

    settings = get_settings(ctx)
    if self_supervised is not None and self_supervised not in ("ict", "title", "both"):
        fail(f"--self-supervised {self_supervised!r} is not known; use ict, title or both", code=EXIT_USAGE)
    if data is None and from_collection is None and not feedback:
        fail("give DATA (a dataset or corpus), --from-collection NAME or --feedback", code=EXIT_USAGE)
    with cli_errors():
        chosen = load_recipe(recipe)
        if chosen.data.pretrain is not None and self_supervised is not None:
            fail("the recipe's pretrain precedes labelled fine-tuning; drop --self-supervised (or data.pretrain)",
                 code=EXIT_USAGE)
        what = chosen.training_data(data=data, fmt=fmt, split=split, corpus=corpus, self_supervised=self_supervised,
                                    from_collection=from_collection, feedback=feedback, language=language)
        config = chosen.train_config(name=name, threads=threads_per_process(settings.encoder.threads),
                                     dev_baseline=dev_baseline, question_only=question_only)
        check_choice(language)
        try:
            with stage_bars(quiet=as_json) as on_progress:
                done = train_recipe(settings, what, config, base=base or ("active" if question_only else "base"),
                                    rounds=chosen.round_config(what, config), progress=on_progress,
                                    recipe=chosen.describe())
        except ValueError as e:  # DataError, and the encoders' argument checks
            fail(str(e))
        result = done.result
        lost = _dev_loss(result.card)
        if activate_model and lost is not None:
            err_console.print(f"[yellow]not activated:[/] {lost}")
            activate_model = False
        if activate_model:
            from encoders.registry import activate

            activate(settings.models_dir, result.name)
    _print_result(result, activate_model, as_json, done.stages)


def _dev_loss(card: dict) -> str | None:  # type: ignore[type-arg]
    """Why the new model must not replace the one it started from: it scores below it on the dev queries
    (``--dev-baseline`` measured both). None when it gains, ties, or was not compared."""
    dev = card.get("dev_metrics") or {}
    before, after = dev.get("before"), dev.get("after")
    if not before or not after or after.get("ndcg@10", 0.0) >= before.get("ndcg@10", 0.0):
        return None
    return (f"dev nDCG@10 {after['ndcg@10']:.4f} is below the starting model's {before['ndcg@10']:.4f}; keep that "
            f"one (the new model stays saved; dpr models activate {card.get('name', 'NAME')} to use it anyway)")


def train_reranker(
    ctx: typer.Context,
    data: Annotated[Path, typer.Argument(help="BEIR folder, SQuAD JSON or labelled pairs JSONL.")],
    fmt: Annotated[str, typer.Option("--format", help="auto | beir | squad | jsonl", rich_help_panel=DATA)] = "auto",
    split: Annotated[str, typer.Option(
        help="BEIR qrels split; SQuAD article split (train | test | all).", rich_help_panel=DATA)] = "train",
    corpus: Annotated[Path | None, typer.Option(
        help="Corpus for JSONL pairs that use positive_id.", rich_help_panel=DATA)] = None,
    base: Annotated[str, typer.Option(help="Where to start: 'base' (MiniLM-L6), a towers model (name or "
                                      "directory: its passage tower), a model directory (each under a new "
                                      "head), or a trained reranker (continued, head and all).",
                                      rich_help_panel=RECIPE)] = "base",
    recipe: Annotated[Path | None, typer.Option(
        "--recipe", help="A TOML recipe file (epochs, lr, loss, negatives, dev candidates, first stage, ...): its "
        "keys over the default recipe (services/lab/reranker/recipe.toml; docs/training.md).",
        rich_help_panel=RECIPE)] = None,
    name: Annotated[str, typer.Option(
        help="Reranker name; saved as NAME-YYYYmmdd-HHMMSS.", rich_help_panel=OUTPUT)] = "rerank",
    collection: Annotated[str | None, typer.Option(
        help="Collection that records the default (if it exists).", rich_help_panel=OUTPUT)] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="One JSON document on stdout.", rich_help_panel=OUTPUT)] = False,
) -> None:
    """Train a cross-encoder reranker (MiniLM + a fresh head) on labelled pairs and mined hard negatives; measure
    the dev split before/after reranking the first stage's top N; on by default for the collection only on a gain."""
    from services.lab.reranker.recipe import train_reranker_model
    from services.lab.reranker.recipe_file import load_recipe
    from services.lab.shared.stages import step_progress

    settings = settings_for(ctx, collection)
    with cli_errors():
        chosen = load_recipe(recipe)
        what = chosen.training_data(data=data, fmt=fmt, split=split, corpus=corpus)
        config = chosen.rerank_config(name=name, threads=threads_per_process(settings.encoder.threads))
        try:
            with stage_bars(quiet=as_json) as on_progress:  # a bar from the first step: mining prints nothing
                done = train_reranker_model(settings, what, config, base=base, first_stage=chosen.dev.first_stage,
                                            progress=step_progress(on_progress, "training"))
        except ValueError as e:
            fail(str(e))
    card = done.result.card
    if as_json:
        emit_json({"model": done.result.name, "path": str(done.result.model_dir), "card": card,
                   "collection_setting": done.setting, "stored_in": done.stored_in})
        return
    console.print(f"saved reranker [bold]{done.result.name}[/] at {done.result.model_dir} "
                  f"({card['steps']} steps, {card['train_seconds']:.0f} s)")
    dev = card.get("dev_metrics")
    if dev:
        console.print(f"dev ({dev['queries']} queries, {dev['first_stage']} top {dev['candidates']}): nDCG@10 "
                      f"{dev['before']['ndcg@10']:.3f} -> {dev['after']['ndcg@10']:.3f} (gain {dev['gain']:+.3f})")
    state = "on" if done.setting["enabled"] else "off (no dev gain)"
    where = f"collection {done.stored_in!r}" if done.stored_in else f"no collection {settings.collection!r} yet"
    console.print(f"default reranking: {state}; recorded in {where}; per query: dpr query --rerank N | --rerank 0")


def _print_result(result: TrainResult, activated: bool, as_json: bool, ran: dict[str, str] | None = None) -> None:
    card = result.card
    if as_json:
        emit_json({"model": result.name, "path": str(result.model_dir), "activated": activated,
                   "stages_run": ran or {}, "card": card})
        return
    console.print(f"saved [bold]{result.name}[/] at {result.model_dir} (fingerprint {result.fingerprint})")
    for stage in card.get("stages") or []:
        dev = stage.get("dev_ndcg@10")
        wall = stage.get("stage_seconds") or stage.get("train_seconds") or 0.0
        kept = "" if "kept" not in stage else (", chosen" if stage.get("chosen") else
                                              ", kept" if stage["kept"] else ", not kept (no dev gain)")
        again = " (done earlier)" if (ran or {}).get(stage["stage"]) == "skipped" else ""
        console.print(f"{stage['stage']}: {stage['model']}, {stage['steps']} steps, {wall:.0f} s, peak RSS "
                      f"{stage['peak_rss_mib']:.0f} MiB" + (f", dev nDCG@10 {dev:.3f}" if dev is not None else "")
                      + kept + again)
    for when, dev in (card.get("dev_metrics") or {}).items():
        if dev:
            console.print(f"dev {when}: " + ", ".join(f"{k} {v:.3f}" for k, v in dev.items()))
    if activated:
        console.print(f"activated {result.name}")
    else:
        console.print(f"activate it with: dpr models activate {result.name}")
