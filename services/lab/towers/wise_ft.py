"""WiSE-FT (Wortsman et al. 2022): trained towers blended with the pretrained model their lineage started from.

``blend`` x the trained weights + (1 - ``blend``) x the pretrained ones keeps more of the pretrained model's quality
on collections unlike the training data. Used by ``dpr train --blend``
(``services.lab.towers.trainer``) and, after the fact, by
``dpr models blend`` (``blend_saved_model``). Model soups (``dpr models soup``, ``soup_saved_models``) average
several fine-tuned models of one lineage with the same code. torch and sentence_transformers are imported inside
functions.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from encoders.data import RetrievalDataset
from encoders.towers import model_fingerprint, offline, read_model_card
from services.lab.shared.training_run import TrainResult, save_model, versioned_name

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


def towers(model: Any) -> list[Any]:
    """The transformer modules of a sentence-transformers model, in module order (a Router: query, then document)."""
    return [module.auto_model for module in model.modules() if getattr(module, "auto_model", None) is not None]


def mix_into(target: Sequence[Any], sources: Sequence[Sequence[Mapping[str, Any]]], weights: Sequence[float]) -> int:
    """In place: each tower ``target[i]`` becomes ``weights[0]`` x its own weights + ``weights[j + 1]`` x
    ``sources[j][i]``'s, tensor by tensor (floating tensors whose name and shape every source has; the others stay
    as they are). A tensor tied to another is mixed once. Returns how many tensors were mixed."""
    import torch

    mixed = 0
    done: set[int] = set()
    with torch.no_grad():
        for i, tower in enumerate(target):
            for name, tensor in tower.state_dict().items():
                found = [source[i].get(name) for source in sources]
                others = [o for o in found if o is not None and o.shape == tensor.shape]
                if not tensor.is_floating_point() or tensor.data_ptr() in done or len(others) < len(sources):
                    continue
                done.add(tensor.data_ptr())
                tensor.mul_(weights[0])
                for weight, other in zip(weights[1:], others, strict=True):
                    tensor.add_(other.to(tensor.device, tensor.dtype), alpha=weight)
                mixed += 1
    return mixed


def blend_with_pretrained(model: Any, root: Path, blend: float) -> dict[str, Any]:
    """In place: every transformer of ``model`` becomes ``blend`` x its weights + (1 - blend) x ``root``'s (tensors
    of the same name and shape; the others stay trained). Returns what the card records."""
    from safetensors.torch import load_file

    weights = root / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"cannot blend with {root}: it has no model.safetensors (a sentence-transformers model "
                         "saved with safetensors is needed); train without --blend")
    pretrained = load_file(str(weights))
    trained = towers(model)
    blended = mix_into(trained, [[pretrained] * len(trained)], [blend, 1 - blend])
    if not blended:
        raise ValueError(f"no weight of {root} matches the trained towers; train without --blend")
    log.info("blended with the pretrained model", extra={"root": str(root), "tensors": blended, "blend": blend})
    return {"path": str(root), "fingerprint": model_fingerprint(root), "blend": blend, "tensors": blended,
            "towers": len(trained)}


BLEND_WEIGHTS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)


def load_blended(path: Path, weight: float | None) -> Any:
    """The trained model at ``path`` blended at ``weight`` in memory (1: as trained), or with ``weight`` None the
    pretrained model its lineage started from."""
    offline()
    from sentence_transformers import SentenceTransformer

    root = pretrained_root(path)
    model = SentenceTransformer(str(root if weight is None else path), device="cpu", local_files_only=True)
    if weight is not None and weight < 1:
        blend_with_pretrained(model, root, weight)
    return model


def score_blends(path: Path, dev_sets: Mapping[str, RetrievalDataset], weights: Sequence[float],
                 progress: Callable[[str], None] | None = None) -> dict[str, dict[str, float]]:
    """nDCG@10 (exact search in memory) on each of ``dev_sets`` of the pretrained root (key ``base``) and of the
    trained model at ``path`` blended at each of ``weights`` (key ``f"{w:g}"``, 1 = unblended)."""
    from services.lab.evaluation.retrieval import evaluate_model_in_memory

    out: dict[str, dict[str, float]] = {}
    for key, weight in [("base", None), *((f"{w:g}", w) for w in weights)]:
        model = load_blended(path, weight)
        out[key] = {name: round(evaluate_model_in_memory(model, dev)["ndcg@10"], 4) for name, dev in dev_sets.items()}
        if progress:
            progress(f"{key}: " + ", ".join(f"{name} {score:.4f}" for name, score in out[key].items()))
    return out


def pick_blend(scores: Mapping[str, Mapping[str, float]], weights: Sequence[float], margin: float) -> float | None:
    """The rule of ``dpr models blend --choose-on``: the mean of each candidate's dev scores; the best mean among
    the base and the blends; the largest weight whose mean is within ``margin`` of it (as much of the trained model
    as the collection does not mind). None: only the base is (the collection is served best without the model)."""
    mean = {key: sum(s.values()) / len(s) for key, s in scores.items()}
    best = max(mean.values())
    for weight in sorted(weights, reverse=True):
        if mean[f"{weight:g}"] >= best - margin:
            return weight
    return None


# A training run's own record in its card. A blend or soup made from a trained model runs no training, so its card
# (otherwise its source's: data, hyper-parameters, lineage) leaves these out rather than claim the source's.
RUN_RECORD = ("name", "fingerprint", "train_seconds", "peak_rss_mib", "steps", "final_loss", "stages",
              "blended_with", "soup")


def derived_card(source: Path, source_card: Mapping[str, Any], fingerprint: str, started: datetime,
                 **made: Any) -> dict[str, Any]:
    """The card of a model made without training (a blend, a soup) from the trained model at ``source`` (its card
    and fingerprint, which the caller has read): that card without the run's record, with ``base`` = ``source``, no
    dev metrics (measure it with ``dpr eval``), when it was made, and ``made`` (``blended_with`` or ``soup``)."""
    card = {k: v for k, v in source_card.items() if k not in RUN_RECORD}
    return {**card, "base": {"path": str(source), "fingerprint": fingerprint}, **made,
            "dev_metrics": None, "started_at": started.isoformat(timespec="seconds"),
            "finished_at": datetime.now(UTC).isoformat(timespec="seconds")}


def blend_saved_model(path: Path, models_dir: Path, blend: float, name: str | None = None,
                      record: Mapping[str, Any] | None = None) -> TrainResult:
    """WiSE-FT after training (``dpr models blend``): the trained model at ``path`` blended with the pretrained
    model its lineage started from, saved as a new model beside it (``path`` stays as it is). Its card is the
    trained model's (``derived_card``: ``base`` = ``path``, no training record of its own) with ``blended_with``
    filled in (and ``record``: how the weight was chosen). ``name`` defaults to the trained model's name +
    ``-blend`` + the blend."""
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
    card = derived_card(path, source, model_fingerprint(path), started, blended_with={**blended, **dict(record or {})})
    stem = name or re.sub(r"-\d{8}-\d{6}$", "", str(source.get("name") or path.name)) + f"-blend{blend:g}"
    return save_model(model, models_dir, versioned_name(stem, started), card, [])


def soup_saved_models(paths: Sequence[Path], models_dir: Path, name: str | None = None) -> TrainResult:
    """A uniform model soup (Wortsman et al. 2022, "Model soups"): the average of the weights of models fine-tuned
    from one starting model (``dpr models soup``), saved as a new model (the ingredients stay as they are). Every
    ingredient must have the first one's towers, tensor for tensor. Its card is the first ingredient's
    (``derived_card``: ``base`` = that ingredient, no training record of its own) with ``soup`` listing all of
    them."""
    if len(paths) < 2:
        raise ValueError("a soup needs at least two models; give two or more trained models of one lineage")
    if len(set(paths)) < len(paths):
        raise ValueError("a soup lists each model once; a model given twice would weigh double")
    offline()
    from sentence_transformers import SentenceTransformer

    started = datetime.now(UTC)
    models = [SentenceTransformer(str(p), device="cpu", local_files_only=True) for p in paths]
    target = towers(models[0])
    expected = sum(t.is_floating_point() for tower in target for t in tower.state_dict().values())
    sources = []
    for path, other in zip(paths[1:], models[1:], strict=True):
        other_towers = towers(other)
        shapes = [{k: t.shape for k, t in tower.state_dict().items()} for tower in other_towers]
        if shapes != [{k: t.shape for k, t in tower.state_dict().items()} for tower in target]:
            raise ValueError(f"{path} does not have the towers of {paths[0]} (tower count, tensor names or shapes "
                             "differ); a soup averages models trained from one starting model")
        sources.append([tower.state_dict() for tower in other_towers])
    share = 1 / len(paths)
    mixed = mix_into(target, sources, [share] * len(paths))
    if mixed != expected:
        raise ValueError(f"only {mixed} of {expected} tensors could be averaged; the models differ")
    source = read_model_card(paths[0])
    fingerprints = [model_fingerprint(p) for p in paths]
    card = derived_card(paths[0], source, fingerprints[0], started, soup=[
        {"path": str(p), "fingerprint": f, "weight": share} for p, f in zip(paths, fingerprints, strict=True)])
    stem = name or re.sub(r"-\d{8}-\d{6}$", "", str(source.get("name") or paths[0].name)) + f"-soup{len(paths)}"
    log.info("model soup", extra={"models": [str(p) for p in paths], "tensors": mixed})
    return save_model(models[0], models_dir, versioned_name(stem, started), card, [])
