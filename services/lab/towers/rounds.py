"""`dpr train`'s recipe: the fine-tune, then mining rounds, each round kept only where the dev split says it gains
(docs/training.md, "The default recipe").

Stages (``services.lab.shared.stages``; each a model under ``DATA_DIR/train/<name>-<key>/stages``, the key a hash of
the data, the options and the starting towers, so a killed run started again goes on at its first unfinished
stage): ``finetune`` (``services.lab.towers.recipe.train_stage``), then ``round 1`` .. ``round N`` (``RoundConfig``),
hard negatives mined by the towers of the stage before; the first round whose dev nDCG@10 does not beat the stage
before it by more than ``min_gain`` stops the rounds. The last kept stage is saved as ``NAME-YYYYmmdd-HHMMSS``
with every stage in its card's ``stages`` and the recipe in ``recipe``; the test split is never read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.core.errors import ConfigError
from services.core.fsutil import sha256_of
from services.core.settings import Settings
from services.lab.shared.stages import StagedRun, StageProgress, read_json, step_progress, write_json
from services.lab.towers.recipe import TrainingData, export_for_backends, train_model, train_stage

if TYPE_CHECKING:
    from services.lab.shared.training_run import TrainResult
    from services.lab.towers.trainer import TrainConfig

log = logging.getLogger(__name__)

RECIPE_VERSION = 1  # part of the run key: a changed recipe never resumes an older run's stages


@dataclass(frozen=True)
class RoundConfig:
    """The mining rounds after the fine-tune. Defaults: the best SciFact run measured (docs/training.md, 'The
    default recipe'): dev nDCG@10 0.779 -> 0.825 -> 0.829 -> 0.857 over the fine-tune and three rounds, a fourth
    round not kept (0.856): so up to 3 rounds, each still kept only on a dev gain."""

    rounds: int = 3
    hard_negatives: int = 3
    denoise: float = 0.95
    epochs: float = 2.0
    learning_rate: float = 1e-5
    mini_batch_size: int = 16  # cached MNRL: 3 negatives per pair fit in the memory of 16 rows
    min_gain: float = 0.0  # a round is kept when its dev nDCG@10 exceeds the stage before's by more than this

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "negatives_from": "dense (the stage before's towers)",
                "rule": "a round is kept when its dev nDCG@10 beats the stage before it by more than min_gain; "
                        "the first round that does not ends the rounds"}


@dataclass
class RecipeResult:
    result: TrainResult  # the model saved under models_dir
    run_dir: Path | None  # None: a single fine-tune (no rounds), trained straight into models_dir
    stages: dict[str, str]  # stage -> ran | skipped (done by an earlier, stopped run)


def rounds_unavailable(data: TrainingData, config: TrainConfig) -> str | None:
    """Why mining rounds cannot run on this data (None: they can): a round is kept or dropped on the dev split,
    which only labelled BEIR / SQuAD data with dev_queries > 0 has, and it trains both towers."""
    if config.question_only:
        return "--question-only trains one tower against the whole corpus (no mined negatives)"
    if data.self_supervised is not None or data.from_collection is not None or data.data is None:
        return "the rounds are chosen on held-out labelled questions; this data has none"
    if data.dev_queries <= 0:
        return "data.dev_queries = 0 leaves no dev split to choose the rounds on"
    from services.readers import dataset_format

    if dataset_format(data.data, data.fmt) == "jsonl":
        return "a pairs JSONL has no dev split to choose the rounds on"
    return None


def train_recipe(settings: Settings, data: TrainingData, config: TrainConfig, *, base: str = "base",
                 rounds: RoundConfig, progress: StageProgress | None = None,
                 recipe: dict[str, Any] | None = None) -> RecipeResult:
    """The fine-tune, then up to ``rounds.rounds`` mining rounds chosen on dev (module docstring); resumes a stopped
    run. ``rounds.rounds`` 0: the single fine-tune of ``services.lab.towers.recipe.train_model``, no run directory.
    ``recipe``: the recipe file and its values (``services.lab.towers.recipe_file``): the card's ``recipe.settings``."""
    notify = progress or (lambda *a: None)
    if rounds.rounds <= 0:
        result = train_model(settings, data, config, base=base, progress=step_progress(notify, "finetune"))
        if recipe is not None:
            from services.lab.shared.training_run import write_card

            result.card["recipe"] = {"command": "dpr train", "settings": recipe}
            write_card(result.model_dir, result.card)
        return RecipeResult(result, None, {"finetune": "ran"})
    why = rounds_unavailable(data, config)
    if why is not None:
        raise ConfigError(f"the recipe's rounds.count = {rounds.rounds}: {why}; set it to 0")
    from encoders.towers import resolve_model_path

    base_path, base_name = resolve_model_path(base, settings.models_dir)
    run_dir = settings.data_dir / "train" / f"{config.name}-{_run_key(data, config, rounds, base_path)}"
    run = StagedRun(run_dir, notify)
    write_json(run_dir / "run.json", {"data": str(data.data), "base": base_name, "base_path": str(base_path),
                                      "rounds": rounds.describe(), "config": asdict(config)})
    stages_dir = run_dir / "stages"
    total = 1 + rounds.rounds
    t0 = time.perf_counter()
    run.stage("finetune", _finished(run_dir, "finetune"),
              lambda: _finetune(settings, data, config, base_path, stages_dir, run_dir, notify, total))
    chosen = previous = read_json(run_dir / "finetune.json")
    records = [previous]
    for k in range(1, rounds.rounds + 1):
        label = f"round {k}"
        run.stage(label, _finished(run_dir, f"round-{k}"),
                  partial(_round, settings, data, config, rounds, k, previous, stages_dir, run_dir, notify, total))
        previous = read_json(run_dir / f"round-{k}.json")
        records.append(previous)
        left = total - 1 - k
        if not previous["kept"]:
            notify("recipe", k + 1, total, f"{label} not kept (no dev gain): stopping the rounds")
            break
        chosen = previous
        notify("recipe", k + 1, total, _eta(run.timings, left))
    saved = read_json(run_dir / "result.json")
    if saved is None or saved.get("model") != chosen["model"] or not Path(saved["model_dir"]).is_dir():
        saved = _save(settings, config, rounds, records, chosen, run.timings, run_dir, base_name, recipe)
        write_json(run_dir / "result.json", saved)
    log.info("dpr train recipe finished", extra={"seconds": round(time.perf_counter() - t0, 1),
                                                  "stages": run.stages, "chosen": chosen["stage"]})
    from encoders.towers import model_fingerprint, read_model_card

    model_dir = Path(saved["model_dir"])
    from services.lab.shared.training_run import TrainResult as Result

    result = Result(model_dir, model_dir.name, model_fingerprint(model_dir), read_model_card(model_dir))
    return RecipeResult(result, run_dir, dict(run.stages))


# --- the stages -----------------------------------------------------------------------------------------------


def _finetune(settings: Settings, data: TrainingData, config: TrainConfig, base_path: Path, stages_dir: Path,
              run_dir: Path, notify: StageProgress, total: int) -> None:
    notify("finetune", 0, None, f"stage 1 of up to {total}: reading the data, mining negatives")
    stage_config = replace(config, name=f"{config.name}-finetune", blend=None)
    result = train_stage(settings, data, stage_config, base_path, stages_dir, step_progress(notify, "finetune"))
    record = _record("finetune", result, kept=True)
    write_json(run_dir / "finetune.json", record)
    log.info("dpr train stage finished", extra={"stage": "finetune", "dev_ndcg@10": record["dev_ndcg@10"]})
    notify("finetune", 1, 1, f"dev nDCG@10 {_dev(record)}")


def _round(settings: Settings, data: TrainingData, config: TrainConfig, rounds: RoundConfig, k: int,
           previous: dict[str, Any], stages_dir: Path, run_dir: Path, notify: StageProgress, total: int) -> None:
    label = f"round {k}"
    notify(label, 0, None, f"stage {k + 1} of up to {total}: mining {rounds.hard_negatives} negatives with "
                           f"{previous['model']}")
    round_data = replace(data, pretrain=None, mining=replace(
        data.mining, num_negatives=rounds.hard_negatives, source="dense", model=previous["path"],
        denoise=rounds.denoise))
    round_config = replace(config, name=f"{config.name}-round{k}", epochs=rounds.epochs,
                           learning_rate=rounds.learning_rate, mini_batch_size=rounds.mini_batch_size,
                           dev_baseline=False, blend=None)
    result = train_stage(settings, round_data, round_config, Path(previous["path"]), stages_dir,
                         step_progress(notify, label))
    after, before = _dev(_record(label, result, kept=False)), previous["dev_ndcg@10"]
    kept = after is not None and before is not None and after > before + rounds.min_gain
    record = {**_record(label, result, kept=kept), "dev_ndcg@10_before": before, "base": previous["model"]}
    write_json(run_dir / f"round-{k}.json", record)
    log.info("dpr train stage finished", extra={"stage": label, "dev_ndcg@10": after, "before": before, "kept": kept})
    notify(label, 1, 1, f"dev nDCG@10 {before} -> {after}: {'kept' if kept else 'not kept'}")


def _record(stage: str, result: TrainResult, kept: bool) -> dict[str, Any]:
    card = result.card
    dev = card.get("dev_metrics") or {}
    after = dev.get("after") or {}
    return {"stage": stage, "model": result.name, "path": str(result.model_dir),
            "dev_ndcg@10": round(after["ndcg@10"], 4) if "ndcg@10" in after else None,
            "dev_metrics": dev or None, "steps": card.get("steps"), "train_seconds": card.get("train_seconds"),
            "peak_rss_mib": card.get("peak_rss_mib"), "final_loss": card.get("final_loss"),
            "pairs": (card.get("training_data") or {}).get("pairs"),
            "mining": (card.get("training_data") or {}).get("mining"), "kept": kept,
            **({"pretrain": card["stages"][0]} if card.get("stages") else {})}


def _dev(record: dict[str, Any]) -> float | None:
    value = record.get("dev_ndcg@10")
    return None if value is None else float(value)


def _save(settings: Settings, config: TrainConfig, rounds: RoundConfig, records: list[dict[str, Any]],
          chosen: dict[str, Any], timings: dict[str, float], run_dir: Path, base_name: str,
          recipe: dict[str, Any] | None) -> dict[str, Any]:
    """The chosen stage's model copied into ``models_dir`` (blended first with ``--blend``) with every stage in its
    card; its ONNX towers made."""
    from encoders.towers import model_fingerprint, read_model_card
    from services.lab.shared.training_run import staging_dir, versioned_name, write_card

    models_dir = settings.models_dir
    source = Path(chosen["path"])
    if config.blend is not None:
        from services.lab.towers.wise_ft import blend_saved_model

        final = blend_saved_model(source, models_dir, config.blend, config.name).model_dir
        card = read_model_card(final)
    else:
        name = versioned_name(config.name)
        staging = staging_dir(models_dir, name)
        shutil.copytree(source, staging)
        card = read_model_card(staging)
        card.update(name=name, fingerprint=model_fingerprint(staging))
        write_card(staging, card)
        final = models_dir / name
        os.replace(staging, final)
    first = records[0]
    before = (first.get("dev_metrics") or {}).get("before")
    card["dev_metrics"] = {"before": before, "after": (chosen.get("dev_metrics") or {}).get("after")}
    stages = [first["pretrain"]] if first.get("pretrain") else []
    stages += [{**{k: r[k] for k in ("stage", "model", "dev_ndcg@10", "steps", "train_seconds", "peak_rss_mib",
                                     "final_loss", "pairs", "kept")},
                "stage_seconds": timings.get(r["stage"]), "chosen": r is chosen} for r in records]
    card["stages"] = stages
    card["recipe"] = {"command": "dpr train", "settings": recipe, "started_from": base_name, "run_dir": str(run_dir),
                      "rounds": rounds.describe(), "chosen": chosen["stage"],
                      "peak_rss_mib_note": "each stage's peak RSS is its process's peak at the end of the stage"}
    write_card(final, card)
    export_for_backends(settings, final)
    return {"model": chosen["model"], "model_dir": str(final), "saved_as": final.name}


# --- helpers --------------------------------------------------------------------------------------------------


def _finished(run_dir: Path, stage: str) -> bool:
    record = read_json(run_dir / f"{stage}.json")
    return record is not None and Path(record["path"]).is_dir()


def _eta(timings: dict[str, float], left: int) -> str:
    if left <= 0 or not timings:
        return "the last round done"
    per_stage = sum(timings.values()) / len(timings)
    return f"up to {left} more round(s), about {per_stage * left / 60:.0f} min"


HASHED_UP_TO = 256 << 20  # files up to this size are identified by their bytes, larger ones by size and time


def _data_stamp(path: Path | None) -> list[Any]:
    """What identifies the data: each file's path, size and the sha256 of its bytes (a copy, a restore or a remount
    that changes modification times still resumes; an edit does not); a file over ``HASHED_UP_TO`` by its
    modification time instead of its bytes."""
    if path is None:
        return []
    files = sorted(p for p in path.rglob("*") if p.is_file())[:500] if path.is_dir() else [path]
    return [[str(p), p.stat().st_size, sha256_of(p) if p.stat().st_size <= HASHED_UP_TO else p.stat().st_mtime_ns]
            for p in files if p.exists()]


def _run_key(data: TrainingData, config: TrainConfig, rounds: RoundConfig, base_path: Path) -> str:
    """The run directory's key: the data (and its files' sizes and times), the options, the round recipe (not the
    number of rounds: a run asked for more rounds goes on from the stages it has), the starting towers."""
    record = {"data": asdict(data), "stamp": _data_stamp(data.data), "corpus": _data_stamp(data.corpus),
              "config": {k: v for k, v in asdict(config).items() if k not in ("name", "threads")},
              "rounds": {k: v for k, v in asdict(rounds).items() if k != "rounds"}, "base": str(base_path.resolve()),
              "recipe": RECIPE_VERSION}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:12]
