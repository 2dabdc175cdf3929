"""Trained models under one models directory: list, show, activate.

A model is a directory ``models_dir/<name>-YYYYmmdd-HHMMSS`` holding a sentence-transformers model and
``model_card.json``. ``models_dir/ACTIVE`` names the active model (``base`` or a directory name); it is replaced
atomically (write a temporary file, fsync, rename), and ``encoders.towers.resolve_model_path("active", ...)`` reads it.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from encoders.towers import base_model_path, model_fingerprint, read_model_card

ACTIVE_FILE = "ACTIVE"


class ModelNotFound(LookupError):
    """No model of that name under the models directory."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    active: bool
    card: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        card = self.card
        dev = (card.get("dev_metrics") or {}).get("after") or {}
        return {
            "name": self.name,
            "active": self.active,
            "path": str(self.path),
            "fingerprint": card.get("fingerprint"),
            "towers": card.get("towers"),
            "trained_at": card.get("finished_at"),
            "data": (card.get("training_data") or {}).get("dataset"),
            "dev_ndcg@10": dev.get("ndcg@10"),
        }


def active_name(models_dir: Path) -> str:
    """The ACTIVE model name, ``base`` when none is activated."""
    path = models_dir / ACTIVE_FILE
    if path.is_file():
        name = path.read_text().strip()
        if name:
            return name
    return "base"


def list_models(models_dir: Path) -> list[ModelEntry]:
    """Every trained model (directories with a model card), newest first, plus nothing for the base model."""
    if not models_dir.is_dir():
        return []
    active = active_name(models_dir)
    entries = []
    for path in models_dir.iterdir():
        if not path.is_dir() or path.name.startswith("."):
            continue
        if not (path / "modules.json").is_file() and not (path / "model_card.json").is_file():
            continue
        entries.append(ModelEntry(path.name, path, path.name == active, read_model_card(path)))
    entries.sort(key=lambda e: (str(e.card.get("finished_at") or ""), e.name), reverse=True)
    return entries


def show_model(models_dir: Path, name: str) -> ModelEntry:
    if name == "base":
        path = base_model_path()
        card = {"name": "base", "base": str(path), "fingerprint": model_fingerprint(path), "towers": "shared"}
        return ModelEntry("base", path, active_name(models_dir) == "base", card)
    path = models_dir / name
    if not path.is_dir() or name.startswith(".") or "/" in name:
        known = ", ".join(e.name for e in list_models(models_dir)) or "none"
        raise ModelNotFound(f"no model {name!r} under {models_dir} (known: {known}); see `dpr models list`")
    card = read_model_card(path)
    if "fingerprint" not in card:
        card = {**card, "fingerprint": model_fingerprint(path)}
    return ModelEntry(name, path, active_name(models_dir) == name, card)


def activate(models_dir: Path, name: str) -> ModelEntry:
    """Make ``name`` (or ``base``) the active model; the ACTIVE file is replaced atomically."""
    entry = show_model(models_dir, name)  # raises ModelNotFound
    if name != "base" and not (entry.path / "modules.json").is_file():
        raise ModelNotFound(f"{entry.path} holds no sentence-transformers model (no modules.json); retrain it")
    models_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ACTIVE.", dir=models_dir)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, models_dir / ACTIVE_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return ModelEntry(entry.name, entry.path, True, entry.card)
