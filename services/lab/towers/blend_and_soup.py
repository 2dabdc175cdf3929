"""`dpr models blend` and `dpr models soup`: new models made from trained ones without training (WiSE-FT after the
fact, the blend weight chosen on a collection's pseudo-questions, model soups), each saved under ``models_dir``
with its ONNX towers. The weights arithmetic is ``services.lab.towers.wise_ft``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from encoders.data import DEV_SPLIT_SEED
from services.core.errors import ConfigError
from services.core.settings import Settings
from services.lab.towers.recipe import collection_corpus, export_for_backends, unlabelled_corpus

if TYPE_CHECKING:
    from services.lab.shared.training_run import TrainResult

log = logging.getLogger(__name__)


def blend_model(settings: Settings, model: str, blend: float, name: str | None = None) -> TrainResult:
    """``dpr models blend``: WiSE-FT of a trained model after the fact
    (``services.lab.towers.wise_ft.blend_saved_model``), saved as a new model under ``models_dir`` with its ONNX
    towers."""
    from encoders.towers import resolve_model_path
    from services.lab.towers.wise_ft import blend_saved_model

    path, _ = resolve_model_path(model, settings.models_dir)
    result = blend_saved_model(path, settings.models_dir, blend, name)
    export_for_backends(settings, result.model_dir)
    return result


@dataclass(frozen=True)
class BlendChoice:
    """``dpr models blend --choose-on``: the scores every candidate got on the target corpus's pseudo-questions,
    the weight the rule picked (None: the base model; 1: the model unblended) and the blended model saved for it
    (None when nothing was blended)."""

    source: str
    dev_sets: dict[str, dict[str, int]]
    scores: dict[str, dict[str, float]]
    margin: float
    weight: float | None
    result: TrainResult | None


def choose_blend(settings: Settings, model: str, *, data: Path | None = None, collection: str | None = None,
                 fmt: str = "auto", weights: tuple[float, ...] | None = None, queries: int = 500,
                 margin: float = 0.005, name: str | None = None,
                 progress: Callable[[str], None] | None = None) -> BlendChoice:
    """WiSE-FT with the weight chosen for a collection that has no labelled questions: pseudo-questions from its
    own documents (``services.lab.shared.self_supervised.pseudo_query_sets``: titles and ICT sentences), nDCG@10 of the
    pretrained base and of ``model`` blended at each weight (``services.lab.towers.wise_ft.score_blends``), the rule of
    ``services.lab.towers.wise_ft.pick_blend``; the pick is saved as ``dpr models blend --weight`` would save it, with
    the scores in its card. Nothing is saved when the base itself or the unblended model is the pick."""
    from encoders.towers import resolve_model_path
    from services.lab.shared.self_supervised import pseudo_query_sets
    from services.lab.towers.wise_ft import BLEND_WEIGHTS, pick_blend, pretrained_root, score_blends

    if (data is None) == (collection is None):
        raise ConfigError("choose the blend on one corpus: give DATA (a BEIR folder or corpus JSONL) or a collection")
    path, _ = resolve_model_path(model, settings.models_dir)
    if pretrained_root(path) == path:
        raise ValueError(f"{path} has no model card naming the model it was trained from, so there is nothing to "
                         "blend it with; blend a model that `dpr train` made")
    if collection is not None:
        corpus, source = collection_corpus(settings, collection), f"collection:{collection}"
    else:
        assert data is not None
        corpus, source = unlabelled_corpus(data, fmt), str(data)
    weights = tuple(sorted(set(weights or BLEND_WEIGHTS), reverse=True))
    if any(not 0 < w <= 1 for w in weights):
        raise ConfigError(f"blend weights must lie in (0, 1], got {weights}")
    dev_sets = pseudo_query_sets(corpus, queries=queries, seed=DEV_SPLIT_SEED, name=source)
    sizes = {k: {"queries": len(d.queries), "documents": len(d.corpus)} for k, d in dev_sets.items()}
    log.info("choosing the blend weight", extra={"source": source, "dev_sets": sizes, "weights": weights})
    scores = score_blends(path, dev_sets, weights, progress=progress)
    weight = pick_blend(scores, weights, margin)
    result = None
    if weight is not None and weight < 1:  # 1: the model as it is serves the collection best
        from services.lab.towers.wise_ft import blend_saved_model

        record = {"chosen_on": {"source": source, "dev_sets": sizes, "scores": scores, "margin": margin,
                                "rule": "largest weight within margin of the best mean pseudo-question nDCG@10"}}
        result = blend_saved_model(path, settings.models_dir, weight, name, record=record)
        export_for_backends(settings, result.model_dir)
    return BlendChoice(source, sizes, scores, margin, weight, result)


def soup_models(settings: Settings, models: list[str], name: str | None = None) -> TrainResult:
    """``dpr models soup``: the uniform average of trained models of one lineage (``services.lab.towers.wise_ft``),
    saved as a new model under ``models_dir`` with its ONNX towers."""
    from encoders.towers import resolve_model_path
    from services.lab.towers.wise_ft import soup_saved_models

    paths = [resolve_model_path(model, settings.models_dir)[0] for model in models]
    result = soup_saved_models(paths, settings.models_dir, name)
    export_for_backends(settings, result.model_dir)
    return result
