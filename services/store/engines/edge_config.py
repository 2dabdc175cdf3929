"""The embedded shard's config for a collection spec: the one place both the serving process (``edge.py``) and the
index build's child process (``edge_index.py``) read it, so neither imports the other.

``EdgeLevers`` are the memory levers a generation is created with (``settings.edge``: int8 scalar quantization,
original vectors and payloads on disk, HNSW m / ef_construct; docs/capacity.md). They are recorded beside the
generation's spec (``levers.json``) because the index build reloads the shard with a config, and a dense vector's
memory placement that the reload does not repeat falls back to RAM (measured on qdrant-edge 0.9.0: a ``Cold``
vector storage came back ``InRamMmap`` after ``optimize()``); quantization and payload placement persist.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from qdrant_edge import (
    Distance,
    EdgeConfig,
    EdgeOptimizersConfig,
    EdgeSparseVectorParams,
    EdgeVectorParams,
    HnswIndexConfig,
    Memory,
    Modifier,
    ScalarQuantizationConfig,
    ScalarType,
)

from services.store.points import DENSE, SPARSE, CollectionSpec

_DISTANCES = {"cosine": Distance.Cosine, "dot": Distance.Dot, "euclid": Distance.Euclid}
# Qdrant's defaults, used for the half of (m, ef_construct) a user leaves unset; full_scan_threshold in KB
_HNSW_M, _HNSW_EF_CONSTRUCT, _FULL_SCAN_KB = 16, 100, 10_000
QUANTILE = 0.99  # int8 range from the 0.99 quantile of the values (Qdrant's quantization guide)


@dataclass(frozen=True)
class EdgeLevers:
    """How a generation's vectors and payloads are stored (fixed when it is created)."""

    quantization: Literal["none", "int8"] = "none"
    vectors_on_disk: bool = False
    payload_on_disk: bool = True  # the engine's own default (payload memory Cold)
    hnsw_m: int | None = None
    hnsw_ef_construct: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> EdgeLevers:
        known = {k: v for k, v in (data or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)


def edge_config(
    spec: CollectionSpec, indexing_threshold_kb: int | None = None, levers: EdgeLevers | None = None
) -> EdgeConfig:
    """The shard's config; with ``indexing_threshold_kb`` (the index build), segments above it get HNSW."""
    levers = levers or EdgeLevers()
    optimizers = None
    if indexing_threshold_kb is not None:
        optimizers = EdgeOptimizersConfig(indexing_threshold=indexing_threshold_kb)
    hnsw = None
    if levers.hnsw_m is not None or levers.hnsw_ef_construct is not None:
        hnsw = HnswIndexConfig(
            m=_HNSW_M if levers.hnsw_m is None else levers.hnsw_m,
            ef_construct=levers.hnsw_ef_construct or _HNSW_EF_CONSTRUCT,
            full_scan_threshold=_FULL_SCAN_KB,
        )
    quantization = None
    if levers.quantization == "int8":  # the int8 copy stays in RAM; the fp32 originals rescore the candidates
        quantization = ScalarQuantizationConfig(type=ScalarType.Int8, quantile=QUANTILE, memory=Memory.Pinned)
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
