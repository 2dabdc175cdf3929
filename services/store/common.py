"""Engine-free logic of the store front end: generation names, the validation rules (one function per rule,
also called by ``services/query.py`` and ``services/lab/hybrid/tuning.py``), the engine-neutral filter, linear
fusion and per-document state.

Kept apart from ``points.py`` (records and converters) and ``frontend.py`` (the ``Store`` that sequences these
decisions) so that every rule has one home; the engines only translate the neutral records into their calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from services.core.errors import CollectionNotFound, ConfigError, Conflict, ModelMismatch
from services.store.points import CollectionSpec, DocState, PassagePoint, SearchMode, SearchRequest

GENERATION_FORMAT = "{alias}__g{number:04d}"
SPEC_METADATA_KEY = "dpr_spec"  # server: key of the spec inside the collection's metadata
DISTANCES = ("cosine", "dot", "euclid")
SEARCH_MODES = ("dense", "sparse", "hybrid")
FUSIONS = ("rrf", "linear")
# A payload key a filter can name: dot-separated segments (a dot walks into a nested object), the first starting
# with a letter or '_'; no empty segment ("a..b", "a.", ".a"), no spaces. Both engines parse it as a JSON path.
FILTER_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$"
FILTER_KEY_MAX_CHARS = 64
FILTER_KEY_FORM = (
    f"1-{FILTER_KEY_MAX_CHARS} characters: letters, digits, '_' or '-', starting with a letter or '_'; "
    "dots only between names (a.b), e.g. lang or meta.year"
)


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


def check_compatible(alias: str, generation: str | None, stored: CollectionSpec, wanted: CollectionSpec) -> None:
    """Raise ``ModelMismatch`` unless ``wanted`` can write to / query a generation built as ``stored``."""
    if (stored.dim, stored.distance, stored.model) == (wanted.dim, wanted.distance, wanted.model):
        return
    where = f"collection {alias!r}" + (f" (generation {generation})" if generation else "")
    raise ModelMismatch(
        f"{where} was embedded with model {stored.model!r} (dim {stored.dim}, {stored.distance}), but the towers "
        f"at hand are {wanted.model!r} (dim {wanted.dim}, {wanted.distance}); query with the model that built it "
        "(DPR_ENCODER__MODEL / `dpr models activate`) or re-embed with `dpr reembed`"
    )


def check_dense_dim(alias: str, generation: str, spec: CollectionSpec, vector: Sequence[float], what: str) -> None:
    if len(vector) != spec.dim:
        raise ModelMismatch(
            f"{what} has dimension {len(vector)} but collection {alias!r} (generation {generation}) holds "
            f"dimension {spec.dim} vectors of model {spec.model!r}; encode with the model that built it or "
            "re-embed with `dpr reembed`"
        )


def check_at_least_one(name: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}")


def check_mode(mode: str) -> None:
    if mode not in SEARCH_MODES:
        raise ConfigError(f"unknown search mode {mode!r}; use {', '.join(SEARCH_MODES)}")


def check_fusion(fusion: str) -> None:
    if fusion not in FUSIONS:
        raise ConfigError(f"unknown fusion {fusion!r}; use {' or '.join(FUSIONS)}")


def check_linear_weight(weight: float) -> None:
    if not 0.0 <= weight <= 1.0:
        raise ConfigError(f"linear weight {weight:g} is out of range; use 0..1 (the weight of the dense score)")


def require_sparse(alias: str, generation: str | None, spec: CollectionSpec, mode: str) -> None:
    """Sparse and hybrid search need a generation built with BM25 vectors."""
    if mode == "dense" or spec.sparse:
        return
    where = f"collection {alias!r}" + (f" (generation {generation})" if generation else "")
    raise Conflict(
        f"{where} is dense-only: it has no BM25 sparse vectors, so {mode} search cannot run; use mode dense, "
        "or re-ingest / re-embed it (`dpr reembed`) with sparse vectors enabled to add them"
    )


# The label-free default: what a collection with BM25 vectors and no labelled tuning (`dpr tune-hybrid`) serves.
# Chosen among fixed fusions (RRF k=60; linear, dense weight 0.5) on SciFact's held-out train queries, then read on
# SciFact, Cranfield, CISI and the Debian PDF questions with the base towers through the store
# (benchmarks/results/quality/hybrid.md, "Label-free default"); KorQuAD's hybrid was measured with the same fusion.
LABEL_FREE_FUSION: dict[str, Any] = {"fusion": "linear", "linear_weight": 0.5}
LABEL_FREE_EVIDENCE = ("nDCG@10 0.729 / 0.417 / 0.449 vs dense 0.660 / 0.382 / 0.420 and RRF k=60 0.716 / 0.416 / "
                       "0.448 on SciFact / Cranfield / CISI test, no labels (benchmarks/results/quality/hybrid.md)")


@dataclass(frozen=True)
class ServingMode:
    """The mode and fusion a query that names no mode gets, and why (``dpr status`` shows ``reason``)."""

    mode: SearchMode
    fusion: dict[str, Any]  # fusion, rrf_k, linear_weight, candidates: what the query leaves unset
    source: str  # tuned | label-free | dense-only
    reason: str


def fusion_label(fusion: Mapping[str, Any]) -> str:
    if fusion.get("fusion", "rrf") == "rrf":
        return f"rrf k={fusion.get('rrf_k', 60)}"
    return f"linear, dense weight {fusion.get('linear_weight', 0.5)}"


def serving_mode(spec: CollectionSpec) -> ServingMode:
    """The collection's tuned choice (``dpr tune-hybrid``, labelled dev questions), else the label-free default;
    dense where the generation has no BM25 vectors to fuse."""
    tuned = dict(spec.settings.get("hybrid") or {})
    if not spec.sparse:
        return ServingMode("dense", tuned, "dense-only", "dense: this generation has no BM25 sparse vectors, so "
                           "hybrid cannot run; re-embed it (`dpr reembed`) to add them")
    if spec.settings.get("mode"):
        on = tuned.get("tuned_on") or {}
        return ServingMode(spec.settings["mode"], tuned, "tuned", (
            f"tuned on {on.get('dataset', '?')} ({on.get('queries', '?')} dev questions): {fusion_label(tuned)}, "
            f"{tuned.get('metric', 'score')} {tuned.get('dev_score')} (dense {tuned.get('dense_score')}, "
            f"bm25 {tuned.get('sparse_score')})"))
    return ServingMode("hybrid", dict(LABEL_FREE_FUSION), "label-free", (
        f"label-free default: hybrid {fusion_label(LABEL_FREE_FUSION)}, measured {LABEL_FREE_EVIDENCE}; "
        "`dpr tune-hybrid DATA` tunes it on labelled questions"))


def validate_request(alias: str, generation: str, spec: CollectionSpec, request: SearchRequest) -> None:
    """Reject a search that cannot make sense for this generation, before it reaches the engine."""
    check_at_least_one("search k", request.k)
    check_at_least_one("search candidates", request.candidates)
    check_mode(request.mode)
    require_sparse(alias, generation, spec, request.mode)
    if request.mode != "dense" and request.sparse is None:
        raise ConfigError(f"{request.mode} search needs a sparse query vector (services.store.sparse.embed_query)")
    if request.mode != "sparse":
        if request.dense is None:
            raise ConfigError(f"{request.mode} search needs a dense query vector from the question tower")
        check_dense_dim(alias, generation, spec, request.dense, "the query vector")
    if request.mode == "hybrid":
        check_fusion(request.fusion)
        if request.fusion == "rrf":
            check_at_least_one("rrf_k", request.rrf_k)
        else:
            check_linear_weight(request.linear_weight)


# --- the engine-neutral filter: every engine translates these three records and nothing else -----------------


@dataclass(frozen=True)
class Match:
    """``key`` equals ``values[0]`` (``any_of`` False) or is one of ``values`` (all ``str`` or all ``int``)."""

    key: str
    values: tuple[str | int | bool, ...]
    any_of: bool = False

    def any_values(self) -> list[str] | list[int]:
        return cast("list[str] | list[int]", list(self.values))


@dataclass(frozen=True)
class AtLeast:
    """``key`` (an integer payload field) is at least ``value``."""

    key: str
    value: int


@dataclass(frozen=True)
class Where:
    """Every ``must``, at least one ``should`` (when given), no ``must_not``."""

    must: tuple[Condition, ...] = ()
    should: tuple[Condition, ...] = ()
    must_not: tuple[Condition, ...] = ()


Condition = Match | AtLeast | Where


def build_filter(where: Where, make: Callable[..., Any], field: Callable[[Match | AtLeast], Any]) -> Any:
    """An engine's filter from ``where``: ``make(must=, should=, must_not=)`` per level, ``field`` per condition."""

    def one(condition: Condition) -> Any:
        return build_filter(condition, make, field) if isinstance(condition, Where) else field(condition)

    return make(
        must=[one(c) for c in where.must] or None,
        should=[one(c) for c in where.should] or None,
        must_not=[one(c) for c in where.must_not] or None,
    )


