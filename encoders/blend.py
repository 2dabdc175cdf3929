"""WiSE-FT (Wortsman et al. 2022): trained towers blended with the pretrained model their lineage started from.

``blend`` x the trained weights + (1 - ``blend``) x the pretrained ones keeps more of the pretrained model's quality
on collections unlike the training data. Used by ``dpr train --blend`` (``encoders.train``) and, after the fact, by
``dpr models blend`` (``blend_saved_model``). torch and sentence_transformers are imported inside functions.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from encoders.towers import model_fingerprint, read_model_card
from encoders.training_run import TrainResult, offline, save_model, versioned_name

log = logging.getLogger(__name__)


def pretrained_root(path: Path) -> Path:
    """The pretrained model a lineage of trained models started from: follow each model card's ``base`` until a
    model without a card (the base model's wheel, multilingual's conversion)."""
    seen: set[Path] = set()
    while path not in seen:
        seen.add(path)
        parent = (read_model_card(path).get("base") or {}).get("path")
        if not parent or not Path(parent).is_dir():
            return path
        path = Path(parent)
    return path


def blend_with_pretrained(model: Any, root: Path, blend: float) -> dict[str, Any]:
    """In place: every transformer of ``model`` becomes ``blend`` x its weights + (1 - blend) x ``root``'s (tensors
    of the same name and shape; the others stay trained). Returns what the card records."""
    import torch
    from safetensors.torch import load_file

    weights = root / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"cannot blend with {root}: it has no model.safetensors (a sentence-transformers model "
                         "saved with safetensors is needed); train without --blend")
    pretrained = load_file(str(weights))
    blended = towers = 0
    done: set[int] = set()  # storage already blended (a tensor tied to another is blended once)
    with torch.no_grad():
        for module in model.modules():
            auto = getattr(module, "auto_model", None)
            if auto is None:
                continue
            towers += 1
            for name, tensor in auto.state_dict().items():
                start = pretrained.get(name)
                if (start is not None and start.shape == tensor.shape and tensor.is_floating_point()
                        and tensor.data_ptr() not in done):
                    done.add(tensor.data_ptr())
                    tensor.mul_(blend).add_(start.to(tensor.dtype), alpha=1 - blend)
                    blended += 1
    if not blended:
        raise ValueError(f"no weight of {root} matches the trained towers; train without --blend")
    log.info("blended with the pretrained model", extra={"root": str(root), "tensors": blended, "blend": blend})
    return {"path": str(root), "fingerprint": model_fingerprint(root), "blend": blend, "tensors": blended,
            "towers": towers}


def blend_saved_model(path: Path, models_dir: Path, blend: float, name: str | None = None) -> TrainResult:
    """WiSE-FT after training (``dpr models blend``): the trained model at ``path`` blended with the pretrained
    model its lineage started from, saved as a new model beside it (``path`` stays as it is). Its card is the
    trained model's with ``base`` = ``path``, ``blended_with`` filled in and no dev metrics (measure it with
    ``dpr eval``). ``name`` defaults to the trained model's name + ``-blend`` + the blend."""
    root = pretrained_root(path)
    if root == path:
        raise ValueError(f"{path} has no model card naming the model it was trained from, so there is nothing to "
                         "blend it with; blend a model that `dpr train` made")
    offline()
    from sentence_transformers import SentenceTransformer

    started = datetime.now(UTC)
    model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    blended = blend_with_pretrained(model, root, blend)
    source = read_model_card(path)
    card = {**source, "base": {"path": str(path), "fingerprint": model_fingerprint(path)},
            "blended_with": blended, "dev_metrics": None, "started_at": started.isoformat(timespec="seconds"),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds")}
    for key in ("name", "fingerprint"):
        card.pop(key, None)
    stem = name or re.sub(r"-\d{8}-\d{6}$", "", str(source.get("name") or path.name)) + f"-blend{blend:g}"
    return save_model(model, models_dir, versioned_name(stem, started), card, [])
