"""Engine-free logic both adapters share: generation names, spec checks, request validation, linear fusion.

Kept apart from ``points.py`` (records and converters) so that the adapters stay thin: each one only
translates these decisions into its engine's calls.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from services.errors import CollectionNotFound, ConfigError, ModelMismatch
from services.store.points import CollectionSpec, DocState, SearchRequest

GENERATION_FORMAT = "{alias}__g{number:04d}"
SPEC_METADATA_KEY = "dpr_spec"  # server: key of the spec inside the collection's metadata
DISTANCES = ("cosine", "dot", "euclid")


def generation_name(alias: str, number: int) -> str:
    return GENERATION_FORMAT.format(alias=alias, number=number)


def generation_number(alias: str, name: str) -> int | None:
    """``3`` for ``{alias}__g0003``; None for any other name."""
    match = re.fullmatch(re.escape(alias) + r"__g(\d{4,})", name)
    return int(match.group(1)) if match else None


def missing_collection(alias: str, backend: str) -> CollectionNotFound:
    return CollectionNotFound(
        f"collection {alias!r} does not exist in the {backend} store yet: ingest something first (`dpr ingest PATH`)"
    )


def missing_generation(alias: str, generation: str) -> CollectionNotFound:
    return CollectionNotFound(
        f"generation {generation!r} of collection {alias!r} does not exist; `dpr info` lists the generations kept"
    )


def validate_spec(spec: CollectionSpec) -> None:
    if spec.dim < 1:
        raise ConfigError(f"collection dimension must be positive, got {spec.dim}")
    if spec.distance not in DISTANCES:
        raise ConfigError(f"unknown distance {spec.distance!r}; use one of {', '.join(DISTANCES)}")
    if not spec.model:
        raise ConfigError("a collection spec needs the model fingerprint of the passage tower")


def check_compatible(alias: str, generation: str, stored: CollectionSpec, wanted: CollectionSpec) -> None:
    """Raise ``ModelMismatch`` unless ``wanted`` can write to / query a generation built as ``stored``."""
    if (stored.dim, stored.distance, stored.model) == (wanted.dim, wanted.distance, wanted.model):
        return
    raise ModelMismatch(
        f"collection {alias!r} (generation {generation}) was embedded with model {stored.model!r} "
        f"(dim {stored.dim}, {stored.distance}), but the towers at hand are {wanted.model!r} "
        f"(dim {wanted.dim}, {wanted.distance}); re-embed with `dpr reembed` or query with the model that built it"
    )


def check_dense_dim(alias: str, generation: str, spec: CollectionSpec, vector: Sequence[float], what: str) -> None:
    if len(vector) != spec.dim:
        raise ModelMismatch(
            f"{what} has dimension {len(vector)} but collection {alias!r} (generation {generation}) holds "
            f"dimension {spec.dim} vectors of model {spec.model!r}; encode with the model that built it or "
            "re-embed with `dpr reembed`"
        )


def validate_request(alias: str, generation: str, spec: CollectionSpec, request: SearchRequest) -> None:
    """Reject a search that cannot make sense for this generation, before it reaches the engine."""
    if request.k < 1:
        raise ConfigError(f"search k must be at least 1, got {request.k}")
    if request.candidates < 1:
        raise ConfigError(f"search candidates must be at least 1, got {request.candidates}")
    if request.mode not in ("dense", "sparse", "hybrid"):
        raise ConfigError(f"unknown search mode {request.mode!r}; use dense, sparse or hybrid")
    if request.mode in ("sparse", "hybrid"):
        if not spec.sparse:
            raise ConfigError(
                f"collection {alias!r} (generation {generation}) is dense-only: it has no BM25 vectors, so "
                f"{request.mode} search cannot run; use mode 'dense', or re-ingest / `dpr reembed` with sparse "
                "vectors enabled to add them"
            )
        if request.sparse is None:
            raise ConfigError(f"{request.mode} search needs a sparse query vector (services.sparse.embed_query)")
    if request.mode in ("dense", "hybrid"):
        if request.dense is None:
            raise ConfigError(f"{request.mode} search needs a dense query vector from the question tower")
        check_dense_dim(alias, generation, spec, request.dense, "the query vector")
    if request.mode == "hybrid":
        if request.fusion not in ("rrf", "linear"):
            raise ConfigError(f"unknown fusion {request.fusion!r}; use rrf or linear")
        if request.fusion == "rrf" and request.rrf_k < 1:
            raise ConfigError(f"rrf_k must be at least 1, got {request.rrf_k}")
        if request.fusion == "linear" and not 0.0 <= request.linear_weight <= 1.0:
            raise ConfigError(f"linear_weight must lie in [0, 1], got {request.linear_weight}")


@dataclass(frozen=True)
class FilterClause:
    """One ``request.filters`` entry: ``key`` equals ``values[0]`` (``any_of`` False) or is one of ``values``.

    With ``any_of`` the values are all ``str`` or all ``int`` (what Qdrant's match-any accepts).
    """

    key: str
    values: tuple[str | int | bool, ...]
    any_of: bool

    def any_values(self) -> list[str] | list[int]:
        return cast("list[str] | list[int]", list(self.values))


def filter_clauses(filters: Mapping[str, Any]) -> list[FilterClause]:
    """Normalise ``{key: value | [values]}`` into clauses; refuses values Qdrant cannot match exactly."""
    clauses = []
    for key, value in filters.items():
        if isinstance(value, list | tuple | set | frozenset):
            values = tuple(value)
            if not values:
                raise ConfigError(f"filter {key!r} has an empty list of values; drop it or give at least one")
            kinds = {type(v) for v in values}
            if len(kinds) > 1 or not kinds <= {str, int}:
                raise ConfigError(
                    f"filter {key!r}: a list matches strings or integers, all of one type, got "
                    f"{sorted(k.__name__ for k in kinds)}"
                )
            clauses.append(FilterClause(key, values, any_of=True))
        else:
            _check_filter_value(key, value)
            clauses.append(FilterClause(key, (value,), any_of=False))
    return clauses


def _check_filter_value(key: str, value: object) -> None:
    if not isinstance(value, str | int | bool):
        raise ConfigError(f"filter {key!r}={value!r}: only strings, integers and booleans can be matched exactly")


# (point id, score, payload)
Scored = tuple[str, float, dict[str, Any]]


def min_max(scores: Sequence[float], higher_is_better: bool = True) -> list[float]:
    """Scale scores to [0, 1], best = 1. A branch whose scores are all equal maps to 1.0 each."""
    if not scores:
        return []
    low, high = min(scores), max(scores)
    if high == low:
        return [1.0] * len(scores)
    if higher_is_better:
        return [(s - low) / (high - low) for s in scores]
    return [(high - s) / (high - low) for s in scores]


def linear_fusion(
    dense: Sequence[Scored],
    sparse: Sequence[Scored],
    weight: float,
    k: int,
    dense_higher_is_better: bool = True,
) -> list[Scored]:
    """DPR-style hybrid: ``w * dense_norm + (1 - w) * sparse_norm`` over min-max-normalised branch scores.

    A passage missing from one branch's candidates scores 0 in that branch. Ties break on point id so the
    result is deterministic.
    """
    payloads: dict[str, dict[str, Any]] = {}
    fused: dict[str, float] = {}
    branches = (
        (dense, weight, dense_higher_is_better),
        (sparse, 1.0 - weight, True),
    )
    for hits, w, higher in branches:
        for (pid, _, payload), norm in zip(hits, min_max([s for _, s, _ in hits], higher), strict=True):
            payloads.setdefault(pid, payload)
            fused[pid] = fused.get(pid, 0.0) + w * norm
    ranked = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:k]
    return [(pid, score, payloads[pid]) for pid, score in ranked]


def pick_doc_state(groups: Mapping[tuple[str, str], tuple[int, str]]) -> tuple[str, str, int]:
    """Reduce one document's points, grouped by (doc_hash, model) -> (count, latest ingested_at).

    One group: that hash, model and count. Several groups mean an interrupted re-ingest left two versions:
    the newest group (by ``ingested_at``) gives the model and the count, and the doc hash is reported as ""
    so the document never looks unchanged and the next ingest rewrites it and deletes the stale points.
    """
    (doc_hash, model), (count, _) = max(groups.items(), key=lambda item: (item[1][1], item[1][0]))
    if len(groups) > 1:
        doc_hash = ""
    return doc_hash, model, count


# doc id -> (doc_hash, model) -> (points, latest ingested_at)
DocStateGroups = dict[str, dict[tuple[str, str], tuple[int, str]]]


def add_doc_state(groups: DocStateGroups, payload: Mapping[str, Any]) -> None:
    """Fold one point's payload (doc_id, doc_hash, model, ingested_at) into ``groups``."""
    doc = groups.setdefault(str(payload.get("doc_id")), {})
    key = (str(payload.get("doc_hash", "")), str(payload.get("model", "")))
    count, latest = doc.get(key, (0, ""))
    doc[key] = (count + 1, max(latest, str(payload.get("ingested_at", ""))))


def doc_states_from(groups: DocStateGroups) -> dict[str, DocState]:
    states = {}
    for doc_id, doc_groups in groups.items():
        doc_hash, model, chunks = pick_doc_state(doc_groups)
        states[doc_id] = DocState(doc_id=doc_id, doc_hash=doc_hash, model=model, chunks=chunks)
    return states
