"""How the store is tuned (part of ``services.core.settings.Settings``: ``DPR_EDGE__*`` and ``DPR_QDRANT__*``): the
search-time levers both engines take, and each engine's own options (creation, memory, locking)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class SearchLevers(BaseModel):
    """Search-time levers both engines take (docs/capacity.md): every dense search's HNSW ef and int8 re-scoring."""

    hnsw_ef: int | None = Field(default=None, ge=1, description="Search-time HNSW ef; unset: the engine's default.")
    hybrid_ef: int | None = Field(
        default=None, ge=1, description="Search-time HNSW ef of the dense branch of a hybrid query (fused with "
        "BM25 it needs less recall than a dense query alone: docs/capacity.md); unset: hnsw_ef."
    )
    rescore: bool = Field(default=True, description="With int8: re-score the candidates with the fp32 vectors.")
    oversampling: float | None = Field(
        default=None, ge=1.0, description="With int8: fetch k x this many candidates to re-score; unset: k."
    )
    recall_target: float = Field(
        default=0.98, ge=0.0, le=1.0, description="The smallest search ef whose recall@10 against the exact scan (on "
        "the generation's own vectors, measured after each HNSW build; a server's at `dpr optimize` and when it "
        "grew 10x) reaches this serves queries that set no hnsw_ef / hybrid_ef; a hybrid's dense branch is held to "
        "the fused top 10 (services/store/calibrate.py); 0: no calibration, the engine's default ef."
    )

    def search_ef(self, fused: bool = False) -> int | None:
        """The ef of a dense search, or (``fused``) of a hybrid query's dense branch."""
        return self.hybrid_ef if fused and self.hybrid_ef is not None else self.hnsw_ef


class QdrantSettings(SearchLevers):
    """Server adapter (qdrant-client) options; applied on collection creation."""

    timeout: float = 30.0
    shard_number: int | None = Field(default=None, ge=1)
    replication_factor: int | None = Field(default=None, ge=1)
    write_consistency_factor: int | None = Field(default=None, ge=1)
    on_disk_vectors: bool = False
    hnsw_m: int | None = Field(default=None, ge=0)
    hnsw_ef_construct: int | None = Field(default=None, ge=4)
    quantization: Literal["none", "int8"] = "none"
    # memory levers at scale (docs/capacity.md); creation-time ones apply to new generations
    on_disk_payload: bool = Field(default=False, description="Payloads on disk (mmap) instead of RAM.")


class EdgeSettings(SearchLevers):
    """Embedded engine (qdrant-edge) options."""

    lock_timeout: float = Field(default=120.0, gt=0, description="Seconds to wait for the shard's file lock.")
    idle_release: float = Field(
        default=10.0, ge=0, description="Seconds a process keeps the shard open after its last use while no other "
        "process wants it (one that waits gets it about 10 ms after the holder's last call): an ingest keeps it "
        "between its batches instead of reopening it twice per batch."
    )
    serve_writes: bool = Field(
        default=True, description="Writers in other processes (workers, `dpr ingest`) send their reads and writes "
        "of the generation `dpr serve` has open to it instead of taking the shard from it (each turn cost the "
        "server a reload: services/store/edge/owner.py)."
    )
    index_threshold: int = Field(
        default=5000, ge=1, description="Points above which a segment gets an HNSW graph: built after an ingest "
        "job or re-embed leaves this many new points, or by `dpr optimize`; smaller segments are scanned exactly."
    )
    # Memory levers at scale (docs/capacity.md): a generation takes them when it is created and at each HNSW build
    # (the budget's choice for the two below when they are not set); search-time ones apply to every query.
    memory_budget_mb: int | None = Field(
        default=None, ge=1, description="RAM a generation's dense vectors and HNSW graph may take: over it, "
        "quantization and vectors_on_disk, where not set, become int8 with re-scoring and fp32 vectors on disk; within "
        "it, from 50,000 points, an int8 copy beside the fp32 vectors for speed where that fits too "
        "(docs/capacity.md, memory budget); unset: 5% of the machine's RAM (or of the cgroup's limit)."
    )
    quantization: Literal["none", "int8"] = Field(
        default="none", description="int8 scalar quantization of the dense vectors (4x less RAM for the copy "
        "searched; the fp32 originals re-score the candidates, see rescore); unset: memory_budget_mb chooses."
    )
    vectors_on_disk: bool = Field(
        default=False, description="fp32 dense vectors memory-mapped from disk (read through the page cache) "
        "instead of held in RAM; with int8 the quantized copy stays in RAM; unset: memory_budget_mb chooses."
    )
    payload_on_disk: bool = Field(default=True, description="Payloads (passage text) memory-mapped from disk.")
    hnsw_m: int | None = Field(default=None, ge=0, description="HNSW edges per node; unset: 32.")
    hnsw_ef_construct: int | None = Field(default=None, ge=4, description="HNSW build candidates; unset: 200.")
    segments: int | None = Field(
        default=None, ge=1, description="The most segments an HNSW build splits a generation into (each of at least "
        "10 x index_threshold points), searched side by side by the engine's threads: a question answered sooner "
        "for about the same CPU time (docs/capacity.md); unset: one per CPU core; 1: one graph."
    )
