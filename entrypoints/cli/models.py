"""`dpr models list|show|activate|blend|soup`: the built-in towers (base, multilingual) and the trained ones under
DATA_DIR/models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from entrypoints.cli.common import AsJson, cli_errors, console, emit_json, fail, get_settings

if TYPE_CHECKING:
    from encoders.registry import ModelEntry
    from services.lab.shared.training_run import TrainResult

models_app = typer.Typer(name="models", help="Trained towers: list, show, activate, blend, soup.", no_args_is_help=True)


Name = Annotated[str, typer.Argument(help="Model name, 'base' or 'multilingual'.")]


@models_app.command("list")
def models_list(ctx: typer.Context, as_json: AsJson = False) -> None:
    """The built-in models (base, multilingual), then the trained models under DATA_DIR/models, newest first."""
    from encoders.registry import active_name, builtin_models, list_models

    settings = get_settings(ctx)
    builtin = builtin_models(settings.models_dir)
    entries = list_models(settings.models_dir)
    active = active_name(settings.models_dir)
    if as_json:
        emit_json({"active": active, "models": [e.summary() for e in entries],
                   "builtin": [e.summary() for e in builtin]})
        return
    table = Table(title=f"models in {settings.models_dir} (active: {active})")
    for col in ("", "name", "towers", "data", "dev nDCG@10", "fingerprint", "trained"):
        table.add_column(col)
    for e in [*builtin, *entries]:
        s = e.summary()
        dev = s["dev_ndcg@10"]
        built_in = "built in" if s["fingerprint"] else "built in, not converted yet"
        table.add_row(
            "*" if e.active else "",
            e.name,
            f"question only (passages: {s['partner']})" if s.get("question_only") else str(s["towers"] or ""),
            str(s["data"] or ""),
            f"{dev:.3f}" if isinstance(dev, float) else "",
            str(s["fingerprint"] or ""),
            built_in if e in builtin else str(s["trained_at"] or ""),
        )
    console.print(table)
    if not entries:
        console.print("no trained models yet; train one with `dpr train DATA`")


@models_app.command("show")
def models_show(ctx: typer.Context, name: Name, as_json: AsJson = False) -> None:
    """A model's card: base, training data, hyper-parameters, dev metrics, fingerprint."""
    import json

    from encoders.registry import show_model

    entry = _entry(ctx, show_model, name)
    passage = _passage_tower(ctx, entry.name)
    if as_json:
        emit_json({"name": entry.name, "path": str(entry.path), "active": entry.active, "card": entry.card,
                   "passage_tower": passage})
        return
    console.print(f"[bold]{entry.name}[/]{' (active)' if entry.active else ''}  {entry.path}")
    console.print(_passage_line(passage), highlight=False)
    console.print_json(json.dumps(entry.card, default=str))


def _passage_tower(ctx: typer.Context, name: str) -> dict[str, object]:
    """Whether NAME's passage tower embedded the collection's stored points (``services.lifecycle.models``); a
    model that cannot be read, or a store that cannot be opened now, says why instead."""
    from services.lifecycle.models import passage_compatibility

    try:
        return passage_compatibility(get_settings(ctx), name)
    except Exception as e:  # a model not converted yet, a store another process holds: shown, not fatal
        return {"model": name, "same": None, "reembed_needed": None, "error": str(e).splitlines()[0]}


def _passage_line(passage: dict[str, object]) -> str:
    collection = passage.get("collection")
    if passage.get("error"):
        return f"passage tower: not compared with the stored points ({passage['error']})"
    if passage["same"] is None:
        return f"passage tower: no collection {collection!r} yet (nothing stored to compare with)"
    if passage["same"]:
        return (f"passage tower: same as the stored points of {collection!r} — no re-embed "
                "(`dpr models activate` serves them at once)")
    return (f"passage tower: differs from the stored points of {collection!r} ({passage['collection_model']}) — "
            "re-embed needed (`dpr models activate`, then `dpr reembed`)")


