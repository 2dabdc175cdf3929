"""The training run every trainer shares (the towers: ``services.lab.towers.trainer``; question-only towers:
``services.lab.towers.question_only``; the reranker: ``services.lab.reranker.trainer``), in the sentence-transformers
order: 1. model, 2. data, 3. loss, 4. evaluator (each trainer's own), then the steps here:

5-6. ``fit_in_scratch``: the trainer's arguments (``training_arguments``; ``fit_towers`` for the towers) and
   the trainer loop with progress (``fit``), run in a scratch output directory that is removed afterwards (nothing is
   checkpointed: the model is saved once, at 8);
7. evaluate (each trainer's own);
8. ``card_fields``: the fields every model card carries (base, data, hyper-parameters, seed, times, memory, steps,
   loss, dev metrics, environment), then ``save_model``: a versioned model with its card, written beside and renamed
   into place, so a half-written model is never listed.

Before them ``start_run`` sets threads and seeds. torch, transformers and sentence_transformers are imported inside
functions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from encoders.data import TrainPair
from encoders.towers import model_fingerprint, offline
from services.core.fsutil import write_atomic
from services.lab.shared.rows import pairs_fingerprint

log = logging.getLogger(__name__)

# step, total steps, latest training loss (None before the first log)
ProgressFn = Callable[[int, int, float | None], None]

MODEL_CARD = "model_card.json"
METRICS_FILE = "metrics.json"


@dataclass
class TrainResult:
    model_dir: Path
    name: str
    fingerprint: str
    card: dict[str, Any]
    losses: list[float] = field(default_factory=list)
    model: Any = None  # the trained SentenceTransformer, still in memory


def start_run(threads: int | None, seed: int) -> tuple[datetime, float]:
    """Offline, torch's threads, every seed; returns (start time, perf counter) of the run."""
    offline()
    import torch
    from transformers import set_seed

    if threads:
        torch.set_num_threads(threads)
    set_seed(seed)
    return datetime.now(UTC), time.perf_counter()


_device = "cpu"  # where this process trains and scores towers (configure_device); the product needs no GPU


def configure_device(device: str) -> None:
    """The torch device this process's training, mining and dev scoring run on (``settings.encoder.device``,
    ``DPR_ENCODER__DEVICE``): ``cpu`` unless set. A GPU only makes a run faster; nothing depends on one."""
    global _device
    _device = device


def learn_device() -> str:
    """The device ``configure_device`` set (``cpu`` by default)."""
    return _device


def precision_of(config: Any) -> str:
    """The precision a training run with ``config`` uses here: its ``precision`` (auto: chosen from the CPU by
    ``encoders.runtimes.training_precision``); fp32 on a GPU unless set (the product trains on the CPU)."""
    from encoders.runtimes import training_precision

    configured = getattr(config, "precision", "auto")
    if _device != "cpu" and configured == "auto":
        return "fp32"
    return training_precision(configured)[0]


def training_arguments(cls: Any, config: Any, output_dir: Path, **extra: Any) -> Any:
    """The trainer arguments the towers and the reranker share (``cls``: sentence-transformers' or the
    cross-encoder's arguments class), from a config with epochs, max_steps, batch_size, learning_rate,
    warmup_ratio, weight_decay and seed; ``extra`` on top."""
    from sentence_transformers.base.sampler import BatchSamplers

    arguments: dict[str, Any] = dict(
        output_dir=str(output_dir),
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        warmup_steps=config.warmup_ratio,  # transformers 5: a float below 1 is a fraction of the steps
        weight_decay=config.weight_decay,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
        report_to="none",
        seed=config.seed,
        data_seed=config.seed,
        disable_tqdm=True,
        use_cpu=_device == "cpu",
        bf16=_device == "cpu" and precision_of(config) == "bf16",  # autocast on the CPU (encoders.runtimes)
        dataloader_num_workers=0,
    )
    arguments.update(extra)  # ``extra`` may replace a shared default (the reranker's pointwise rows: batching)
    return cls(**arguments)


def fit(model: Any, args: Any, dataset: Any, loss: Any, progress: ProgressFn | None,
         trainer_class: Any = None) -> tuple[int, list[float]]:
    """Run the trainer (``SentenceTransformerTrainer`` unless ``trainer_class`` says otherwise: the reranker's
    ``CrossEncoderTrainer``); returns (steps, loss per logged step)."""
    from sentence_transformers import SentenceTransformerTrainer
    from transformers import PrinterCallback, TrainerCallback

    losses: list[float] = []

    class _Progress(TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))
                log.info("step", extra={"step": state.global_step, "loss": logs["loss"]})
            if progress is not None:
                progress(state.global_step, state.max_steps, losses[-1] if losses else None)

    trainer = (trainer_class or SentenceTransformerTrainer)(model=model, args=args, train_dataset=dataset, loss=loss,
                                                            callbacks=[_Progress()])
    trainer.remove_callback(PrinterCallback)  # it prints every log dict on stdout; progress goes through ours
    from services.lab.shared.dropout import fast_dropout  # imports torch

    on_cpu = all(p.device.type == "cpu" for p in model.parameters())  # bf16 autocast runs only there
    with fast_dropout(model) if on_cpu else contextlib.nullcontext():
        trainer.train()
    return int(trainer.state.global_step), losses


