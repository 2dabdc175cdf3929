"""`dpr adapt CORPUS`: adapt the towers to a corpus nobody labelled, from its documents alone (docs/adapt.md says
what each stage does and why).

The stages (``StagedRun``) write their outputs into the run directory (``DATA_DIR/adapt/<name>-<key>``, the key a
hash of the corpus file and the options), so a killed run started again with the same name and options skips every
finished stage: ``pseudo-questions`` (``pseudo.json``), with ``feedback`` the users' judgements (``feedback.json``),
``mining`` (``mining.json``, ``services.lab.adaptation.mining_stage``), ``training`` (``training.json``), ``dev
evaluation`` (``dev.json``). Then the winner (or, with no dev gain, the best candidate) is saved as
``NAME-YYYYmmdd-HHMMSS`` with the recipe, the teacher and the dev figures in its card (``result.json`` records it, so a
re-run saves nothing twice); it is activated only on a dev gain. The corpus's queries and qrels are never opened.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.core.errors import ConfigError
from services.core.settings import Settings
from services.lab.adaptation.mining_stage import distill_stage, mining_stage, pseudo_sets
from services.lab.adaptation.teacher import TeacherConfig
from services.lab.shared.stages import StagedRun, StageProgress, read_json, step_progress, write_json
from services.readers.beir import corpus_file

if TYPE_CHECKING:
    from services.lab.shared.self_supervised import PseudoKind

log = logging.getLogger(__name__)

MIN_JUDGED_DEV = 5  # held-out judged questions needed for them to choose the model
RECIPE_VERSION = 2  # part of the run key: a changed recipe never resumes an older run's stages
QUESTION_ONLY_KINDS: tuple[PseudoKind, ...] = ("title", "ict", "keywords")  # the --question-only recipe's probes
QUESTION_ONLY_QUERIES = 1000

AdaptProgress = StageProgress  # stage, done, total (None: not known yet), a short note


@dataclass(frozen=True)
class AdaptConfig:
    """The options of `dpr adapt`; every choice beyond them is made on the dev pseudo-questions."""

    name: str = "adapt"
    fmt: str = "auto"
    base: str = "active"  # the towers adapted (and the dev baseline)
    question_only: bool = False
    feedback: bool = False  # also learn from (and choose on) the judgements stored with the collection
    # pseudo-question kinds (services.lab.shared.self_supervised.pseudo_query_sets)
    kinds: tuple[PseudoKind, ...] = ("title", "ict")
    queries: int = 500  # pseudo-questions per kind
    max_documents: int = 5000
    dev_share: float = 0.2
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    epochs_grid: tuple[float, ...] = (1.0, 2.0)
    blend_grid: tuple[float, ...] = (0.5,)  # WiSE-FT weights of the best full-training candidate toward the start
    batch_size: int = 32
    learning_rate: float = 3e-5
    max_steps_per_epoch: int = -1  # > 0: at most this many steps per epoch of the grid (tests, quick runs)
    max_query_tokens: int = 64
    train_passage_tokens: int | None = 128
    min_gain: float = 0.005  # mean dev nDCG@10 the winner must gain over the start
    language: str | None = None
    seed: int = 42
    threads: int | None = None

    @classmethod
    def recipe(cls, question_only: bool = False, queries: int | None = None, hard_negatives: int = 1,
               **fields: Any) -> AdaptConfig:
        """The default recipe of each mode: full training learns the hybrid-agreement teacher's hard negatives on
        titles and ICT sentences (500 each); ``question_only`` learns hybrid search's scores (the distillation
        teacher) on titles, ICT sentences and keywords (1,000 each) at lr 2e-5, which research/hybrid_distill
        chose on SciFact's train claims."""
        if question_only:
            fields.setdefault("learning_rate", 2e-5)
            return cls(question_only=True, kinds=QUESTION_ONLY_KINDS, queries=queries or QUESTION_ONLY_QUERIES,
                       teacher=TeacherConfig(distill=True), **fields)
        return cls(queries=queries or 500, teacher=TeacherConfig(negatives=hard_negatives), **fields)

    def key(self, corpus_file: Path, judged: str | None = None) -> str:
        st = corpus_file.stat()
        record = {k: v for k, v in asdict(self).items() if k not in ("name", "threads")}
        record.update(corpus=str(corpus_file.resolve()), size=st.st_size, mtime=st.st_mtime_ns, recipe=RECIPE_VERSION)
        if judged is not None:  # what was judged: new judgements start a new run
            record["judged"] = judged
        return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:12]