def filter_key_problem(key: object) -> str | None:
    """Why ``key`` cannot name a payload field in a filter (None: it can). The one rule for filter keys: the API's
    schema, ``dpr query --filter`` and the store all ask this function."""
    if not isinstance(key, str) or not 1 <= len(key) <= FILTER_KEY_MAX_CHARS or not re.fullmatch(
        FILTER_KEY_PATTERN, key
    ):
        return f"filter key {key!r} is not a payload field name; use {FILTER_KEY_FORM}"
    return None


def check_filter_key(key: object) -> None:
    problem = filter_key_problem(key)
    if problem is not None:
        raise ConfigError(problem)


def request_filter(filters: Mapping[str, Any]) -> Where | None:
    """``{key: value | [values]}`` as a ``Where``; refuses keys that are not field names and values Qdrant cannot
    match exactly."""
    if not filters:
        return None
    conditions = []
    for key, value in filters.items():
        check_filter_key(key)
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
            conditions.append(Match(key, values, any_of=True))
        else:
            if not isinstance(value, str | int | bool):
                raise ConfigError(
                    f"filter {key!r}={value!r}: only strings, integers and booleans can be matched exactly"
                )
            conditions.append(Match(key, (value,)))
    return Where(must=tuple(conditions))


def documents_filter(doc_ids: Sequence[str]) -> Where:
    return Where(must=(Match("doc_id", tuple(doc_ids), any_of=True),))


