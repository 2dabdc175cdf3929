"""What `dpr status` reports, built once for the CLI and for GET /v1/status (so `dpr status` over DPR_API_URL prints
the same thing the local command does)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from services.core.errors import DprError
from services.core.settings import Settings
from services.store.points import CollectionInfo, GenerationInfo

if TYPE_CHECKING:
    from services.store.protocol import VectorStore


def collection_status(settings: Settings, info: CollectionInfo, store: VectorStore | None = None) -> dict[str, Any]:
    """Collection, active generation, point counts, model fingerprints, and the queue depth with a broker; with
    ``store``, the active generation's search ef and where its vectors live, and why (``Store.search_ef``,
    ``Store.memory``)."""
    from encoders.towers import model_fingerprint, resolve_model_path

    model_path, model_name = resolve_model_path(settings.encoder.model, settings.models_dir)
    active = info.active
    data: dict[str, Any] = {
        "collection": info.alias,
        "backend": info.backend,
        "exists": active is not None,
        "generation": active.name if active else None,
        "points": active.count if active else 0,
        "model": active.spec.model if active else None,
        "dim": active.spec.dim if active else None,
        "sparse": active.spec.sparse if active else None,
        "search_settings": active.spec.settings if active else {},
        "generations": [
            {"name": g.name, "points": g.count, "model": g.spec.model, "active": g.active}
            for g in info.generations if _unfinished(settings, g, info.alias) is None
        ],
        "unfinished": [u for u in (_unfinished(settings, g, info.alias) for g in info.generations) if u is not None],
        "configured_model": {"name": model_name, "fingerprint": model_fingerprint(model_path)},
        "towers": _towers(settings, model_path),
        "broker": settings.broker_url is not None,
    }
    data["model_matches"] = data["model"] in (None, data["configured_model"]["fingerprint"])
    data["disk"] = disk_status(settings)
    from services.feedback import counts_in  # judgements of search hits (docs/feedback.md)

    data["feedback"] = counts_in(settings.data_dir, info.alias)
    from services.sources.schedule import sources_status  # `dpr sources`: last sync, outcome, counts, next run

    data["sources"] = sources_status(settings.data_dir, info.alias, settings.collection)
    data.update(_serving(settings, info, data["configured_model"]))
    data["search_ef"] = store.search_ef(active.name) if store is not None and active is not None else None
    data["memory"] = store.memory(active.name) if store is not None and active is not None else None
    if settings.broker_url:
        from workers.executor import broker_refusal, queue_depth

        data["queue_depth"] = queue_depth(settings)
        refused = broker_refusal(settings)  # a full broker disk: reads go on, ingest is refused
        if refused:
            data["broker_warning"] = refused
    return data


def _towers(settings: Settings, model_path: Any) -> dict[str, Any]:
    """Per tower, the runtime and precision that run it here, why (chosen from the CPU, or set), and what its
    export measured against fp32 (``encoders.runtimes``)."""
    from encoders.registry import runtime_report

    sides: tuple[tuple[str, Literal["document", "query"]], ...] = (("passages", "document"), ("questions", "query"))
    return {side: runtime_report(model_path, settings.models_dir, settings.onnx_cache_dir,
                                 settings.encoder.choice(role), role) for side, role in sides}


def _unfinished(settings: Settings, g: GenerationInfo, alias: str) -> dict[str, Any] | None:
    """A generation a re-embed is building (or gave up on), never answered from: shown apart from the collection's
    generations, with its builder (a process, or the workers' job and lease: services.lifecycle.builder) and
    whether it still runs (None when it cannot be told here)."""
    from services.lifecycle.builder import builder
    from services.lifecycle.state import ReembedState

    st = ReembedState.from_generation(g)
    if g.active or st is None or st.status not in ("building", "abandoned"):
        return None
    owner = builder(settings, st, alias) if st.status == "building" else None
    alive = owner["alive"] if owner is not None else False
    if st.status == "abandoned":
        next_step = "dropped by `dpr gc`"
    elif alive is False:
        next_step = f"its builder died: `dpr reembed --model {st.model_name}` resumes it, `dpr gc` drops it"
    else:
        next_step = "being built (re-embed in progress)"
    return {"name": g.name, "points": g.count, "model": g.spec.model, "model_name": st.model_name,
            "status": st.status, "source": st.source, "started": st.started,
            "owner": (owner or {"pid": st.pid or None, "host": st.host or None, "job": None, "lease": None})
            | {"alive": alive}, "next": next_step}


def disk_status(settings: Settings) -> dict[str, Any]:
    """Free space on the data dir's disk; ``low`` below 4 x DPR_MIN_FREE_MB, ``writes_refused`` below it."""
    from services.core.diskspace import disk_space

    data = disk_space(settings.data_dir).to_json(settings.min_free_mb)
    if data["writes_refused"]:
        data["warning"] = (f"{data['free_mb']} MB free on {data['path']}, under DPR_MIN_FREE_MB={settings.min_free_mb}:"
                           " writes are refused (reads go on); free space there")
    elif data["low"]:
        data["warning"] = (f"only {data['free_mb']} MB free on {data['path']}; writes stop below "
                           f"{settings.min_free_mb} MB (DPR_MIN_FREE_MB)")
    return data


def _serving(settings: Settings, info: CollectionInfo, configured: dict[str, str]) -> dict[str, Any]:
    """What answers a query: the default mode and why (``serving_mode``), the active generation's model by name, the
    rollback target."""
    from services.lifecycle.models import model_name_for
    from services.lifecycle.rollback import previous_generation
    from services.lifecycle.state import MODEL_NAME_KEY
    from services.store.common import serving_mode

    active = info.active
    if active is None:
        return {"default_mode": None, "serving": None, "model_name": None, "rollback": None}
    name = active.spec.settings.get(MODEL_NAME_KEY)
    if not isinstance(name, str) and active.spec.model == configured["fingerprint"]:
        name = configured["name"]
    elif not isinstance(name, str):
        try:
            name = model_name_for(settings, active.spec.model)
        except DprError:  # the model that built it is no longer here; `dpr status` says "differs"
            name = None
    previous = previous_generation(info)
    serving = serving_mode(active.spec)
    return {
        "default_mode": serving.mode,
        "serving": {"mode": serving.mode, "source": serving.source, "reason": serving.reason,
                    "fusion": {k: serving.fusion[k] for k in ("fusion", "rrf_k", "linear_weight", "candidates")
                               if k in serving.fusion}},
        "model_name": name,
        "rollback": None if previous is None else {
            "generation": previous.name, "points": previous.count, "model": previous.spec.model,
        },
    }