@dataclass
class AdaptResult:
    run_dir: Path
    model: str
    model_dir: Path
    activated: bool
    gain: float
    choice: str | None  # the winning candidate; None: no dev gain
    stages: dict[str, str]  # stage -> ran | skipped
    card: dict[str, Any]


def adapt(settings: Settings, corpus: Path, config: AdaptConfig, *, progress: AdaptProgress | None = None,
          activate: bool = False) -> AdaptResult:
    """Run (or resume) the stages; save the chosen model; with ``activate``, activate it on a dev gain."""
    from encoders.towers import resolve_model_path
    from services.lab.shared.training_run import configure_device

    configure_device(settings.encoder.device)  # cpu unless DPR_ENCODER__DEVICE says otherwise
    if not 0 < config.dev_share < 1:
        raise ConfigError(f"the dev share must lie in (0, 1), got {config.dev_share}")
    if not config.epochs_grid or any(e <= 0 for e in config.epochs_grid):
        raise ConfigError(f"the epochs grid needs positive values, got {config.epochs_grid}")
    if any(not 0 < w < 1 for w in config.blend_grid):
        raise ConfigError(f"blend weights must lie in (0, 1), got {config.blend_grid}")
    if config.teacher.distill and not config.question_only:
        raise ConfigError("the distillation teacher trains the question tower only: use it with --question-only")
    source = corpus_file(corpus, config.fmt)
    base_path, base_name = resolve_model_path(config.base, settings.models_dir)
    judged = _judgements_digest(settings) if config.feedback else None
    run_dir = settings.data_dir / "adapt" / f"{config.name}-{config.key(source, judged)}"
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "run.json", {"corpus": str(source), "base": base_name, "base_path": str(base_path),
                                       "config": asdict(config)})
    run = StagedRun(run_dir, progress)
    notify, stage, stages, timings = run.notify, run.stage, run.stages, run.timings

    t0 = time.perf_counter()
    stage("pseudo-questions", (run_dir / "pseudo.json").is_file(),
          lambda: _pseudo_stage(source, config, run_dir, notify))
    pseudo = read_json(run_dir / "pseudo.json")
    if config.feedback:
        stage("feedback", (run_dir / "feedback.json").is_file(),
              lambda: _feedback_stage(settings, config, run_dir, notify))
    judged_record = read_json(run_dir / "feedback.json") if config.feedback else None
    stage("mining", (run_dir / "mining.json").is_file(),
          lambda: (distill_stage(source, pseudo, base_path, config.teacher, config.language, config.seed, run_dir,
                                 notify, settings) if config.teacher.distill
                   else mining_stage(pseudo, base_path, config.teacher, config.language, run_dir, notify, settings)))
    mining = read_json(run_dir / "mining.json")
    stage("training", _training_done(run_dir, config),
          lambda: _training_stage(pseudo, mining, judged_record, base_path, base_name, config, run_dir, notify,
                                  source))
    training = read_json(run_dir / "training.json")
    stage("dev evaluation", (run_dir / "dev.json").is_file(),
          lambda: _dev_stage(pseudo, judged_record, training, base_path, config, run_dir, notify,
                             settings.encoder.batch_size))
    dev = read_json(run_dir / "dev.json")
    result = read_json(run_dir / "result.json")
    if result is None:
        result = _save_stage(settings, run_dir, pseudo, mining, judged_record, training, dev, base_path, base_name,
                             config, timings, source, activate)
    elif activate and dev["choice"] and not result["activated"]:  # a finished run, asked again with --activate
        from encoders.registry import activate as activate_model

        activate_model(settings.models_dir, result["model"])
        result = {**result, "activated": True}
        write_json(run_dir / "result.json", result)
    log.info("adapt finished", extra={"seconds": round(time.perf_counter() - t0, 1), "stages": stages})
    from encoders.towers import read_model_card

    model_dir = Path(result["model_dir"])
    return AdaptResult(run_dir=run_dir, model=result["model"], model_dir=model_dir, activated=result["activated"],
                       gain=dev["gain"], choice=dev["choice"], stages=stages, card=read_model_card(model_dir))


