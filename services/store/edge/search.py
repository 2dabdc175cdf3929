"""What each dense search of an embedded generation sends (``DenseSearch``): the settings' HNSW ef, else the ef the
generation's last build calibrated for the recall target (``services.store.calibrate``), re-scored with fp32 where
the generation is int8. Read from the generation's own records, cached until a build or the budget rewrites them:
one ``stat`` a query, never the shard."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from qdrant_edge import SearchParams

from services.store.edge.config import INDEX_RECORD, LEVERS_FILE, SHARD, dense_params, index_record, levers_of
from services.store.points import SparseVector
from services.store.protocol import Branch


class DenseSearch:
    """``search_params``: every dense search's (``hnsw_ef``, quantization rescore / oversampling),
    ``fused_search_params`` the dense branch's of a hybrid query (unset: ``search_params``); where they name no ef,
    the calibrated one serves, unless ``recall_target`` is 0."""

    def __init__(self, generations_dir: Path, search_params: SearchParams | None,
                 fused_search_params: SearchParams | None, recall_target: float) -> None:
        self.generations_dir = generations_dir
        self.search_params = search_params
        self.fused_search_params = fused_search_params if fused_search_params is not None else search_params
        self.recall_target = recall_target
        self._records: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}  # (generation, file) -> (mtime, read)

    def params(self, generation: str, branch: Branch, fused: bool = False) -> SearchParams | None:
        """The dense branch's search params (HNSW ef, quantization rescore; ``fused``: of a hybrid query); none for
        the sparse branch. A generation the memory budget made int8 (its ``levers.json``) is re-scored with fp32
        where the settings name no quantization lever, else it would rank by the int8 copy alone; an fp32 one is
        not asked to (the option cost 7% of `dpr serve`'s questions/s at 100k)."""
        if isinstance(branch[1], SparseVector):
            return None
        params = self.fused_search_params if fused else self.search_params
        if params is None or params.hnsw_ef is None:  # no explicit ef: the one the last build calibrated
            cal, key = self.calibration(generation), "fused_" if fused else ""
            quantization = None if params is None else params.quantization
            if cal.get(f"{key}exact"):  # the scan was faster than the graph at the ef the target needs
                params = SearchParams(exact=True, quantization=quantization)
            elif cal.get(f"{key}ef"):
                params = SearchParams(hnsw_ef=int(cal[f"{key}ef"]), quantization=quantization)
        levers = self._record(generation, LEVERS_FILE, levers_of)
        return dense_params(params, quantized=levers.get("quantization") == "int8")

    def calibration(self, generation: str) -> dict[str, Any]:
        """The search-ef calibration of the generation's last build (``index.json``); ``{}`` with no target, no
        graph or no build yet."""
        if self.recall_target <= 0:
            return {}
        return self._record(generation, INDEX_RECORD, lambda d: dict(index_record(d).get("calibration") or {}))

    def describe(self, generation: str, index_threshold: int) -> dict[str, Any]:
        """What `dpr status` says of the generation's search ef (``calibrate.describe``): the segments' index
        types and the last build's record."""
        from services.store.calibrate import describe
        from services.store.edge.index import segment_kinds

        kinds = segment_kinds(self.generations_dir / generation / SHARD)
        dense, fused = self.search_params, self.fused_search_params
        explicit = {"hnsw_ef": dense.hnsw_ef if dense else None,
                    "hybrid_ef": fused.hnsw_ef if fused is not None and fused is not dense else None}
        return describe({"hnsw_segments": kinds.count("hnsw"), "index_threshold": index_threshold,
                         "calibration": self.calibration(generation)}, explicit)

    def _record(self, generation: str, name: str, read: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
        """``read`` of the generation's dir, cached until a build or the budget (in any process) rewrote the file
        ``name`` in it: one ``stat`` a query; ``{}`` while it does not exist."""
        try:
            stamp = (self.generations_dir / generation / name).stat().st_mtime_ns
        except OSError:
            return {}
        cached = self._records.get((generation, name))
        if cached is None or cached[0] != stamp:
            cached = self._records[generation, name] = (stamp, read(self.generations_dir / generation))
        return cached[1]
