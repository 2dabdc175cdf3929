"""`dpr adapt CORPUS`: adapt the towers to a corpus from its documents alone (``services.lab.adaptation.recipe``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from entrypoints.cli.common import AsJson, cli_errors, console, emit_json, fail, get_settings
from entrypoints.cli.progress import stage_bars
from services.core.threads import threads_per_process

if TYPE_CHECKING:
    from services.lab.adaptation.recipe import AdaptResult


def adapt(
    ctx: typer.Context,
    corpus: Annotated[Path, typer.Argument(help="A BEIR folder (only its corpus.jsonl is read) or a corpus JSONL.")],
    name: Annotated[str, typer.Option(help="Model name; saved as NAME-YYYYmmdd-HHMMSS. The same name and options "
                                      "resume a stopped run.")] = "adapt",
    fmt: Annotated[str, typer.Option("--format", help="auto | beir | jsonl")] = "auto",
    question_only: Annotated[bool, typer.Option(
        "--question-only", help="Train the question tower only: the passage tower stays the active model's, so "
        "the adapted model serves the stored vectors with no re-embed.")] = False,
    feedback: Annotated[bool, typer.Option(
        "--feedback", help="Also learn from the judgements stored with the collection (DPR_COLLECTION; `dpr feedback "
        "list`): a held-out share of the judged questions chooses the model, the rest train it.")] = False,
    base: Annotated[str, typer.Option(help="Towers to adapt (and to beat on dev): active, base, or a model name."
                                      )] = "active",
    pseudo_queries: Annotated[int | None, typer.Option(
        "--pseudo-queries", min=20, help="Pseudo-questions per kind: titles and ICT sentences, 500 each; with "
        "--question-only also keywords, 1,000 each.")] = None,
    epochs: Annotated[str, typer.Option(help="Epochs grid, comma-separated; each point is trained and scored on "
                                        "the held-out pseudo-questions.")] = "1,2",
    hard_negatives: Annotated[int, typer.Option(
        min=0, help="Teacher hard negatives per pseudo-question (full training).")] = 1,
    min_gain: Annotated[float, typer.Option(
        help="Mean dev nDCG@10 the adapted towers must gain over the start to be activated.")] = 0.005,
    max_steps_per_epoch: Annotated[int, typer.Option(
        help="At most this many steps per epoch (-1: all; quick runs).")] = -1,
    activate_model: Annotated[bool, typer.Option(
        "--activate/--no-activate", help="Activate the adapted model when its own dev shows a gain. Off by default: "
        "measured so far, gains on pseudo-questions have not carried to real questions (docs/adapt.md).")] = False,
    seed: Annotated[int, typer.Option()] = 42,
    as_json: AsJson = False,
) -> None:
    """Adapt the towers to CORPUS with no labels: pseudo-questions from its documents, hard negatives from hybrid
    search labelled by a hybrid-agreement teacher, MNRL training (with --question-only: the question tower learns
    hybrid search's scores of each pseudo-question's candidates); every choice on held-out pseudo-questions (with
    --feedback: on held-out judged questions). The adapted model is saved; with --activate it is activated if it
    beats the current one there. Never reads queries or qrels."""
    from services.lab.adaptation.recipe import AdaptConfig
    from services.lab.adaptation.recipe import adapt as run_adapt

    settings = get_settings(ctx)
    try:
        grid = tuple(float(e) for e in epochs.split(",") if e.strip())
    except ValueError:
        fail(f"--epochs {epochs!r} must be numbers separated by commas, e.g. 1,2", code=2)
    config = AdaptConfig.recipe(question_only, queries=pseudo_queries, hard_negatives=hard_negatives, name=name,
                                fmt=fmt, base=base, feedback=feedback, epochs_grid=grid, min_gain=min_gain,
                                max_steps_per_epoch=max_steps_per_epoch, seed=seed,
                                threads=threads_per_process(settings.encoder.threads))
    with cli_errors():
        try:
            with stage_bars(quiet=as_json) as on_progress:
                result = run_adapt(settings, corpus, config, progress=on_progress, activate=activate_model)
        except ValueError as e:
            fail(str(e))
    _print_result(result, as_json)


def _print_result(result: AdaptResult, as_json: bool) -> None:
    record = result.card.get("adaptation", {})
    dev = record.get("dev", {})
    if as_json:
        emit_json({"model": result.model, "path": str(result.model_dir), "activated": result.activated,
                   "gain_on_dev": result.choice is not None, "dev_gain": result.gain, "chosen": record.get("chosen"),
                   "stages": result.stages, "run_dir": str(result.run_dir), "card": result.card})
        return
    judged = dev.get("gate") == ["judged"]
    on = (f"{dev['queries']['judged']} held-out judged questions" if judged else "held-out pseudo-questions")
    skipped = [s for s, how in result.stages.items() if how == "skipped"]
    if skipped:
        console.print(f"resumed: {', '.join(skipped)} done by an earlier run ({result.run_dir})")
    for key, mean in (dev.get("mean") or {}).items():
        console.print(f"dev nDCG@10 {key}: {mean:.4f} " + ", ".join(
            f"{kind} {v:.4f}" for kind, v in dev["scores"][key].items()))
    console.print(f"saved [bold]{result.model}[/] at {result.model_dir} (chosen: {record.get('chosen')})")
    if result.activated:
        console.print(f"activated {result.model}: dev gain {result.gain:+.4f} over the model it started from")
        if not result.card.get("question_only"):
            console.print("its passage tower is new: re-embed the collection (dpr reembed) before queries use it")
    elif result.choice is None:
        console.print(f"no gain on the {on} ({result.gain:+.4f}): the active model is left as it is; dpr models "
                      f"activate {result.model} to use it anyway")
    elif judged:
        console.print(f"dev gain {result.gain:+.4f} on the {on}; not activated (that needs --activate): "
                      f"dpr models activate {result.model}")
    else:
        console.print(f"dev gain {result.gain:+.4f} on the {on}; not activated (that needs --activate): compare "
                      f"on real questions (dpr eval), then dpr models activate {result.model}")