# --- the stages -----------------------------------------------------------------------------------------------


def _pseudo_stage(source: Path, config: AdaptConfig, run_dir: Path, notify: AdaptProgress) -> None:
    from services.lab.adaptation.teacher import dataset_to_json, dev_split
    from services.lab.shared.self_supervised import pseudo_query_sets
    from services.readers.beir import load_corpus

    notify("pseudo-questions", 0, 1, "reading the corpus")
    corpus = load_corpus(source)
    try:
        sets = pseudo_query_sets(corpus, queries=config.queries, seed=config.seed, max_documents=config.max_documents,
                                 name=source.parent.name if source.name.startswith("corpus.") else source.stem,
                                 kinds=config.kinds)
    except ValueError as e:
        raise ConfigError(str(e).replace("choose the blend weight with `dpr eval` on labelled questions instead",
                                         "dpr adapt needs pseudo-questions; train on labelled pairs instead")) from e
    record: dict[str, Any] = {"documents": len(corpus), "sets": {}, "split": {}}
    for kind, dataset in sets.items():
        train_ids, dev_ids = dev_split(dataset, config.dev_share, config.seed)
        record["sets"][kind] = dataset_to_json(dataset)
        record["split"][kind] = {"train": train_ids, "dev": dev_ids}
    write_json(run_dir / "pseudo.json", record)
    notify("pseudo-questions", 1, 1, ", ".join(f"{k} {len(d.queries)}" for k, d in sets.items()))


def _judgements_digest(settings: Settings) -> str:
    from services.feedback import FeedbackStore, digest, no_pairs_error

    with FeedbackStore.in_data_dir(settings.data_dir) as judgements_store:
        judgements = judgements_store.judgements(settings.collection)
    if not any(j.relevant for j in judgements):
        raise no_pairs_error(settings.collection, len(judgements))
    return digest(judgements)


def _feedback_stage(settings: Settings, config: AdaptConfig, run_dir: Path, notify: AdaptProgress) -> None:
    """The judged questions: a held-out share (split as the pseudo-questions are) to choose on, the rest as pairs."""
    from services.feedback import collection_judged, judged_dataset, no_pairs_error, pairs_of
    from services.lab.adaptation.teacher import dataset_to_json, dev_split, pair_to_json

    notify("feedback", 0, 1, f"reading the judgements of {settings.collection!r}")
    judgements, entries = collection_judged(settings)
    dataset = judged_dataset(entries, f"judged-{settings.collection}")
    train_ids, dev_ids = dev_split(dataset, config.dev_share, config.seed)
    held = {dataset.queries[q] for q in dev_ids}
    pairs = pairs_of(e for e in entries if e.question not in held)
    if not pairs:
        raise no_pairs_error(settings.collection, len(judgements))
    write_json(run_dir / "feedback.json", {
        "collection": settings.collection, "judgements": len(judgements), "questions": len(dataset.queries),
        "train_questions": len(train_ids), "dev_questions": len(dev_ids),
        "pairs": [pair_to_json(p) for p in pairs], "dev": dataset_to_json(dataset.subset(dev_ids))})
    notify("feedback", 1, 1, f"{len(train_ids)} judged questions to train on, {len(dev_ids)} held out")


def _candidate_key(epochs: float) -> str:
    return f"epochs-{epochs:g}"


def _training_done(run_dir: Path, config: AdaptConfig) -> bool:
    done = (read_json(run_dir / "training.json") or {}).get("candidates", {})
    return all(_candidate_key(e) in done for e in config.epochs_grid)