def fit_in_scratch(model: Any, arguments: Callable[[Path], Any], dataset: Any, loss: Any,
                   progress: ProgressFn | None, *, trainer_class: Any = None,
                   prefix: str = "dpr-train-") -> tuple[int, list[float]]:
    """Steps 5-6: ``arguments(scratch_dir)`` and the trainer loop (``fit``); the
    scratch directory the trainer writes to is removed whatever happens. Returns (steps, loss per logged step)."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        return fit(model, arguments(scratch), dataset, loss, progress, trainer_class=trainer_class)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def fit_towers(model: Any, config: Any, columns: Sequence[str], dataset: Any, loss: Any, progress: ProgressFn | None,
               prefix: str = "dpr-train-") -> tuple[int, list[float]]:
    """Steps 5-6 for towers: ``fit_in_scratch`` with ``towers_arguments`` over the model's own prompts."""
    prompts = dict(model.prompts or {})
    return fit_in_scratch(model, lambda out: towers_arguments(config, columns, out, prompts), dataset, loss, progress,
                          prefix=prefix)


def towers_arguments(config: Any, columns: Sequence[str], output_dir: Path, prompts: dict[str, str]) -> Any:
    """Sentence-transformers arguments for towers: the ``question`` column goes to the question tower, every other
    column to the passage tower (unless ``config.shared``), each with the model's own prompt (``query`` /
    ``document``) before its texts, as at inference."""
    from sentence_transformers import SentenceTransformerTrainingArguments

    roles = {c: ("query" if c == "question" else "document") for c in columns}
    router_mapping = {} if getattr(config, "shared", False) else roles
    column_prompts = {c: prompts.get(role, "") for c, role in roles.items()}
    return training_arguments(SentenceTransformerTrainingArguments, config, output_dir,
                              lr_scheduler_type=getattr(config, "scheduler", "linear"), router_mapping=router_mapping,
                              prompts=column_prompts if any(column_prompts.values()) else None)


def base_record(base: Path, **extra: Any) -> dict[str, Any]:
    """The card's ``base``: the model training started from."""
    return {"path": str(base), "fingerprint": model_fingerprint(base), **extra}


def data_record(pairs: Sequence[TrainPair], data_info: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    """The card's ``training_data``: what the caller recorded about the data, the pair count, the trainer's own
    figures, and the pairs' fingerprint (tells training sets apart)."""
    return {**(data_info or {}), "pairs": len(pairs), **extra, "fingerprint": pairs_fingerprint(pairs)}


def card_fields(*, base: dict[str, Any], training_data: dict[str, Any], hyperparameters: dict[str, Any], seed: int,
                started: datetime, train_seconds: float, steps: int, losses: list[float],
                dev_metrics: Any) -> dict[str, Any]:
    """Step 8: the fields every trained model's card has, in one order; a trainer adds its own around them."""
    import torch

    return {
        "base": base,
        "training_data": training_data,
        "hyperparameters": hyperparameters,
        "seed": seed,
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "train_seconds": round(train_seconds, 1),
        "peak_rss_mib": peak_rss_mib(),
        "steps": steps,
        "final_loss": losses[-1] if losses else None,
        "dev_metrics": dev_metrics,
        "environment": {"python": platform.python_version(), "torch": torch.__version__},
    }


def save_model(model: Any, models_dir: Path, name: str, card: dict[str, Any], losses: list[float], *,
               extra_files: dict[str, str] | None = None) -> TrainResult:
    """Save to a temporary sibling with the model card, then rename into place. ``extra_files`` (name -> text)
    are written beside the weights first, so they are part of the model's fingerprint."""
    staging = staging_dir(models_dir, name)
    model.save(str(staging), create_model_card=False)
    for file_name, text in (extra_files or {}).items():
        (staging / file_name).write_text(text)
    fingerprint = model_fingerprint(staging)
    card = {"name": name, "format": "sentence-transformers",
            "sentence_transformers_version": _version("sentence_transformers"), "fingerprint": fingerprint,
            "similarity": "cosine", **card}
    write_card(staging, card)
    (staging / METRICS_FILE).write_text(json.dumps({"losses": losses, "dev": card["dev_metrics"]}, indent=2) + "\n")
    final = models_dir / name
    os.replace(staging, final)
    log.info("saved model", extra={"model": name, "path": str(final), "fingerprint": fingerprint})
    return TrainResult(
        model_dir=final, name=name, fingerprint=model_fingerprint(final), card=card, losses=losses, model=model
    )


def staging_dir(models_dir: Path, name: str) -> Path:
    """Where model ``name`` is assembled before it is renamed into ``models_dir``: ``.staging-NAME``, emptied."""
    models_dir.mkdir(parents=True, exist_ok=True)
    staging = models_dir / f".staging-{name}"
    if staging.exists():
        shutil.rmtree(staging)
    return staging


def write_card(model_dir: Path, card: dict[str, Any]) -> None:
    """``model_card.json`` of ``model_dir``, replaced whole (a reader never sees half a card; not part of the
    model's fingerprint)."""
    write_atomic(model_dir / MODEL_CARD, json.dumps(card, indent=2) + "\n")


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (MiB; Linux reports KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def versioned_name(name: str, when: datetime | None = None) -> str:
    when = when or datetime.now(UTC)
    return f"{name}-{when.strftime('%Y%m%d-%H%M%S')}"


def _version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module.replace("_", "-"))
    except Exception:  # pragma: no cover
        return "unknown"