def document_versions(points: Sequence[PassagePoint]) -> dict[str, tuple[str, int]]:
    """Each document among ``points`` with the version they hold: (doc hash, chunks), for ``stale_filter``.
    Refuses points that hold two versions of one document (a caller's bug: which one would be kept?)."""
    versions: dict[str, tuple[str, int]] = {}
    for p in points:
        doc_hash, chunks = versions.get(p.passage.doc_id, (p.passage.doc_hash, 0))
        if doc_hash != p.passage.doc_hash:
            raise ConfigError(f"points hold two versions of document {p.passage.doc_id!r}; replace one at a time")
        versions[p.passage.doc_id] = (doc_hash, max(chunks, p.passage.chunk_index + 1))
    return versions


def stale_filter(doc_id: str, keep_doc_hash: str, keep_chunks: int) -> Where:
    """The document's points of another version, or beyond its first ``keep_chunks`` chunks."""
    return Where(
        must=(Match("doc_id", (doc_id,)),),
        should=(Where(must_not=(Match("doc_hash", (keep_doc_hash,)),)), AtLeast("chunk_index", keep_chunks)),
    )


# (point id, score, payload)
Scored = tuple[str, float, dict[str, Any]]


def scored(points: Sequence[Any]) -> list[Scored]:
    """Either engine's scored points (qdrant-edge's or qdrant-client's) as the store's ``Scored``."""
    return [(str(p.id), float(p.score), dict(p.payload or {})) for p in points]


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


@dataclass
class DocGroup:
    """One document's points that share a (doc_hash, model): how many, the latest ``ingested_at``, their jobs."""

    count: int = 0
    latest: str = ""
    jobs: set[str] = field(default_factory=set)
    file_sig: str = ""  # the file signature its points carry (services.readers.filesig), if any


def pick_doc_state(groups: Mapping[tuple[str, str], DocGroup]) -> tuple[str, str, DocGroup]:
    """Reduce one document's points, grouped by (doc_hash, model).

    One group: that hash, model and group. Several groups mean an interrupted re-ingest left two versions:
    the newest group (by ``ingested_at``) gives the model and the count, and the doc hash is reported as ""
    so the document never looks unchanged and the next ingest rewrites it and deletes the stale points.
    """
    (doc_hash, model), group = max(groups.items(), key=lambda item: (item[1].latest, item[1].count))
    if len(groups) > 1:
        doc_hash = ""
    return doc_hash, model, group


# doc id -> (doc_hash, model) -> its points
DocStateGroups = dict[str, dict[tuple[str, str], DocGroup]]


def add_doc_state(groups: DocStateGroups, payload: Mapping[str, Any]) -> None:
    """Fold one point's payload (doc_id, doc_hash, model, ingested_at, job) into ``groups``."""
    doc = groups.setdefault(str(payload.get("doc_id")), {})
    group = doc.setdefault((str(payload.get("doc_hash", "")), str(payload.get("model", ""))), DocGroup())
    group.count += 1
    group.latest = max(group.latest, str(payload.get("ingested_at", "")))
    if payload.get("job"):
        group.jobs.add(str(payload["job"]))
    if payload.get("file_sig"):
        group.file_sig = str(payload["file_sig"])


def doc_states_from(groups: DocStateGroups) -> dict[str, DocState]:
    states = {}
    for doc_id, doc_groups in groups.items():
        doc_hash, model, group = pick_doc_state(doc_groups)
        states[doc_id] = DocState(doc_id=doc_id, doc_hash=doc_hash, model=model, chunks=group.count,
                                  jobs=frozenset(group.jobs), file_sig=group.file_sig if doc_hash else "")
    return states