def _training_stage(pseudo: dict[str, Any], mining: dict[str, Any], judged: dict[str, Any] | None, base_path: Path,
                    base_name: str, config: AdaptConfig, run_dir: Path, notify: AdaptProgress,
                    source: Path | None = None) -> None:
    from services.lab.adaptation.teacher import pair_from_json
    from services.lab.towers.trainer import TrainConfig

    pairs = [pair_from_json(row) for row in [*mining["pairs"], *(judged["pairs"] if judged else [])]]
    record = read_json(run_dir / "training.json") or {"candidates": {}}
    out_dir = run_dir / "training"
    soft = None
    if mining.get("soft") is not None and source is not None:  # distillation: the corpus as it is, the soft targets
        from services.readers.beir import load_corpus

        table = load_corpus(source)
        soft = [tuple(t) for t in mining["soft"]] + [None] * (len(pairs) - len(mining["soft"]))
    else:  # question-only: every passage a negative
        table = max(pseudo_sets(pseudo).values(), key=lambda d: len(d.corpus)).corpus
    for epochs in config.epochs_grid:
        key = _candidate_key(epochs)
        if key in record["candidates"] and Path(record["candidates"][key]["path"]).is_dir():
            continue  # finished before the run was stopped
        steps = config.max_steps_per_epoch * epochs if config.max_steps_per_epoch > 0 else -1
        train_config = TrainConfig(
            name=f"{config.name}-{key}", epochs=epochs, batch_size=min(config.batch_size, len(pairs)),
            learning_rate=config.learning_rate, max_steps=int(round(steps)) if steps > 0 else -1,
            max_query_tokens=config.max_query_tokens, seed=config.seed, threads=config.threads,
            question_only=config.question_only,
            train_passage_tokens=None if config.question_only else config.train_passage_tokens,
        )
        on_step = step_progress(notify, f"training ({key})")
        if config.question_only:
            from services.lab.towers.question_only import train_question_only

            result = train_question_only(pairs, out_dir, train_config, base=base_path, partner_name=base_name,
                                         corpus=table, data_info=_data_info(pseudo, mining, judged), progress=on_step,
                                         soft_targets=soft)
        else:
            from services.lab.towers.trainer import train

            result = train(pairs, out_dir, train_config, base=base_path, data_info=_data_info(pseudo, mining, judged),
                           progress=on_step)
        card = result.card
        record["candidates"][key] = {"path": str(result.model_dir), "epochs": epochs, "steps": card.get("steps"),
                                     "train_seconds": card.get("train_seconds"),
                                     "peak_rss_mib": card.get("peak_rss_mib"), "final_loss": card.get("final_loss")}
        write_json(run_dir / "training.json", record)


def _data_info(pseudo: dict[str, Any], mining: dict[str, Any], judged: dict[str, Any] | None) -> dict[str, Any]:
    info = {"dataset": "pseudo-questions (dpr adapt)", "documents": pseudo["documents"],
            "pairs_by_mode": mining["stats"]["pairs_by_mode"], "language": mining["language"]}
    if judged:
        info.update(dataset="pseudo-questions and judgements (dpr adapt --feedback)",
                    judged_pairs=len(judged["pairs"]), judged_collection=judged["collection"])
    return info


