"""The recipe skeleton every trainer follows (the towers: ``services.lab.towers.trainer``; question-only towers:
``services.lab.towers.question_only``; the reranker: ``services.lab.reranker.trainer``), in the sentence-transformers
order:

1. model, 2. data, 3. loss, 4. evaluator (each trainer's own), then the shared steps here:
5-6. ``fit_in_scratch``: the trainer's arguments (``towers_arguments`` for the towers) and the trainer loop, run in a
   scratch output directory that is removed afterwards (nothing is checkpointed: the model is saved once, at 8);
7. evaluate (each trainer's own);
8. ``card_fields``: the fields every model card carries (base, data, hyper-parameters, seed, times, memory, steps,
   loss, dev metrics, environment), then ``services.lab.shared.training_run.save_model``.

torch and sentence_transformers are imported inside functions.
"""

from __future__ import annotations

import platform
import shutil
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from encoders.data import TrainPair
from encoders.towers import model_fingerprint
from services.lab.shared.rows import pairs_fingerprint
from services.lab.shared.training_run import ProgressFn, fit, peak_rss_mib, training_arguments


def fit_in_scratch(model: Any, arguments: Callable[[Path], Any], dataset: Any, loss: Any,
                   progress: ProgressFn | None, *, trainer_class: Any = None,
                   prefix: str = "dpr-train-") -> tuple[int, list[float]]:
    """Steps 5-6: ``arguments(scratch_dir)`` and the trainer loop (``services.lab.shared.training_run.fit``); the
    scratch directory the trainer writes to is removed whatever happens. Returns (steps, loss per logged step)."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        return fit(model, arguments(scratch), dataset, loss, progress, trainer_class=trainer_class)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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
