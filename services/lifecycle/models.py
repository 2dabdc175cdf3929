"""Which model a collection should carry, over the registry (``encoders.registry``): the model's name for the
fingerprint a collection records (errors in the service's terms), the ACTIVE pointer after a swap or a rollback,
and the beat's check "does the configured model differ from the collection's?". (Towers by fingerprint:
``Runtime.towers_for``.)
"""

from __future__ import annotations

import logging
from typing import Any

from encoders import registry
from encoders.onnx_towers import split_fingerprint
from encoders.towers import passage_fingerprint, resolve_model_path
from services.core.errors import ModelMismatch
from services.core.settings import Settings
from services.lifecycle.state import ReembedState

log = logging.getLogger(__name__)


def model_name_for(settings: Settings, fingerprint: str) -> str:
    """The registry name (``base`` or a directory under models_dir) of the model with ``fingerprint``."""
    try:
        return registry.model_for_fingerprint(fingerprint, settings.models_dir)[1]
    except registry.ModelNotFound as e:
        raise ModelMismatch(str(e)) from e


def passage_compatibility(settings: Settings, model: str) -> dict[str, Any]:
    """Whether ``model``'s passage tower is the one that embedded the collection's active generation (then it
    serves the stored points at once: no re-embed). ``same``: None when there is no collection yet."""
    from services.store import open_store

    path, name = resolve_model_path(model, settings.models_dir)
    wanted = passage_fingerprint(path)
    with open_store(settings) as store:
        active = store.active()
    stored = active.spec.model if active is not None else None
    same = None if stored is None else split_fingerprint(stored)[0] == wanted
    return {"model": name, "passage_fingerprint": wanted, "collection": settings.collection,
            "collection_model": stored, "same": same, "reembed_needed": None if same is None else not same}


def promote_model(settings: Settings, state: ReembedState) -> None:
    """After the swap the new model becomes ACTIVE (the desired model), so the beat check does not undo it."""
    models_dir = settings.models_dir
    if state.model_name in registry.BUILTIN or (models_dir / state.model_name).is_dir():
        registry.activate(models_dir, state.model_name)
    else:
        log.warning("re-embedded with a model outside the models directory; ACTIVE unchanged",
                    extra={"model": state.model_name})


def check_needed(settings: Settings) -> dict[str, Any]:
    """Does the configured (ACTIVE) model differ from the collection's? (pure read; no lock)"""
    from services.store import open_store

    path, name = resolve_model_path(settings.encoder.model, settings.models_dir)
    wanted = passage_fingerprint(path)  # a question-only model's is its partner's: it serves the partner's points
    with open_store(settings) as store:
        info = store.info(counts=False)  # the records alone: the active generation stays with `dpr serve`
    if info.active is None:
        return {"needed": False, "reason": "no collection yet", "model": wanted}
    if info.active.spec.model == wanted:
        return {"needed": False, "reason": "collection already embedded by the configured model's passage tower",
                "model": wanted}
    for g in info.generations:
        st = ReembedState.from_generation(g)
        if st and st.model == wanted and st.source == info.active.name and st.status == "rejected":
            return {"needed": False, "reason": f"the gate rejected model {name} ({g.name})", "model": wanted}
    return {"needed": True, "model": wanted, "model_name": name, "collection_model": info.active.spec.model}