@models_app.command("activate")
def models_activate(ctx: typer.Context, name: Name, as_json: AsJson = False) -> None:
    """Make NAME the active model (DPR_ENCODER__MODEL=active resolves to it). Collections embedded by another
    passage tower need `dpr reembed`; a question-only model of the collection's model serves it at once."""
    from encoders.registry import activate, export_model

    entry = _entry(ctx, activate, name)
    settings = get_settings(ctx)
    export_model(entry.path, settings.models_dir, settings.onnx_cache_dir)  # once per model; the onnx backends
    passage = _passage_tower(ctx, entry.name)
    if as_json:
        emit_json({"active": entry.name, "fingerprint": entry.card.get("fingerprint"), "path": str(entry.path),
                   "passage_tower": passage})
        return
    console.print(f"active model: [bold]{entry.name}[/] (fingerprint {entry.card.get('fingerprint')})")
    if passage.get("same"):
        console.print(f"its passage tower embedded collection {passage['collection']!r}: queries use it now, no "
                      "re-embed (roll back with `dpr models activate` of the previous model)")
    else:
        console.print("collections embedded by another passage tower must be re-embedded: `dpr reembed`")


@models_app.command("blend")
def models_blend(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A model `dpr train` made.")],
    weight: Annotated[float | None, typer.Option(
        "--weight", min=0.01, max=1.0, help="The trained weights' share: WEIGHT x trained + (1 - WEIGHT) x the "
        "pretrained model its lineage started from (as `dpr train --blend`).")] = None,
    choose_on: Annotated[Path | None, typer.Option(
        "--choose-on", help="Choose WEIGHT for this corpus (a BEIR folder or corpus JSONL; no questions needed): "
        "pseudo-questions from its titles and sentences rank the base and each weight of --weights.")] = None,
    choose_on_collection: Annotated[str | None, typer.Option(
        "--choose-on-collection", help="As --choose-on, over the passages of an ingested collection.")] = None,
    weights: Annotated[str | None, typer.Option(
        "--weights", help="The weights --choose-on tries, comma-separated (default 1,0.9,...,0.3).")] = None,
    pseudo_queries: Annotated[int, typer.Option(
        "--pseudo-queries", min=20, help="Pseudo-questions per kind (title, ICT sentence) for --choose-on.")] = 500,
    margin: Annotated[float, typer.Option(
        "--margin", min=0.0, help="--choose-on picks the largest weight within MARGIN nDCG@10 of the best.")] = 0.005,
    out: Annotated[str | None, typer.Option("--name", help="Name of the new model (default NAME-blendWEIGHT).")] = None,
    as_json: AsJson = False,
) -> None:
    """WiSE-FT after training: save NAME blended with the pretrained model it started from, as a new model.

    Blending buys back quality on collections the model was not trained for, at a price on the one it was. With
    --weight, the weight is yours (try a few with `dpr eval` on labelled dev questions). With --choose-on (or
    --choose-on-collection) it is chosen for a collection you will search but have no questions for: the base
    model and NAME at each of --weights are scored on pseudo-questions built from that collection's own documents,
    and the largest weight within --margin of the best is saved (nothing is saved if that is 1, or if only the
    base is). Pseudo-questions favour the base on the collection NAME was trained for: where you have labelled
    questions, choose with --weight and `dpr eval` instead.
    `dpr models activate` the one to serve; NAME is kept."""
    from services.lab.towers.blend_and_soup import blend_model

    if (weight is not None) + (choose_on is not None) + (choose_on_collection is not None) != 1:
        fail("give one of --weight F, --choose-on DATA or --choose-on-collection NAME")
    if weight is None:
        chosen = _choose_blend(ctx, name, choose_on, choose_on_collection, weights, pseudo_queries, margin, out,
                               as_json)
        if chosen is None:
            return
        result, weight = chosen
    else:
        try:
            result = blend_model(get_settings(ctx), name, weight, out)
        except (FileNotFoundError, ValueError) as e:
            fail(str(e))
    blended = result.card["blended_with"]
    if as_json:
        emit_json({"name": result.name, "path": str(result.model_dir), "fingerprint": result.fingerprint,
                   "blended_with": blended})
        return
    console.print(f"saved [bold]{result.name}[/] = {weight:g} x {name} + {1 - weight:g} x {blended['path']} "
                  f"({blended['tensors']} tensors; fingerprint {result.fingerprint})")
    console.print(f"measure it (`dpr eval DATA --model {result.name}`), then `dpr models activate {result.name}`")


