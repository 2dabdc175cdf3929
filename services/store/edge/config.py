"""The embedded shard's config for a collection spec: the one place both the serving process (``edge.py``) and the
index build's child process (``edge_index.py``) read it, so neither imports the other.

``EdgeLevers`` are the memory levers a generation is created with (``settings.edge``: int8 scalar quantization,
original vectors and payloads on disk, HNSW m / ef_construct; docs/capacity.md). They are recorded beside the
generation's spec (``levers.json``) because the index build reloads the shard with a config, and a dense vector's
memory placement that the reload does not repeat falls back to RAM (measured on qdrant-edge 0.9.0: a ``Cold``
vector storage came back ``InRamMmap`` after ``optimize()``); quantization and payload placement persist.
``levers_from`` / ``search_params_from`` read them from the settings (``dense_params``: the rescoring an int8
generation needs); ``budget_levers`` chooses the levers the settings leave unset from the memory budget, at creation
and at each index build (whose reload applies a changed choice to the segments it builds). The generation's folder
names (``SHARD``; ``recover_swap`` finishes an index swap a crash cut short) and the last index build's record
(``index.json``, written by ``index.py``) are read here too: every query needs them, the build's machinery it does
not. Below: the converters of the store's neutral records to qdrant-edge's types and back (pure functions; in
this module so `dpr query` loads one module for both).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from qdrant_edge import (
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeSparseVectorParams,
    EdgeVectorParams,
    FieldCondition,
    Filter,
    HnswIndexConfig,
    IntegerIndexParams,
    KeywordIndexParams,
    MatchAny,
    MatchValue,
    Memory,
    Modifier,
    Point,
    QuantizationSearchParams,
    Query,
    QueryRequest,
    RangeFloat,
    ScalarQuantizationConfig,
    ScalarType,
    SearchParams,
    UpdateOperation,
)
from qdrant_edge import SparseVector as EdgeSparseVector

from services.core.fsutil import json_or_empty, write_atomic
from services.store.common import AtLeast, Match, Where, build_filter
from services.store.points import DENSE, INDEXED_INTEGERS, INDEXED_KEYWORDS, SPARSE, CollectionSpec, SparseVector
from services.store.protocol import Branch, PointRecord, Vector

if TYPE_CHECKING:
    from services.core.store_settings import EdgeSettings

log = logging.getLogger(__name__)

_DISTANCES = {"cosine": Distance.Cosine, "dot": Distance.Dot, "euclid": Distance.Euclid}
# The graph where the settings leave (m, ef_construct) unset: above Qdrant's 16 / 100, whose graph needed three times
# the search ef for recall@10 0.98 (100k passages: calibrated ef 768 vs 256, dense p50 8.0 vs 5.3 ms, for a build
# 1.7x as long: benchmarks/results/query-speed/scale.md). full_scan_threshold in KB
_HNSW_M, _HNSW_EF_CONSTRUCT, _FULL_SCAN_KB = 32, 200, 10_000
LEVERS_FILE = "levers.json"  # a generation's EdgeLevers, beside spec.json (the index build repeats them)
INDEX_RECORD = "index.json"  # the last index build's (``index.py``)
SHARD, BUILD, NEXT, OLD = "shard", "shard.build", "shard.next", "shard.old"  # the shard, and an index build's swap
QUANTILE = 0.99  # int8 range from the 0.99 quantile of the values (Qdrant's quantization guide)
BUDGETED = ("quantization", "vectors_on_disk")  # the levers the memory budget chooses where the settings leave them
# From this many points a generation whose fp32 vectors stay in RAM also gets an int8 copy (fp32 re-scoring) where
# it fits the budget: HNSW over int8 is the faster search and build. 100,000 passages, each at its calibrated ef:
# dense p50 2.0-2.7 ms against 3.3-3.4 ms for fp32, build 55 s against 284 s, for 37 MB more (scale.md, "The int8
# copy for speed"); at 50,000 earlier, 1.0-1.4 against 1.3-2.3 ms. Smaller collections are mostly scanned exactly.
SPEED_COPY_POINTS = 50_000
BUDGET_SHARE = 0.05  # of the RAM: a 24 GB machine keeps up to ~700k 384-dim fp32 vectors in RAM (docs/capacity.md)
_MB = 2**20
# int8 candidates re-scored per hit wanted where no setting says: at 50k, ef 512, recall@10 0.990 vs 0.960 with k
# alone (whose calibration ran out of ladder at ef 2048, 0.962); on fp32 vectors a no-op (docs/capacity.md)
OVERSAMPLING = 2.0
# An HNSW build splits a generation into one segment per CPU core, each of at least PART_FACTOR x the index
# threshold (default 50,000 points): the engine searches a shard's segments side by side on its own threads (Python's
# lock is not theirs), and each smaller graph reaches the recall target at a lower ef (measured with 50,000- and
# 500,000-point parts; smaller ones were not, and a search of so few points is fast already). Kept apart by the
# optimizer's segment number and size bounds, which also stop a later build's merge from rebuilding a whole graph for
# a few new points (scale.md, "One graph per CPU core")
PART_FACTOR = 10
PART_SLACK = 1.5  # a segment may grow to this many times an even share before a merge stops joining it


@dataclass(frozen=True)
class EdgeLevers:
    """How a generation's vectors and payloads are stored (fixed when it is created)."""

    quantization: Literal["none", "int8"] = "none"
    vectors_on_disk: bool = False
    payload_on_disk: bool = True  # the engine's own default (payload memory Cold)
    hnsw_m: int | None = None
    hnsw_ef_construct: int | None = None
    int8_on_disk: bool = False  # the int8 copy memory-mapped too (the budget's last step; never a setting)
    segments: int | None = None  # the most segments a build makes (None: one per CPU core)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> EdgeLevers:
        known = {k: v for k, v in (data or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


def edge_config(
    spec: CollectionSpec, levers: EdgeLevers, indexing_threshold_kb: int | None = None, points: int = 0
) -> EdgeConfig:
    """The shard's config; with ``indexing_threshold_kb`` (the index build), segments above it get HNSW and, where
    ``points`` make ``build_segments`` more than one, the optimizer merges segments only beyond twice that many, and
    only into one of at most ``PART_SLACK`` x an even share: a build's new points get a graph of their own, small
    ones are merged with each other, never the parts with each other (the engine's own defaults merged a build's new
    points and everything else into one graph built anew)."""
    optimizers = None
    if indexing_threshold_kb is not None:
        parts = build_segments(points, indexing_threshold_kb, spec.dim, levers.segments)
        optimizers = EdgeOptimizersConfig(indexing_threshold=indexing_threshold_kb) if parts == 1 else (
            EdgeOptimizersConfig(indexing_threshold=indexing_threshold_kb, default_segment_number=2 * parts,
                                 max_segment_size=max(1, int(PART_SLACK * points / parts) * spec.dim * 4 // 1024)))
    hnsw = HnswIndexConfig(
        m=_HNSW_M if levers.hnsw_m is None else levers.hnsw_m,
        ef_construct=levers.hnsw_ef_construct or _HNSW_EF_CONSTRUCT,
        full_scan_threshold=_FULL_SCAN_KB,
    )
    quantization = None
    if levers.quantization == "int8":  # the int8 copy stays in RAM; the fp32 originals rescore the candidates
        quantization = ScalarQuantizationConfig(type=ScalarType.Int8, quantile=QUANTILE,
                                                memory=Memory.Cold if levers.int8_on_disk else Memory.Pinned)
    return EdgeConfig(
        vectors={DENSE: EdgeVectorParams(
            size=spec.dim, distance=_DISTANCES[spec.distance], memory=Memory.Cold if levers.vectors_on_disk else None
        )},
        sparse_vectors={SPARSE: EdgeSparseVectorParams(modifier=Modifier.Idf)} if spec.sparse else None,
        optimizers=optimizers,
        hnsw_config=hnsw,
        quantization_config=quantization,
        payload_memory=Memory.Cold if levers.payload_on_disk else Memory.Cached,
    )


def build_segments(points: int, indexing_threshold_kb: int, dim: int, most: int | None = None) -> int:
    """How many segments an HNSW build makes of ``points``: one per CPU core this process may use (``most``:
    ``DPR_EDGE__SEGMENTS`` instead), each of at least ``PART_FACTOR`` x the index threshold (given, as the engine
    takes it, in KB of ``dim`` float32 vectors)."""
    cores = most or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    threshold_points = indexing_threshold_kb * 1024 // (dim * 4)
    return max(1, min(cores, points // max(1, PART_FACTOR * threshold_points)))


def payload_indexes(levers: EdgeLevers, only: Collection[str] | None = None) -> list[UpdateOperation]:
    """The operations that create a generation's payload indexes (``only``: those fields): memory-mapped with its
    payloads (``payload_on_disk``), else the engine's in-RAM default. In RAM they are rebuilt from disk at every
    load, which at 1M passages made a load take 4.9-6.5 s instead of 1.2-1.3 s (and 440 MB more RSS): each swap of an
    index build or a re-embed, and each turn of the lease, stalls a serving process for that long
    (benchmarks/results/query-speed/build-stalls.md). What it costs: a filter that matches most of the collection
    checks each point the graph visits through the mapped index, 2x as slow at 1M (19-28 -> 38-53 ms a question);
    a selective one (a document's passages by ``doc_id``) is as fast. ``DPR_EDGE__PAYLOAD_ON_DISK=false`` keeps
    payloads and their indexes in RAM."""
    memory = Memory.Cold if levers.payload_on_disk else None
    fields: list[tuple[str, KeywordIndexParams | IntegerIndexParams]] = [
        (key, KeywordIndexParams(memory=memory)) for key in INDEXED_KEYWORDS]
    fields += [(key, IntegerIndexParams(lookup=True, range=True, memory=memory)) for key in INDEXED_INTEGERS]
    return [UpdateOperation.create_field_index(key, params) for key, params in fields
            if only is None or key in only]


def move_payload_indexes(shard: Any, levers: EdgeLevers) -> list[str]:
    """Re-create an open shard's ``misplaced_payload_indexes`` where ``payload_indexes`` puts them; the fields moved
    (the index build's child, once per older generation: 110 s at 1M, 9 s at 100k)."""
    moved = misplaced_payload_indexes(shard, levers)
    for key in moved:
        shard.update(UpdateOperation.delete_field_index(key))
    for creation in payload_indexes(levers, only=moved):
        shard.update(creation)
    return moved


def misplaced_payload_indexes(shard: Any, levers: EdgeLevers) -> list[str]:
    """The payload indexes of an open shard whose memory placement is not what ``payload_indexes`` would create
    (a generation made before they followed ``payload_on_disk``, whose indexes have no params; the index build
    moves them)."""
    want = Memory.Cold if levers.payload_on_disk else None
    return sorted(key for key, index in shard.info().payload_schema.items()
                  if key in (*INDEXED_KEYWORDS, *INDEXED_INTEGERS) and getattr(index.params, "memory", None) != want)


def levers_from(edge: EdgeSettings) -> EdgeLevers:
    """The memory levers new generations are created with (``DPR_EDGE__QUANTIZATION`` etc.)."""
    return EdgeLevers(
        quantization=edge.quantization, vectors_on_disk=edge.vectors_on_disk, payload_on_disk=edge.payload_on_disk,
        hnsw_m=edge.hnsw_m, hnsw_ef_construct=edge.hnsw_ef_construct, segments=edge.segments,
    )


def machine_budget_mb(share: float = BUDGET_SHARE) -> int:
    """The default memory budget: ``share`` of the machine's RAM, or of this process's cgroup limit when lower."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):  # no cgroup v2 file, or "max" (no limit)
        ram = min(ram, int(Path("/sys/fs/cgroup/memory.max").read_text(encoding="utf-8")))
    return max(1, int(ram * share) // _MB)


def budget_levers(levers: EdgeLevers, points: int, dim: int, budget_mb: int,
                  fixed: Collection[str] = ()) -> tuple[EdgeLevers, dict[str, Any]]:
    """The memory budget's rule (docs/capacity.md): ``points`` fp32 vectors of ``dim`` and their HNSW graph (2 x m
    neighbour ids of 4 bytes a point) within ``budget_mb``: in RAM; over it: int8 with re-scoring, the fp32 originals
    on disk; the int8 copy and the graph still over: that copy on disk too. The levers named in ``fixed`` (set by the
    user) keep ``levers``' values. fp32 vectors left in RAM from ``SPEED_COPY_POINTS`` up get an int8 copy beside
    them where fp32 + int8 + graph fit the budget (a faster search and build, not less memory). Returns the levers
    and why (the ``memory`` record of ``levers.json``)."""
    fp32, int8, graph = points * dim * 4 / _MB, points * dim / _MB, points * 8 * (levers.hnsw_m or _HNSW_M) / _MB
    level = 0 if fp32 + graph <= budget_mb else 1 if int8 + graph <= budget_mb else 2
    chosen = {k: v for k, v in (("quantization", "int8" if level else "none"), ("vectors_on_disk", level > 0))
              if k not in fixed}
    out = replace(levers, **chosen)  # type: ignore[arg-type]
    speed = False
    if "quantization" not in fixed and not out.vectors_on_disk:  # an int8 copy beside fp32 in RAM saves no memory:
        speed = points >= SPEED_COPY_POINTS and fp32 + int8 + graph <= budget_mb  # made for speed, where it fits
        out = replace(out, quantization="int8" if speed else "none")
    out = replace(out, int8_on_disk=level == 2 and out.quantization == "int8")
    why = (f"fp32 vectors {fp32:,.0f} MB + graph {graph:,.0f} MB for {points:,} points "
           f"{'within' if level == 0 else 'over'} the budget of {budget_mb:,} MB"
           + ("" if level == 0 else f", int8 copy {int8:,.0f} MB + graph {'within' if level == 1 else 'over too'}")
           + (f"; an int8 copy ({int8:,.0f} MB) beside them for speed (from {SPEED_COPY_POINTS:,} points)"
              if speed else "")
           + "".join(f"; {k} set by DPR_EDGE__{k.upper()}" for k in BUDGETED if k in fixed))
    return out, {"choice": placement(out), "reason": why, "points": points, "budget_mb": budget_mb,
                 "fp32_mb": round(fp32, 1), "int8_mb": round(int8, 1), "graph_mb": round(graph, 1),
                 "set": sorted(set(fixed) & set(BUDGETED))}


def placement(levers: EdgeLevers) -> str:
    """Where a generation's dense vectors live, in words (`dpr status`)."""
    fp32 = "fp32 vectors on disk" if levers.vectors_on_disk else "fp32 vectors in RAM"
    if levers.quantization == "none":
        return fp32
    return "int8 + re-scoring, " + ("int8 copy and fp32 vectors on disk" if levers.int8_on_disk else fp32)


def search_params_from(edge: EdgeSettings, fused: bool = False) -> SearchParams | None:
    """Dense search params from the settings (``fused``: for the dense branch of a hybrid query, whose ef is
    ``hybrid_ef`` when set); None (the engine's defaults) when no search lever is set."""
    ef = edge.search_ef(fused)
    if ef is None and edge.oversampling is None and edge.quantization == "none":
        return None
    quantization = None
    if edge.quantization != "none" or edge.oversampling is not None:
        quantization = QuantizationSearchParams(rescore=edge.rescore, oversampling=edge.oversampling)
    return SearchParams(hnsw_ef=ef, quantization=quantization)


def dense_params(params: SearchParams | None, quantized: bool) -> SearchParams | None:
    """``params`` for a dense search of a generation, with fp32 re-scoring of ``OVERSAMPLING`` x k int8 candidates
    added when the generation is int8 and ``params`` name no quantization lever (none at all, or an ef alone): the
    engine's default would rank by the int8 copy."""
    if not quantized or (params is not None and params.quantization is not None):
        return params
    return SearchParams(hnsw_ef=None if params is None else params.hnsw_ef, exact=params is not None and params.exact,
                        quantization=QuantizationSearchParams(rescore=True, oversampling=OVERSAMPLING))


def levers_of(generation_dir: Path) -> dict[str, Any]:
    """The levers a generation was created or last built with, and the ``memory`` record of the budget's choice
    (``{}``: one made before levers existed, engine defaults)."""
    return json_or_empty(generation_dir / LEVERS_FILE)


def record_levers(generation_dir: Path, levers: EdgeLevers, memory: dict[str, Any] | None = None) -> None:
    write_atomic(generation_dir / LEVERS_FILE, json.dumps(levers.to_json() | ({"memory": memory} if memory else {})))


def index_record(generation_dir: Path) -> dict[str, Any]:
    """The last build's record: the points it saw, its search-ef ``calibration`` (``services.store.calibrate``)."""
    try:
        return dict(json.loads((generation_dir / INDEX_RECORD).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return {}


def indexed_points(generation_dir: Path) -> int:
    """Points the last build saw (0: never built)."""
    try:
        return int(index_record(generation_dir)["points"])
    except (KeyError, ValueError, TypeError):
        return 0


def recover_swap(generation_dir: Path) -> None:
    """Finish a swap a crash cut short between its renames (``shard.next`` present, ``shard`` gone)."""
    if not (generation_dir / SHARD).exists() and (generation_dir / NEXT).is_dir():
        os.replace(generation_dir / NEXT, generation_dir / SHARD)
        log.warning("finished an interrupted index swap", extra={"generation": generation_dir.name})


def fixed_levers(recorded: dict[str, Any]) -> list[str]:
    """The budgeted levers a generation's record says the user set (one recorded before the budget: those not at
    their defaults)."""
    if "memory" in recorded:
        return list(recorded["memory"].get("set", []))
    return [k for k in BUDGETED if k in recorded and recorded[k] != getattr(EdgeLevers(), k)]


# -- converters: the store's neutral records (filters, vectors, branches) to qdrant-edge's types --------------


def to_filter(where: Where | None) -> Filter | None:
    return None if where is None else to_where(where)


def to_where(where: Where) -> Filter:
    return build_filter(where, Filter, to_field)  # type: ignore[no-any-return]


def to_field(condition: Match | AtLeast) -> FieldCondition:
    if isinstance(condition, AtLeast):
        return FieldCondition(key=condition.key, range=RangeFloat(gte=float(condition.value)))
    match = MatchAny(condition.any_values()) if condition.any_of else MatchValue(condition.values[0])
    return FieldCondition(key=condition.key, match=match)


def to_vector(vector: Vector) -> Any:
    if isinstance(vector, SparseVector):
        return EdgeSparseVector(indices=list(vector.indices), values=list(vector.values))
    return vector


def upsert_operation(points: Sequence[PointRecord]) -> UpdateOperation:
    """The engine's write of ``points`` (the serving process's, and the index build's replay of its journal)."""
    return UpdateOperation.upsert_points(
        [Point(pid, {n: to_vector(v) for n, v in vectors.items()}, payload) for pid, vectors, payload in points]
    )


def delete_operation(where: Where) -> UpdateOperation:
    return UpdateOperation.delete_points_by_filter(to_where(where))


def nearest(branch: Branch) -> Query:
    name, vector = branch
    return Query.Nearest(to_vector(vector), using=name)


def query_request(
    branch: Branch, limit: int, where: Where | None, with_payload: bool = True, params: SearchParams | None = None
) -> QueryRequest:
    return QueryRequest(
        limit=limit, query=nearest(branch), filter=to_filter(where), with_payload=with_payload, params=params
    )





def payload_fields(fields: Sequence[str] | bool) -> Any:
    return fields if isinstance(fields, bool) else list(fields)