def _dev_stage(pseudo: dict[str, Any], judged: dict[str, Any] | None, training: dict[str, Any], base_path: Path,
               config: AdaptConfig, run_dir: Path, notify: AdaptProgress, batch_size: int = 32) -> None:
    """nDCG@10 on the held-out pseudo-questions (and judged questions) of the start, each candidate and the best
    one's blends; the pick. Scores are kept as they come (``dev.partial.json``): a stop scores nothing twice."""
    from services.lab.adaptation.teacher import dataset_from_json, load_model, mean_score, pick_candidate
    from services.lab.evaluation.retrieval import encode_corpus, evaluate_model_in_memory

    sets = pseudo_sets(pseudo)
    dev = {kind: sets[kind].subset(pseudo["split"][kind]["dev"], name=f"{sets[kind].name}-dev")
           for kind in sets if pseudo["split"][kind]["dev"]}
    if judged and judged["dev"]["queries"]:
        dev["judged"] = dataset_from_json(judged["dev"])
    gate = ["judged"] if judged and judged["dev_questions"] >= MIN_JUDGED_DEV else list(dev)
    if not dev:
        raise ConfigError("the held-out slice of pseudo-questions is empty; the corpus is too small to choose on")
    partial = read_json(run_dir / "dev.partial.json") or {"scores": {}, "blend": None}
    scores: dict[str, dict[str, float]] = partial["scores"]
    models = [("base", base_path, None), *((k, Path(c["path"]), None) for k, c in training["candidates"].items())]
    total = len(models) + (0 if config.question_only else len(config.blend_grid))

    shared: dict[str, Any] = {}  # question-only: each dev set's passage vectors, encoded once (one passage tower)

    def score(key: str, model: Any) -> None:
        notify("dev evaluation", len(scores), total, key)
        row = {}
        for kind, d in dev.items():
            if config.question_only and kind not in shared:
                shared[kind] = encode_corpus(model, d, batch_size)
            vectors = shared.get(kind) if config.question_only else None
            row[kind] = round(evaluate_model_in_memory(model, d, batch_size=batch_size,
                                                       doc_vectors=vectors)["ndcg@10"], 4)
        scores[key] = row
        write_json(run_dir / "dev.partial.json", partial)

    for key, path, _ in models:
        if key not in scores:
            score(key, load_model(path))
    scores_gate = {key: {k: v for k, v in row.items() if k in gate} for key, row in scores.items()}
    trained = {k: v for k, v in scores_gate.items() if k in training["candidates"]}
    best = max(trained, key=lambda k: mean_score(trained[k]))
    if not config.question_only and config.blend_grid:
        from services.lab.towers.wise_ft import blend_with_pretrained

        for weight in config.blend_grid:
            key = f"{best}-blend-{weight:g}"
            if key in scores or partial.get("blend_error"):
                continue
            model = load_model(training["candidates"][best]["path"])
            try:
                blend_with_pretrained(model, base_path, weight)
            except ValueError as e:  # the start's weights do not match the towers (e.g. not safetensors)
                partial["blend_error"] = str(e)
                write_json(run_dir / "dev.partial.json", partial)
                break
            score(key, model)
    scores_gate = {key: {k: v for k, v in row.items() if k in gate} for key, row in scores.items()}
    candidates = {k: v for k, v in scores_gate.items() if k != "base"}
    choice, gain = pick_candidate(scores_gate["base"], candidates, config.min_gain)
    best_any = max(candidates, key=lambda k: mean_score(candidates[k]))
    write_json(run_dir / "dev.json", {
        "queries": {kind: len(d.queries) for kind, d in dev.items()}, "scores": scores, "gate": gate,
        "mean": {k: round(mean_score(v), 4) for k, v in scores_gate.items()}, "choice": choice, "best": best_any,
        "gain": round(gain, 4), "min_gain": config.min_gain, "blend_error": partial.get("blend_error"),
        "rule": f"the candidate with the best mean nDCG@10 over {' + '.join(gate)} (held out), if it beats the "
                "start by more than min_gain"})
    notify("dev evaluation", total, total, f"gain {gain:+.4f}")


KIND_NOTES = {"title": "a title asks for its documents' bodies",
               "ict": "a sentence asks for its document without it",
               "keywords": "3-5 of a document's heaviest tf-idf words ask for it"}


def _save_stage(settings: Settings, run_dir: Path, pseudo: dict[str, Any], mining: dict[str, Any],
                judged: dict[str, Any] | None, training: dict[str, Any], dev: dict[str, Any], base_path: Path,
                base_name: str, config: AdaptConfig, timings: dict[str, Any], source: Path,
                activate: bool) -> dict[str, Any]:
    """The winner (the best candidate when none gains) saved under ``models_dir`` with the adaptation record in
    its card; activated on a gain."""
    from encoders.registry import activate as activate_model
    from encoders.towers import model_fingerprint, read_model_card
    from services.lab.shared.training_run import peak_rss_mib, staging_dir, versioned_name, write_card
    from services.lab.towers.recipe import export_for_backends

    key = dev["choice"] or dev["best"]
    epochs_key = key.split("-blend-")[0]
    candidate = Path(training["candidates"][epochs_key]["path"])
    name = versioned_name(config.name)
    models_dir = settings.models_dir
    staging = staging_dir(models_dir, name)
    card = read_model_card(candidate)
    if "-blend-" in key:
        from services.lab.adaptation.teacher import load_model
        from services.lab.towers.wise_ft import blend_with_pretrained

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
    write_json(run_dir / "result.json", result)
    return result


def _training_note(config: AdaptConfig) -> str:
    if config.question_only and config.teacher.distill:
        return "question tower only, the teacher's scores learnt by KL over each pseudo-question's candidates"
    if config.question_only:
        return "question tower only, every passage a negative"
    return "MNRL, in-batch + teacher hard negatives"