def _choose_blend(ctx: typer.Context, name: str, data: Path | None, collection: str | None, weights: str | None,
                  queries: int, margin: float, out: str | None, as_json: bool) -> tuple[TrainResult, float] | None:
    """``--choose-on``: the blended model saved and its weight, or None once the outcome is printed (the base, or
    NAME as it is, serves the collection best: nothing was saved)."""
    from services.lab.towers.blend_and_soup import choose_blend

    try:
        tried = None if weights is None else tuple(float(w) for w in weights.split(","))
    except ValueError:
        fail(f"--weights {weights!r}: give comma-separated numbers in (0, 1], e.g. 1,0.8,0.6")
    report = None if as_json else (lambda line: console.print(f"  {line}", highlight=False))
    with cli_errors():  # a missing collection: exit 1, a bad weight: 2
        try:
            choice = choose_blend(get_settings(ctx), name, data=data, collection=collection, weights=tried,
                                  queries=queries, margin=margin, name=out, progress=report)
        except ValueError as e:  # DataError, a corpus with no pseudo-questions, a model with no lineage
            fail(str(e))
    found = choice.result
    if as_json:
        saved = {} if found is None else {"path": str(found.model_dir), "fingerprint": found.fingerprint,
                                          "blended_with": found.card["blended_with"]}
        emit_json({"chosen_on": choice.source, "dev_sets": choice.dev_sets, "scores": choice.scores,
                   "margin": choice.margin, "weight": choice.weight, "name": found and found.name, **saved})
        return None
    if found is not None and choice.weight is not None:
        console.print(f"chose weight {choice.weight:g} on {choice.source}")
        return found, choice.weight
    if choice.weight is None:
        console.print(f"the pretrained base scores best on {choice.source}'s pseudo-questions (no weight comes "
                      f"within {margin:g}): serve the base there; nothing saved")
    else:
        console.print(f"{name} unblended is within {margin:g} of the best on {choice.source}'s pseudo-questions: "
                      "serve it as it is; nothing saved")
    return None


@models_app.command("soup")
def models_soup(
    ctx: typer.Context,
    names: Annotated[list[str], typer.Argument(help="Two or more models `dpr train` made from one starting model.")],
    out: Annotated[str | None, typer.Option("--name", help="Name of the new model (default FIRST-soupN).")] = None,
    as_json: AsJson = False,
) -> None:
    """Model soup: save the average of the weights of NAMES (models fine-tuned from one starting model, e.g. rounds
    or recipes continued from one model) as a new model; NAMES are kept.

    Averaging fine-tunes that share a start often beats each of them (Wortsman et al. 2022). Measure it with
    `dpr eval` on a dev split before `dpr models activate`."""
    from services.lab.towers.blend_and_soup import soup_models

    try:
        result = soup_models(get_settings(ctx), names, out)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    if as_json:
        emit_json({"name": result.name, "path": str(result.model_dir), "fingerprint": result.fingerprint,
                   "soup": result.card["soup"]})
        return
    console.print(f"saved [bold]{result.name}[/] = the average of {', '.join(names)} "
                  f"(fingerprint {result.fingerprint})")
    console.print(f"measure it (`dpr eval DATA --model {result.name}`), then `dpr models activate {result.name}`")


def _entry(ctx: typer.Context, lookup: Callable[[Path, str], ModelEntry], name: str) -> ModelEntry:
    """``lookup(models_dir, name)``; an unknown model is one line on stderr and a non-zero exit."""
    from encoders.registry import ModelNotFound

    try:
        return lookup(get_settings(ctx).models_dir, name)
    except ModelNotFound as e:
        fail(str(e))
