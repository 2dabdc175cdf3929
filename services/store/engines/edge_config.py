"""The embedded shard's config for a collection spec: the one place both the serving process (``edge.py``) and the
index build's child process (``edge_index.py``) read it, so neither imports the other."""

from __future__ import annotations

from qdrant_edge import Distance, EdgeConfig, EdgeOptimizersConfig, EdgeSparseVectorParams, EdgeVectorParams, Modifier

from services.store.points import DENSE, SPARSE, CollectionSpec

_DISTANCES = {"cosine": Distance.Cosine, "dot": Distance.Dot, "euclid": Distance.Euclid}


def edge_config(spec: CollectionSpec, indexing_threshold_kb: int | None = None) -> EdgeConfig:
    """The shard's config; with ``indexing_threshold_kb`` (the index build), segments above it get HNSW."""
    optimizers = None
    if indexing_threshold_kb is not None:
        optimizers = EdgeOptimizersConfig(indexing_threshold=indexing_threshold_kb)
    return EdgeConfig(
        vectors={DENSE: EdgeVectorParams(size=spec.dim, distance=_DISTANCES[spec.distance])},
        sparse_vectors={SPARSE: EdgeSparseVectorParams(modifier=Modifier.Idf)} if spec.sparse else None,
        optimizers=optimizers,
    )
