"""The last step of `dpr adapt` (``services.learn.adaptation``): the chosen candidate saved as a model, with the
adaptation record (recipe, teacher, judgements, dev figures, stage times) in its card; activated only when asked
and the dev gate shows a gain."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.core.settings import Settings
from services.learn.staged_run import write_json as _write_json

if TYPE_CHECKING:
    from services.learn.adaptation import AdaptConfig

KIND_NOTES = {"title": "a title asks for its documents' bodies",
               "ict": "a sentence asks for its document without it",
               "keywords": "3-5 of a document's heaviest tf-idf words ask for it"}


def save_choice(settings: Settings, run_dir: Path, pseudo: dict[str, Any], mining: dict[str, Any],
                 judged: dict[str, Any] | None, training: dict[str, Any], dev: dict[str, Any], base_path: Path,
                 base_name: str, config: AdaptConfig, timings: dict[str, Any], source: Path,
                 activate: bool) -> dict[str, Any]:
    """The winner (the best candidate when none gains) saved under ``models_dir`` with the adaptation record in
    its card; activated on a gain."""
    from encoders.learn.training_run import peak_rss_mib, versioned_name, write_card
    from encoders.registry import activate as activate_model
    from encoders.towers import model_fingerprint, read_model_card
    from services.learn.training import export_for_backends

    key = dev["choice"] or dev["best"]
    epochs_key = key.split("-blend-")[0]
    candidate = Path(training["candidates"][epochs_key]["path"])
    name = versioned_name(config.name)
    models_dir = settings.models_dir
    models_dir.mkdir(parents=True, exist_ok=True)
    staging = models_dir / f".staging-{name}"
    if staging.exists():
        shutil.rmtree(staging)
    card = read_model_card(candidate)
    if "-blend-" in key:
        from encoders.learn.adapt import load_model
        from encoders.learn.blend import blend_with_pretrained

        model = load_model(candidate)
        card["blended_with"] = blend_with_pretrained(model, base_path, float(key.split("-blend-")[1]))
        model.save(str(staging), create_model_card=False)
        for extra in ("metrics.json",):
            if (candidate / extra).is_file():
                shutil.copy2(candidate / extra, staging / extra)
    else:
        shutil.copytree(candidate, staging)
    card.update(name=name, fingerprint=model_fingerprint(staging))
    card["adaptation"] = {
        "command": "dpr adapt", "corpus": str(source), "started_from": {"name": base_name, "path": str(base_path)},
        "recipe": {"pseudo_questions": {k: len(v["train"]) + len(v["dev"]) for k, v in pseudo["split"].items()},
                   "kinds": {k: KIND_NOTES[k] for k in config.kinds}, "dev_share": config.dev_share,
                   "training": _training_note(config),
                   "epochs_grid": list(config.epochs_grid),
                   "blend_grid": [] if config.question_only else list(config.blend_grid),
                   "batch_size": config.batch_size, "learning_rate": config.learning_rate, "seed": config.seed},
        "teacher": {**mining["teacher"], "stats": mining["stats"]},
        "training": training["candidates"],
        "feedback": {k: v for k, v in judged.items() if k not in ("pairs", "dev")} if judged else None,
        "dev": {k: dev.get(k) for k in ("queries", "scores", "gate", "mean", "gain", "min_gain", "rule",
                                        "blend_error")},
        "chosen": key, "gain_on_dev": dev["choice"] is not None,
        "stage_seconds": timings, "peak_rss_mib": peak_rss_mib(),
        "never_read": "queries and qrels (only the corpus file)",
    }
    write_card(staging, card)
    final = models_dir / name
    os.replace(staging, final)
    export_for_backends(settings, final)
    activated = bool(dev["choice"]) and activate
    if activated:
        activate_model(models_dir, name)
    result = {"model": name, "model_dir": str(final), "activated": activated}
    _write_json(run_dir / "result.json", result)
    return result


def _training_note(config: AdaptConfig) -> str:
    if config.question_only and config.teacher.distill:
        return "question tower only, the teacher's scores learnt by KL over each pseudo-question's candidates"
    if config.question_only:
        return "question tower only, every passage a negative"
    return "MNRL, in-batch + teacher hard negatives"
